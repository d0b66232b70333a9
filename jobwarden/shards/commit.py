r"""The commit of a sharded step: every member's shard durable, then one record, last.

```
every member i                              member 0
--------------                              --------
write ckpt-k.shard-i-of-N.pending, fsync
rename, fsync dir        (fenced first)
   \____ all-gather of (checksum, size, state hash) per member ____/
                                            all present, hashes equal?
                                            write ckpt-k.commit.json (pending, fsync,
                                            rename, fsync dir): step k is complete
                                            the records of the steps retention drops
   \____ all-gather: the record is durable ____/
remove my own shard files of the dropped steps
(on a thread; the next commit waits for it)
                                            emit checkpoint(k)
```

A member killed before the gather leaves shard files without a record: the others fail in
the gather (or are stopped) and the step is never selected.  Member 0 killed before the
record's rename: the same.  After it, the step is complete.  Retention removes a dropped
step's record first (member 0), and only after the second gather its shard files, each
member its own, in parallel and on a thread of its own (`ShardCommitter.settle`): a step
whose shards are going has no record.  So a crash at
any instant leaves the previous complete step or the new one, never a mixture.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from jobwarden import testfaults
from jobwarden.checkpoint.background import BackgroundCommit
from jobwarden.checkpoint.format import Manifest, leaf_specs
from jobwarden.checkpoint.manifest import LeafSpec
from jobwarden.checkpoint.shardrecord import (
    Box,
    CommitRecord,
    Layout,
    MemberShard,
    piece_path,
    step_of,
)
from jobwarden.errors import WorkerInternalError
from jobwarden.events import Emitter
from jobwarden.hashing import Leaves
from jobwarden.shards.files import ShardFiles
from jobwarden.shards.hash import Gather, box_data, box_of
from jobwarden.testfaults import Fault

Hook = Callable[[Path], None] | None
ROW_BYTES = 256


@dataclass(frozen=True)
class Group:
    """This member's place in a sharded job: the layout, the boxes it holds, its peers."""

    member: int
    devices: tuple[int, ...]
    """every member's device count, in member order"""
    layout: Layout
    held: Mapping[str, tuple[Box, ...]]
    """the boxes of each laid-out leaf this member holds (each once)"""
    gather: Gather
    files: ShardFiles

    @property
    def members(self) -> int:
        """How many members the job has."""
        return len(self.devices)

    def pieces(self, leaves: Sequence[tuple[str, Any]]) -> Leaves:
        """What this member writes of a state: its boxes of each laid-out leaf, and its copy
        of every other leaf."""
        out: Leaves = []
        for path, value in leaves:
            boxes = self.held.get(path)
            if boxes is None:
                out.append((path, np.asarray(value)))
                continue
            out.extend((piece_path(path, box), box_data(value, box)) for box in boxes)
        return out

    def piece_specs(self, leaves: Sequence[tuple[str, Any]]) -> tuple[LeafSpec, ...]:
        """The leaves this member's shard file must hold, for a state like ``leaves``."""
        return leaf_specs(self.pieces(leaves))

    def exchange(self, text: str) -> list[str]:
        """Every member's ``text`` (up to `ROW_BYTES`), in member order: a collective."""
        row = np.frombuffer(text.encode().ljust(ROW_BYTES)[:ROW_BYTES], np.uint8)
        every = np.asarray(self.gather(row[None, :])).reshape(self.members, ROW_BYTES)
        return [bytes(r).decode().strip() for r in every]


def make_group(
    leaves: Sequence[tuple[str, Any]],
    *,
    layout: Layout,
    gather: Gather,
    files: ShardFiles,
    member: int,
    local_devices: int,
) -> Group:
    """This member's `Group` for a state like ``leaves`` (a collective: every member's
    device count is gathered)."""
    held: dict[str, tuple[Box, ...]] = {}
    values = dict(leaves)
    for path in layout:
        value = values[path]
        held[path] = tuple(sorted({box_of(s.index, value.shape) for s in value.addressable_shards}))
    row = np.array([[local_devices]], np.int32)
    counts = np.asarray(gather(row)).reshape(-1)
    return Group(member, tuple(int(c) for c in counts), layout, held, gather, files)


class ShardCommitter:
    """The sharded commits of one member; member 0 (with ``emitter``) writes the records."""

    def __init__(self, group: Group, emitter: Emitter | None, keep: int) -> None:
        self.group = group
        self.emitter = emitter
        self.keep = keep
        self.committed = -1
        self.last_record: Path | None = None
        self._removal = BackgroundCommit("shard-retention")

    def commit(
        self,
        step: int,
        manifest: Manifest,
        leaves: Sequence[tuple[str, Any]],
        hook: Hook,
        record_hook: Hook = None,
        *,
        report: bool = True,
    ) -> None:
        """Commit the state at ``step`` (``manifest`` is the global one): a collective."""
        began = time.perf_counter()
        self.settle()
        group = self.group
        pieces = group.pieces(leaves)
        mine = group.files.write_shard(
            step, replace(manifest, leaves=leaf_specs(pieces)), pieces, hook
        )
        testfaults.crash_if(Fault.CRASH_AFTER_SHARD, step)
        reports = group.exchange(f"{mine.file} {mine.checksum} {mine.bytes} {manifest.state_hash}")
        shards = []
        for index, text in enumerate(reports):
            parts = text.split()
            if len(parts) != 4 or parts[3] != manifest.state_hash:
                raise WorkerInternalError(
                    f"member {index} reported {text!r} for step {step}, "
                    f"member {group.member} holds state {manifest.state_hash}",
                    step=step,
                    reports=reports,
                )
            shards.append(MemberShard(parts[0], parts[1], int(parts[2])))
        self.committed = step
        if self.emitter is not None:  # member 0 writes the record
            record = CommitRecord(manifest, group.devices, group.layout, tuple(shards))
            self.last_record = group.files.write_record(record, record_hook or _record_fault)
            testfaults.crash_if(Fault.CRASH_AFTER_RECORD, step)
            group.files.retain_records(self.keep)
        # Every member learns that the record is durable and the dropped steps' records are
        # gone; each then removes its own shards of those steps, all at once.
        group.exchange("")
        self._remove_dropped()
        if self.emitter is None or not report:
            return
        path = self.last_record
        seconds = time.perf_counter() - began
        self.emitter.emit(
            "checkpoint",
            step=step,
            file=str(path),
            bytes=sum(s.bytes for s in shards),
            seconds=seconds,
            blocked_s=seconds,
            background=False,
            state_hash=manifest.state_hash,
        )

    def _remove_dropped(self) -> None:
        """Remove this member's shard files of the dropped steps on a thread of its own: freeing
        a large file's blocks and pages takes tens of milliseconds the training need not
        wait for.  The next commit, or `settle`, waits for it."""

        def remove(_: float) -> None:
            self.group.files.retain_shards()

        self._removal.submit(remove)

    def settle(self) -> None:
        """Wait for the removal of dropped shard files in flight; raise its error, if any."""
        self._removal.wait()


def _record_fault(pending: Path) -> None:
    """The test-only kill between the record's durable pending file and its rename."""
    step = step_of(pending.name.removesuffix(".pending"))
    if step is not None:
        testfaults.crash_if(Fault.CRASH_BEFORE_RECORD, step)
