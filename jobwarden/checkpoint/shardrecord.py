"""A sharded step's names and its commit record.

A step of a sharded state is one shard file per member,
``ckpt-<step>.shard-<member>-of-<members>.safetensors`` (the container of
docs/checkpoint-format.md, holding that member's boxes and its copy of every leaf that is
not laid out), and one commit record, ``ckpt-<step>.commit.json``, written last by member
0 once every member's shard is durable and their reports agree.  The record holds the
global manifest (tree of global shapes, provenance, state hash), the layout, the devices
of each member, and each member's file with its checksum and size; its own xxh3-128
checksum covers the rest.  A step without its record is never selected.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import xxhash

from jobwarden.checkpoint.errors import ChecksumMismatch, UnreadableCheckpoint
from jobwarden.checkpoint.manifest import Manifest
from jobwarden.decoding import loads_json

Box = tuple[tuple[int, int], ...]
"""A box of a leaf laid out over several members: (start, stop) on each axis, in global
indices (`jobwarden.shards.hash`)."""
Layout = Mapping[str, tuple[tuple[Box, int], ...]]
"""Each laid-out leaf's boxes in canonical order, each with the process that owns it."""

RECORD = re.compile(r"ckpt-(\d{10})\.commit\.json")
SHARD = re.compile(r"ckpt-(\d{10})\.shard-(\d+)-of-(\d+)\.safetensors")
RECORD_VERSION = 1


def record_name(step: int) -> str:
    """The commit record of the sharded step ``step``."""
    return f"ckpt-{step:010d}.commit.json"


def shard_name(step: int, member: int, members: int) -> str:
    """Member ``member``'s shard file of the sharded step ``step``."""
    return f"ckpt-{step:010d}.shard-{member}-of-{members}.safetensors"


def step_of(name: str) -> int | None:
    """The step a record or shard file name belongs to (None for any other name)."""
    match = RECORD.fullmatch(name) or SHARD.fullmatch(name)
    return int(match.group(1)) if match else None


def piece_path(path: str, box: Box) -> str:
    """The name of one box of a laid-out leaf inside a shard file."""
    return path + "@" + ",".join(f"{start}:{stop}" for start, stop in box)


def describe(devices: tuple[int, ...], layout: Layout) -> str:
    """A layout in words: members, devices of each, and how many leaves are split in how
    many boxes."""
    boxes = sorted({len(b) for b in layout.values()})
    return (
        f"{len(devices)} member(s) with {list(devices)} device(s), {len(layout)} leaves "
        f"laid out in {'/'.join(map(str, boxes)) or '0'} boxes"
    )


@dataclass(frozen=True)
class MemberShard:
    """One member's durable shard file, as it reported it."""

    file: str
    checksum: str
    bytes: int


@dataclass(frozen=True)
class CommitRecord:
    """What makes a sharded step complete: written last, by member 0."""

    manifest: Manifest
    devices: tuple[int, ...]
    """each member's device count; its length is the number of members"""
    layout: Layout
    members: tuple[MemberShard, ...]

    @property
    def step(self) -> int:
        """The step committed."""
        return self.manifest.step

    def body(self) -> dict[str, Any]:
        """The record without its checksum."""
        return {
            "version": RECORD_VERSION,
            "manifest": json.loads(self.manifest.to_json()),
            "devices": list(self.devices),
            "layout": {
                path: [[[list(a) for a in box], owner] for box, owner in boxes]
                for path, boxes in self.layout.items()
            },
            "members": [[m.file, m.checksum, m.bytes] for m in self.members],
        }

    def to_bytes(self) -> bytes:
        """The record's file: its body and the xxh3-128 checksum of the body's text."""
        text = _canonical(self.body())
        return _canonical({"body": self.body(), "checksum": _checksum(text)}) + b"\n"

    @classmethod
    def from_bytes(cls, path: str, data: bytes) -> CommitRecord:
        """Parse a record file; raises `UnreadableCheckpoint` or `ChecksumMismatch`."""
        try:
            raw = loads_json(data.decode())
            body, stored = raw["body"], str(raw["checksum"])
        except (KeyError, TypeError, ValueError, UnicodeDecodeError) as error:
            raise UnreadableCheckpoint(path, f"commit record is malformed: {error!r}") from error
        found = _checksum(_canonical(body))
        if found != stored:
            raise ChecksumMismatch(
                path,
                f"commit record checksum mismatch: stored {stored}, computed {found}",
                stored=stored,
                computed=found,
            )
        try:
            if body["version"] != RECORD_VERSION:
                raise ValueError(f"record version {body['version']!r}")
            manifest = Manifest.from_json(path, json.dumps(body["manifest"]))
            layout = {
                str(p): tuple((tuple((int(a), int(b)) for a, b in box), int(o)) for box, o in bs)
                for p, bs in body["layout"].items()
            }
            members = tuple(MemberShard(str(f), str(c), int(n)) for f, c, n in body["members"])
            devices = tuple(int(d) for d in body["devices"])
        except (KeyError, TypeError, ValueError) as error:
            raise UnreadableCheckpoint(path, f"commit record is malformed: {error!r}") from error
        if len(members) != len(devices):
            raise UnreadableCheckpoint(path, "commit record: members and devices differ in count")
        return cls(manifest, devices, layout, members)


def same_layout(record: CommitRecord, devices: tuple[int, ...], layout: Mapping[str, Any]) -> bool:
    """Whether a record was written by the layout running now."""
    return record.devices == devices and dict(record.layout) == dict(layout)


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _checksum(text: bytes) -> str:
    return "xxh3-128:" + xxhash.xxh3_128(text).hexdigest()
