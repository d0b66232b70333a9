"""Reading a checkpoint by its name, whether one file or a sharded step's record, for tools.

`wardenctl verify`, `inspect` and the drills compare and list what a run committed.  A
sharded step is named by its commit record; a tool (not a member of the job) may read all
of its shard files: each is checked against its own checksum and the one the record names.
Its arrays are every member's pieces (``path@start:stop,...`` for a box of a laid-out
leaf), with a leaf every member holds a copy of listed once, and again under
``path#member<i>`` should a member's copy differ.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from jobwarden.checkpoint import format
from jobwarden.checkpoint.errors import ChecksumMismatch
from jobwarden.checkpoint.shardrecord import RECORD, CommitRecord


def is_record(path: Path) -> bool:
    """Whether ``path`` names a sharded step's commit record."""
    return RECORD.fullmatch(path.name) is not None


def read_record(path: Path) -> CommitRecord:
    """A commit record read from ``path`` (raises `CorruptCheckpoint` for a damaged one)."""
    return CommitRecord.from_bytes(str(path), path.read_bytes())


def step_shards(path: Path) -> list[tuple[int, format.Checkpoint]]:
    """Every member's shard file of the step whose record is ``path``, read and checked."""
    record = read_record(path)
    shards = []
    for index, member in enumerate(record.members):
        shard = format.read(path.parent / member.file)
        if shard.checksum != member.checksum:
            raise ChecksumMismatch(
                str(path.parent / member.file),
                f"checksum {shard.checksum}, the commit record names {member.checksum}",
            )
        shards.append((index, shard))
    return shards


def checkpoint_arrays(path: Path) -> Mapping[str, np.ndarray]:
    """The arrays of a checkpoint file, or of every shard of a sharded step."""
    if not is_record(path):
        return format.read(path).arrays
    arrays: dict[str, np.ndarray] = {}
    for index, shard in step_shards(path):
        for name, array in shard.arrays.items():
            kept = arrays.setdefault(name, array)
            if kept is not array and kept.tobytes() != array.tobytes():
                arrays[f"{name}#member{index}"] = array
    return arrays
