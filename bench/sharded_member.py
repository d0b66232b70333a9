"""One member of `bench/sharded.py`'s job: the same state committed, restored and hashed
three ways, each timed from a common start (a gather every member joins).

The state is one float32 matrix of ``mib`` MiB split on its rows over a mesh of one CPU
device per member, and a small key every member holds a copy of.  Each member prints one
JSON line: for every measure, its own seconds per repeat; `bench/sharded.py` takes the
slowest member of each repeat (the job waits for it) and the median over repeats.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

Timed = dict[str, list[float]]


def state_values(mib: int) -> dict[str, np.ndarray]:
    """The state whole: one float32 matrix of ``mib`` MiB (1024 columns) and a key."""
    rows = max(4, mib * 256 // 4 * 4)
    rng = np.random.default_rng(3)
    return {
        "params/w": rng.standard_normal((rows, 1024), dtype=np.float32),
        "key": np.array([0, 7], np.uint32),
    }


class Bench:
    """What every measure of one member shares: the membership, the state, the folder."""

    def __init__(self, index: int, members: int, port: int, mib: int, folder: Path) -> None:
        import jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        from jobwarden.sdk.distributed import Membership

        self.member = Membership(index, members, f"127.0.0.1:{port}")
        self.member.join()
        self.folder = folder
        self.whole = state_values(mib)
        mesh = Mesh(np.array(jax.devices()), ("m",))
        self.sharding = NamedSharding(mesh, PartitionSpec("m"))  # type: ignore[no-untyped-call]
        w = self.whole["params/w"]
        placed = jax.make_array_from_callback(w.shape, self.sharding, lambda i: w[i])
        self.state = {"key": self.whole["key"], "params": {"w": placed}}
        self.leaves: list[tuple[str, Any]] = [("key", self.whole["key"]), ("params/w", placed)]

    def together(self) -> None:
        """A barrier: every member has reached this point."""
        self.member.allgather(np.zeros((1, 1), np.uint8))

    def timed(self, work: Callable[[], object], repeat: int) -> list[float]:
        """``work``'s seconds in this member, ``repeat`` times, each started together."""
        seconds = []
        for _ in range(repeat):
            self.together()
            began = time.perf_counter()
            work()
            seconds.append(time.perf_counter() - began)
        return seconds

    def directory(self, name: str) -> Path:
        """A fresh folder for one way of writing, made by member 0 before the others use it."""
        path = self.folder / name
        if self.member.writes:
            path.mkdir(mode=0o700)
        self.together()
        return path


def manifest_for(leaves: list[tuple[str, Any]], step: int, digest: str, parts: Any) -> Any:
    """The global manifest of a bench state at ``step``."""
    from jobwarden.checkpoint.format import Manifest, Provenance, leaf_specs

    provenance = Provenance("c", "d", "s", {}, 0)
    return Manifest(
        "bench", "bench", step, "threefry2x32", leaf_specs(leaves), {}, provenance, digest,
        parts, 0.0,
    )  # fmt: skip


def expected_for(leaves: list[tuple[str, Any]], generation: int) -> Any:
    """What a restore of a bench state requires."""
    from jobwarden.checkpoint.format import leaf_specs
    from jobwarden.checkpoint.validate import Expected

    return Expected("bench", {}, "c", "d", "s", {}, leaf_specs(leaves), 1 << 30, generation)


def hashes(bench: Bench, repeat: int) -> Timed:
    """The combined hash of the laid-out state, and the hash of the same state gathered
    whole into every member first (`StateHasher` over the gathered copy)."""
    from jax.experimental import multihost_utils

    from jobwarden.hashing import StateHasher
    from jobwarden.shards.hash import ShardedStateHasher, layout_of

    member = bench.member
    combined = ShardedStateHasher(member.allgather, layout_of(bench.leaves), member.index)
    plain = StateHasher()
    placed = bench.leaves[1][1]

    def gathered() -> None:
        whole = np.asarray(multihost_utils.process_allgather(placed, tiled=True))
        plain([("key", bench.whole["key"]), ("params/w", whole)], 1)

    return {
        "hash_combined": bench.timed(lambda: combined(bench.leaves, 1), repeat),
        "hash_gathered": bench.timed(gathered, repeat),
    }


def sharded(bench: Bench, repeat: int) -> Timed:
    """`ShardCommitter.commit` (keep 1) and `open_sharded` (choose, read, check, place,
    prove the combined hash) of the laid-out state."""
    from jobwarden.checkpoint.store import CheckpointStore
    from jobwarden.events import Emitter
    from jobwarden.sdk.leaves import Flattener
    from jobwarden.shards.attach import Place, open_sharded
    from jobwarden.shards.hash import ShardedStateHasher, layout_of

    directory = bench.directory("sharded")
    member = bench.member
    store = CheckpointStore(directory) if member.writes else None
    sink = open("/dev/null", "w")  # noqa: SIM115 - the events are not the measure
    flatten = Flattener()

    def opened() -> Any:
        place = Place(directory, member, store, None, Emitter(sink), keep=1)
        return open_sharded(bench.state, flatten, expected_for, place)

    committer = opened().committer
    hasher = ShardedStateHasher(member.allgather, layout_of(bench.leaves), member.index)
    steps = iter(range(1, repeat + 1))

    def commit() -> None:
        step = next(steps)
        digest, parts = hasher(bench.leaves, step)
        bench.together()  # the hash is not the commit's: start the clock again
        began = time.perf_counter()
        committer.commit(step, manifest_for(bench.leaves, step, digest, parts), bench.leaves, None)
        seconds.append(time.perf_counter() - began)

    seconds: list[float] = []
    for _ in range(repeat):
        commit()
    restores = bench.timed(lambda: _restored(opened()), repeat)
    sink.close()
    return {"sharded_commit": seconds, "sharded_restore": restores}


