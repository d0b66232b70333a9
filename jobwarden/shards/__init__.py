"""Sharded state: leaves laid over the devices of several members, hashed, committed and
restored shard by shard, never gathered onto one process (docs/checkpoint-format.md)."""
