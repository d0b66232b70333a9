"""The restore of a sharded step: member 0 chooses, every member reads only its own shard.

Member 0, which holds the writer lock, first moves pending leftovers and shard files of
steps without a record into ``quarantine/`` (never selected), then takes the records
newest first.  A damaged record, or a step missing a member's file, is corrupt: the
step's files are quarantined together and the next older step is tried.  A record of
another layout (another number of members or devices, other boxes) or of another
experiment is incompatible: the attempt stops, naming both layouts, with no fallback.
The step chosen is broadcast; each member reads its own shard file, checks its checksum,
that it is the file the record names (the same checksum) and that it holds exactly the
boxes this member owns; any member's refusal quarantines the whole step, and the members
try the next one together.  The state is then rebuilt on the same mesh, each member
placing only its own boxes, and the caller proves that its combined hash is the record's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jobwarden.checkpoint.errors import (
    CheckpointError,
    CorruptCheckpoint,
    NoUsableCheckpoint,
    RuntimeMismatch,
)
from jobwarden.checkpoint.manifest import LeafSpec
from jobwarden.checkpoint.shardrecord import (
    CommitRecord,
    describe,
    piece_path,
    record_name,
    same_layout,
)
from jobwarden.checkpoint.store import CheckpointStore, Skipped
from jobwarden.checkpoint.validate import Expected, check_manifest
from jobwarden.shards.commit import Group
from jobwarden.shards.hash import box_of

Broadcast = Callable[[np.ndarray], np.ndarray]
"""Member 0's int32 values in every member (a collective)."""
CHECKS: tuple[str, ...] = ("readable", "checksum", "schema", "layout", "source", "config")
CHECKS += ("data", "runtime", "generation", "tree", "shape", "dtype", "step_range", "members")


@dataclass(frozen=True)
class Restored:
    """The step the members start from (0: fresh) and this member's pieces of it."""

    step: int
    record: CommitRecord | None = None
    path: Path | None = None
    pieces: Mapping[str, np.ndarray] | None = None
    skipped: tuple[Skipped, ...] = ()


