"""The files of sharded steps in a checkpoint directory: written durably, listed, retained.

Every member writes its own shard file with the atomic commit of docs/checkpoint-format.md
(pending sibling, fsync, rename, directory fsync), in the directory opened by descriptor,
written and checksummed in one pass (`jobwarden.shards.write`); member 0 then writes the
commit record the same way.  ``fence`` is called right before each rename, so a writer
that lost the directory (its lock, or the job's generation) leaves no final name behind.
Retention removes a step's record first (member 0, `retain_records`), so a step is never
left half-removed and selectable; each member then removes its own shard files of the
steps without a record (`retain_shards`).
"""

from __future__ import annotations

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
from jobwarden.shards.write import write_shard_file

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
        """This member's shard of ``step``, durable on return, written and checksummed in
        one pass (`jobwarden.shards.write`); ``hook`` runs before its rename (the
        crash-in-commit drill)."""
        name = shard_name(step, self.member, self.members)
        with open_directory(self.directory) as handle:
            self.fence()
            checksum, size = write_shard_file(
                handle, name, manifest, pieces, self._before_replace(hook)
            )
        return MemberShard(name, checksum, size)

    def write_record(self, record: CommitRecord, hook: Hook = None) -> Path:
        """The commit record of ``record.step``, durable on return: the step is complete."""
        name = record_name(record.step)
        self._commit(name, [memoryview(record.to_bytes())], hook)
        return self.directory / name

    def _commit(self, name: str, buffers: list[memoryview], hook: Hook) -> int:
        """Write ``name`` durably, fenced before the write and again before the replace;
        returns its size."""

        with open_directory(self.directory) as handle:
            self.fence()
            return handle.commit(name, buffers, self._before_replace(hook))

    def _before_replace(self, hook: Hook) -> Callable[[Path], None]:
        """What runs right before a rename: ``hook``, then the fence."""

        def before_replace(pending: Path) -> None:
            if hook is not None:
                hook(pending)
            self.fence()

        return before_replace

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

    def retain_records(self, keep: int) -> list[str]:
        """Member 0's part of retention: remove the records of committed steps beyond the
        newest ``keep`` (and pending leftovers of those steps), then fsync the directory.
        Those steps are then no longer selectable; their shard files are left to
        `retain_shards`.  Returns the names removed."""
        steps = self.steps()
        if not steps or keep <= 0:
            return []
        removed = []
        with open_directory(self.directory) as handle:
            for step in steps[:-keep]:
                for name in self.files_of(step):
                    if RECORD.fullmatch(name) or name.endswith(PENDING_SUFFIX):
                        handle.unlink(name, missing_ok=True)
                        removed.append(name)
            if removed:
                handle.fsync()
        return removed

    def retain_shards(self) -> list[str]:
        """This member's part of retention, after `retain_records`: its own shard files of
        steps older than the newest record that have none (dropped, or never committed);
        member 0 also takes any such file no other member of this layout owns.  Every
        member removes its own in parallel.  Returns the names removed."""
        steps = self.steps()
        if not steps:
            return []
        removed = []
        with open_directory(self.directory) as handle:
            for name in self.uncommitted():
                of = _step(name)
                if of is None or of >= steps[-1] or name.endswith(PENDING_SUFFIX):
                    continue
                if self._owner(name) == self.member:
                    handle.unlink(name, missing_ok=True)
                    removed.append(name)
            if removed:
                handle.fsync()
        return removed

    def retain(self, keep: int) -> list[str]:
        """Both parts of retention in this one process (a tool, or a test): records first,
        then every member's shard files."""
        removed = self.retain_records(keep)
        for member in range(self.members):
            files = ShardFiles(self.directory, member, self.members, self.fence)
            removed += files.retain_shards()
        return removed

    def _owner(self, name: str) -> int:
        """The member that removes ``name``: the member of this layout whose shard it is,
        else member 0."""
        match = SHARD.fullmatch(name)
        if match and int(match.group(3)) == self.members and int(match.group(2)) < self.members:
            return int(match.group(2))
        return 0

    def _names(self) -> list[str]:
        with open_directory(self.directory) as handle:
            return [entry.name for entry in handle.entries()]


def _step(name: str) -> int | None:
    """The step of a record, a shard or a pending leftover of either."""
    return step_of(name.removesuffix(PENDING_SUFFIX))


__all__ = ["SHARD", "ShardFiles"]
