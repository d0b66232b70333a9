"""Opening a sharded state in a run: the group, its hasher, its committer, the step restored.

`jobwarden.sdk.run.Run.restore` calls `open_sharded` in every member when the initial state
has a leaf laid out over the members (`jobwarden.shards.hash.is_laid_out`).  Everything
here is a collective, called by every member in the same order.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from jobwarden import statetree as state_tree
from jobwarden.checkpoint import lease
from jobwarden.checkpoint.errors import ChecksumMismatch, WriterFenced
from jobwarden.checkpoint.lock import WriterLock, read_generation
from jobwarden.checkpoint.store import CheckpointStore
from jobwarden.checkpoint.validate import Expected
from jobwarden.errors import ResumePolicyError
from jobwarden.events import Emitter
from jobwarden.hashing import Leaves
from jobwarden.shards.commit import ShardCommitter, make_group
from jobwarden.shards.files import ShardFiles
from jobwarden.shards.hash import ShardedStateHasher, layout_of
from jobwarden.shards.restore import CHECKS, Restored, ShardRestore, assemble


class Members(Protocol):
    """What `open_sharded` needs of the run's membership (`jobwarden.sdk.distributed`)."""

    @property
    def index(self) -> int:
        """This member's index."""

    @property
    def processes(self) -> int:
        """How many members the job has."""

    @property
    def writes(self) -> bool:
        """Whether this member holds the writer lock (member 0)."""

    def allgather(self, rows: np.ndarray) -> np.ndarray:
        """Every member's rows, stacked in member order."""

    def broadcast(self, values: np.ndarray) -> np.ndarray:
        """Member 0's int32 values in every member."""


@dataclass(frozen=True)
class Place:
    """Where the run writes: its directory, membership, and member 0's store, lock and
    event stream."""

    directory: Path
    member: Members
    store: CheckpointStore | None
    lock: WriterLock | None
    emitter: Emitter
    keep: int
    resume: str = "auto"
    """``[run] resume``: ``never`` refuses a directory of sharded steps, ``require`` one
    without"""


@dataclass(frozen=True)
class Opened:
    """What a run needs of its sharded state: its hasher, its committer and its start."""

    hasher: ShardedStateHasher
    committer: ShardCommitter
    expected: Expected
    restored: Restored
    state: Any = None
    """the restored state (None: start from the initial state)"""
    digest: str = ""
    components: dict[str, str] = field(default_factory=dict)

    def event(self, skipped: list[dict[str, str]]) -> dict[str, Any]:
        """The fields of the ``restored`` event member 0 emits."""
        record = self.restored.record
        assert record is not None
        return {
            "step": self.restored.step,
            "file": str(self.restored.path),
            "state_hash": self.digest,
            "components": self.components,
            "checks": [*CHECKS, "state_hash"],
            "skipped": skipped,
            "checksum": None,
            "writer_generation": record.manifest.provenance.writer_generation,
        }


def generation_fence(directory: Path, generation: int) -> Callable[[], None]:
    """A check, before each rename, that ``writer.json`` still names the job's generation:
    a member without the lock is fenced by the generation of the member that holds it,
    and, where writers take the lease (under Slurm), by the lease as that member is."""
    leased = lease.wanted(os.environ)

    def fence() -> None:
        try:
            current: int | None = read_generation(directory)
        except (OSError, ValueError):
            current = None
        if current != generation:
            raise WriterFenced(
                f"writer.json of {directory} names generation {current}, this job's member "
                f"writes for generation {generation}; refusing to commit its shard",
                directory=str(directory),
                generation=generation,
                found=current,
            )
        if leased:
            lease.check(directory, generation, renewing=False)

    return fence


def open_sharded(
    init_state: Any,
    flatten: Callable[[Any], Leaves],
    expected_for: Callable[[Leaves, int], Expected],
    place: Place,
) -> Opened:
    """Join the sharded group, choose and read the step to start from, prove its hash.

    ``flatten`` gives a state's named leaves (laid-out ones as arrays, others as host
    arrays); ``expected_for(leaves, generation)`` what a step must match.  The generation
    is member 0's, broadcast, so every member is fenced by it.
    """
    import jax

    member = place.member
    lock_generation = place.lock.generation if place.lock is not None else 0
    generation = int(member.broadcast(np.array([lock_generation], np.int32))[0])
    leaves = flatten(init_state)
    expected = expected_for(leaves, generation)
    fence = place.lock.check if place.lock is not None else None
    files = ShardFiles(
        place.directory,
        member.index,
        member.processes,
        fence or generation_fence(place.directory, generation),
    )
    layout = layout_of(leaves)
    group = make_group(
        leaves,
        layout=layout,
        gather=member.allgather,
        files=files,
        member=member.index,
        local_devices=jax.local_device_count(),
    )
    hasher = ShardedStateHasher(member.allgather, layout, member.index)
    committer = ShardCommitter(group, place.emitter if member.writes else None, place.keep)
    restore = ShardRestore(
        group, expected, group.piece_specs(leaves), member.broadcast, place.store
    )
    if place.resume == "never" and member.writes and files.steps():
        raise ResumePolicyError(
            f"resume = 'never' but {place.directory} already holds "
            f"{len(files.steps())} sharded step(s)",
            directory=str(place.directory),
        )
    restored = restore.select()
    if restored.record is None or restored.pieces is None:
        if place.resume == "require":
            raise ResumePolicyError(
                f"resume = 'require' but {place.directory} holds no sharded step",
                directory=str(place.directory),
            )
        return Opened(hasher, committer, expected, restored)
    raw = list(zip(state_tree.leaf_paths(init_state), jax.tree.leaves(init_state), strict=True))
    state = state_tree.unflatten_like(init_state, assemble(raw, group, restored.pieces))
    digest, components = hasher(flatten(state), restored.step)
    prove(restored, digest)
    return Opened(hasher, committer, expected, restored, state, digest, components)


def prove(restored: Restored, digest: str) -> None:
    """Refuse a restored state whose combined hash is not the record's."""
    record = restored.record
    if record is None or digest == record.manifest.state_hash:
        return
    raise ChecksumMismatch(
        str(restored.path),
        f"the restored state hashes {digest}, the record says {record.manifest.state_hash}",
        stored=record.manifest.state_hash,
        computed=digest,
    )