class ShardRestore:
    """One member's part in choosing and reading a sharded step."""

    def __init__(
        self,
        group: Group,
        expected: Expected,
        pieces: tuple[LeafSpec, ...],
        broadcast: Broadcast,
        store: CheckpointStore | None,
    ) -> None:
        self.group = group
        self.expected = expected
        self.piece_specs = pieces
        self.broadcast = broadcast
        self.store = store
        """member 0's store (it quarantines); None in the other members"""
        self._skipped: list[Skipped] = []
        self._tried: set[int] = set()

    def select(self) -> Restored:
        """The newest complete compatible step every member can read (a collective)."""
        files = self.group.files
        if self.store is not None:
            for name in sorted({p.name for p in self.store.pending()} | {*files.uncommitted()}):
                self._quarantine_file(
                    name,
                    "checkpoint.pending",
                    "never selected: its step has no commit record (a commit that never finished)",
                )
        while True:
            chosen = self._choose() if self.store is not None else -1
            step = int(np.asarray(self.broadcast(np.array([chosen], np.int32)))[0])
            if step < 0:
                return Restored(0, skipped=tuple(self._skipped))
            refusal, record, pieces = self._read_mine(step)
            refusals = self.group.exchange(refusal)
            if not any(refusals):
                path = files.directory / record_name(step)
                return Restored(step, record, path, pieces, tuple(self._skipped))
            if self.store is not None:
                why = "; ".join(f"member {i}: {r}" for i, r in enumerate(refusals) if r)
                self._quarantine_step(step, "checkpoint.corrupt", why)

    def _choose(self) -> int:
        """Member 0: the newest untried step whose record is sound and compatible, else -1."""
        files = self.group.files
        for step in reversed(files.steps()):
            if step in self._tried:
                continue
            self._tried.add(step)
            try:
                record = files.read_record(step)
            except CorruptCheckpoint as error:
                self._quarantine_step(step, error.code, error.detail)
                continue
            where = str(files.directory / record_name(step))
            self._check_layout(where, record)
            check_manifest(where, record.manifest, self.expected, step)
            missing = [m.file for m in record.members if not (files.directory / m.file).exists()]
            if missing:
                self._quarantine_step(step, "checkpoint.unreadable", f"missing {missing}")
                continue
            return step
        plain = self.store.committed() if self.store is not None else []
        if plain:  # single-file steps: a state with no leaf laid out wrote them
            saved, running = "no leaf laid out", describe(self.group.devices, self.group.layout)
            raise RuntimeMismatch(
                str(plain[-1][1]),
                "layout",
                saved,
                running,
                message=f"layout differs: saved {saved} (one file per step), running {running}",
            )
        if any(s.code != "checkpoint.pending" for s in self._skipped):
            raise NoUsableCheckpoint(
                str(files.directory),
                "every committed sharded step was damaged and quarantined; "
                "refusing to start over silently",
                skipped=[s.as_record() for s in self._skipped],
            )
        return -1

    def _check_layout(self, where: str, record: CommitRecord) -> None:
        """Refuse a step written by another layout, naming both."""
        group = self.group
        if same_layout(record, group.devices, group.layout):
            return
        saved, running = (
            describe(record.devices, record.layout),
            describe(group.devices, group.layout),
        )
        raise RuntimeMismatch(
            where,
            "layout",
            saved,
            running,
            message=f"layout differs: saved {saved}, running {running}; "
            "a sharded step restores only onto the layout that wrote it",
        )

    def _read_mine(
        self, step: int
    ) -> tuple[str, CommitRecord | None, Mapping[str, np.ndarray] | None]:
        """This member's shard of ``step``: ("", record, pieces), or (refusal, None, None)."""
        group = self.group
        try:
            record = group.files.read_record(step)
            entry = record.members[group.member]
            shard = group.files.read_shard(entry.file)
            if shard.checksum != entry.checksum:
                return (
                    f"{entry.file}: checksum {shard.checksum}, record {entry.checksum}",
                    None,
                    None,
                )
            if shard.manifest.leaves != self.piece_specs or shard.manifest.step != step:
                return f"{entry.file}: holds other boxes or another step", None, None
        except (CheckpointError, IndexError, OSError) as error:
            return f"{type(error).__name__}: {error}"[:200], None, None
        return "", record, shard.arrays

    def _quarantine_step(self, step: int, code: str, message: str) -> None:
        """Member 0: every file of ``step``, record first, into quarantine."""
        for name in self.group.files.files_of(step):
            self._quarantine_file(name, code, message)

    def _quarantine_file(self, name: str, code: str, message: str) -> None:
        assert self.store is not None
        target = self.store.quarantine(
            self.group.files.directory / name, {"code": code, "message": message}
        )
        self._skipped.append(Skipped(name, code, message, str(target)))


def assemble(
    leaves: Sequence[tuple[str, Any]], group: Group, pieces: Mapping[str, np.ndarray]
) -> dict[str, Any]:
    """Every leaf of a state like ``leaves`` from this member's pieces, on the same mesh:
    a laid-out leaf from its boxes, a leaf replicated over the members from this member's
    copy, any other leaf as the host array."""
    import jax

    out: dict[str, Any] = {}
    for path, value in leaves:
        if path in group.layout:
            shape = tuple(value.shape)

            def box(index: Any, path: str = path, shape: tuple[int, ...] = shape) -> np.ndarray:
                return pieces[piece_path(path, box_of(index, shape))]

            out[path] = jax.make_array_from_callback(shape, value.sharding, box)
        elif isinstance(value, jax.Array) and not value.is_fully_addressable:
            whole = pieces[path]

            def part(index: Any, whole: np.ndarray = whole) -> np.ndarray:
                return np.asarray(whole[index])

            out[path] = jax.make_array_from_callback(whole.shape, value.sharding, part)
        else:
            out[path] = pieces[path]
    return out