def _restored(opened: Any) -> None:
    if opened.state is None:
        raise RuntimeError("the sharded restore found no step")
    opened.state["params"]["w"].block_until_ready()


def replicated(bench: Bench, repeat: int) -> Timed:
    """The same state replicated in every member, as a replicated job commits it: the
    members' hashes agree (`Membership.agree`), then member 0 writes the one file
    (`Committer`, keep 1); restored as such a job restores: member 0 selects and reads it
    (`CheckpointStore.select`), and every member gets its values (`Membership.share_start`)."""
    from jobwarden.checkpoint.store import CheckpointStore
    from jobwarden.events import Emitter
    from jobwarden.hashing import StateHasher
    from jobwarden.sdk.commits import Committer

    directory = bench.directory("replicated")
    member = bench.member
    leaves = list(bench.whole.items())
    store = CheckpointStore(directory)
    sink = open("/dev/null", "w")  # noqa: SIM115 - the events are not the measure
    committer = Committer(store, Emitter(sink), keep=1, background=False)
    hasher = StateHasher()
    seconds: list[float] = []
    for step in range(1, repeat + 1):
        digest, parts = hasher(leaves, step)
        bench.together()
        began = time.perf_counter()
        member.agree(step, digest)
        if member.writes:
            committer.commit(step, manifest_for(leaves, step, digest, parts), leaves, None)
        seconds.append(time.perf_counter() - began)
    expected = expected_for(leaves, 0)

    def restore() -> None:
        step, values = 0, [value for _, value in leaves]
        if member.writes:
            chosen = store.select(expected).checkpoint
            if chosen is None:
                raise RuntimeError("the replicated restore found no checkpoint")
            step, values = chosen.manifest.step, [chosen.arrays[path] for path, _ in leaves]
        member.share_start(step, values)

    restores = bench.timed(restore, repeat)
    sink.close()
    return {"replicated_commit": seconds, "replicated_restore": restores}


def orbax(bench: Bench, repeat: int) -> Timed:
    """Orbax's own sharded save (`StandardCheckpointer`, every member writing its shards,
    timed until `wait_until_finished`) and restore onto the same sharding; then the fsync
    of every file and folder it wrote (Orbax has none), timed apart."""
    import jax
    import orbax.checkpoint as ocp

    directory = bench.directory("orbax")
    tree = {"key": bench.whole["key"], "params": {"w": bench.leaves[1][1]}}
    checkpointer = ocp.StandardCheckpointer()
    saves: list[float] = []
    syncs: list[float] = []
    for step in range(1, repeat + 1):
        bench.together()
        began = time.perf_counter()
        checkpointer.save(directory / str(step), tree)
        checkpointer.wait_until_finished()
        saves.append(time.perf_counter() - began)
        bench.together()
        began = time.perf_counter()
        if bench.member.writes:
            _fsync_tree(directory / str(step))
        bench.together()
        syncs.append(time.perf_counter() - began)
        if bench.member.writes and step > 1:
            shutil.rmtree(directory / str(step - 1))  # retention, left out of the timing
    w = tree["params"]["w"]
    target = {
        "key": jax.ShapeDtypeStruct((2,), np.uint32),
        "params": {"w": jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=bench.sharding)},
    }

    def restore() -> None:
        back = checkpointer.restore(directory / str(repeat), target)
        back["params"]["w"].block_until_ready()

    restores = bench.timed(restore, repeat)
    checkpointer.close()
    return {"orbax_save": saves, "orbax_fsync": syncs, "orbax_restore": restores}


def _fsync_tree(root: Path) -> None:
    """fsync every file and folder under ``root``, folders after what they hold."""
    import os

    for path in [*sorted(root.rglob("*"), key=lambda p: -len(p.parts)), root, root.parent]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def member(index: int, members: int, port: int, *, mib: int, repeat: int, folder: Path) -> None:
    """One member: every measure in turn; its seconds as one JSON line on stdout."""
    import jax

    bench = Bench(index, members, port, mib, folder)
    found: Timed = {}
    for measure in (hashes, sharded, replicated, orbax):
        found.update(measure(bench, repeat))
        bench.together()
    sys.stdout.write(json.dumps(found) + "\n")
    sys.stdout.flush()
    jax.distributed.shutdown()
