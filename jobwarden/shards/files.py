"""The files of sharded steps in a checkpoint directory: written durably, listed, retained.

Every member writes its own shard file with the atomic commit of docs/checkpoint-format.md
(pending sibling, fsync, rename, directory fsync), in the directory opened by descriptor;
member 0 then writes the commit record the same way.  ``fence`` is called right before
each rename, so a writer that lost the directory (its lock, or the job's generation)
leaves no final name behind.  Retention removes a step as a unit, its record first, so a
step is never left half-removed and selectable.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

from jobwarden.checkpoint import format
from jobwarden.checkpoint.lock import open_directory
from jobwarden.checkpoint.shardrecord import (
    RECORD,
    SHARD,
    CommitRecord,
    MemberShard,
    record_name,
    shard_name,
    step_of,
)
from jobwarden.files import PENDING_SUFFIX
from jobwarden.hashing import Leaves

Hook = Callable[[Path], None] | None
MAX_RECORD_BYTES = 64 << 20


class ShardFiles:
    """The sharded steps of one checkpoint directory, as one member sees them."""

    def __init__(self, directory: Path, member: int, members: int, fence: Callable[[], None]):
        self.directory = directory
        self.member = member
        self.members = members
        self.fence = fence

    def write_shard(
        self, step: int, manifest: format.Manifest, pieces: Leaves, hook: Hook
    ) -> MemberShard:
        """This member's shard of ``step``, durable on return; ``hook`` runs before its
        rename (the crash-in-commit drill)."""
        name = shard_name(step, self.member, self.members)
        buffers = format.encode(manifest, pieces)
        header = bytes(buffers[0])
        (length,) = struct.unpack("<Q", header[:8])
        checksum = json.loads(header[8 : 8 + length])["__metadata__"]["checksum"]
        return MemberShard(name, str(checksum), self._commit(name, buffers, hook))

    def write_record(self, record: CommitRecord, hook: Hook = None) -> Path:
        """The commit record of ``record.step``, durable on return: the step is complete."""
        name = record_name(record.step)
        self._commit(name, [memoryview(record.to_bytes())], hook)
        return self.directory / name

    def _commit(self, name: str, buffers: list[memoryview], hook: Hook) -> int:
        """Write ``name`` durably, fenced before the write and again before the replace;
        returns its size."""

        def before_replace(pending: Path) -> None:
            if hook is not None:
                hook(pending)
            self.fence()

        with open_directory(self.directory) as handle:
            self.fence()
            return handle.commit(name, buffers, before_replace)

    def steps(self) -> list[int]:
        """The steps that hold a commit record, oldest first."""
        found = [step_of(n) for n in self._names() if RECORD.fullmatch(n)]
        return sorted(s for s in found if s is not None)

    def files_of(self, step: int) -> list[str]:
        """Every file of ``step``: its record first, then its shards and pending leftovers."""
        names = sorted(n for n in self._names() if _step(n) == step)
        return sorted(names, key=lambda n: not RECORD.fullmatch(n))

    def uncommitted(self) -> list[str]:
        """Shard files (and pending leftovers of a step) whose step has no record."""
        steps = set(self.steps())
        return sorted(n for n in self._names() if _step(n) is not None and _step(n) not in steps)

    def read_record(self, step: int) -> CommitRecord:
        """The commit record of ``step``; raises `CorruptCheckpoint` for a damaged one."""
        name = record_name(step)
        with open_directory(self.directory) as handle:
            data = handle.read_small(name, MAX_RECORD_BYTES)
        return CommitRecord.from_bytes(str(self.directory / name), data)

    def read_shard(self, name: str) -> format.Checkpoint:
        """One shard file, read and checked against its checksum."""
        with (
            open_directory(self.directory) as handle,
            format.Reader.open(self.directory / name, handle) as reader,
        ):
            return reader.load()

    def retain(self, keep: int) -> list[str]:
        """Remove committed steps beyond the newest ``keep`` (record first, then shards), and
        shards of steps older than the newest record that never got one; returns the names."""
        steps = self.steps()
        if not steps or keep <= 0:
            return []
        dropped = set(steps[:-keep])
        newest = steps[-1]
        removed = []
        with open_directory(self.directory) as handle:
            for step in sorted(dropped):
                for name in self.files_of(step):
                    handle.unlink(name, missing_ok=True)
                    removed.append(name)
            for name in self.uncommitted():
                of = _step(name)
                if of is not None and of < newest and not name.endswith(PENDING_SUFFIX):
                    handle.unlink(name, missing_ok=True)
                    removed.append(name)
            if removed:
                handle.fsync()
        return removed

    def _names(self) -> list[str]:
        with open_directory(self.directory) as handle:
            return [entry.name for entry in handle.entries()]


def _step(name: str) -> int | None:
    """The step of a record, a shard or a pending leftover of either."""
    return step_of(name.removesuffix(PENDING_SUFFIX))


__all__ = ["SHARD", "ShardFiles"]
