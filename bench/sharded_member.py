"""One member of `bench/sharded.py`'s job: the same state committed, restored and hashed
three ways, each timed from a common start (a gather every member joins).

The state is one float32 matrix of ``mib`` MiB split on its rows over a mesh of one CPU
device per member, and a small key every member holds a copy of.  Each member prints one
JSON line: for every measure, its own seconds per repeat (after one repeat that warms it up
and is not kept); `bench/sharded.py` takes the slowest member of each repeat (the job waits
for it) and the median over repeats.
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


def hashes(bench: Bench) -> dict[str, Callable[[], object]]:
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

    return {"hash_combined": lambda: combined(bench.leaves, 1), "hash_gathered": gathered}


class Sharded:
    """`ShardCommitter.commit` (keep 1) and `open_sharded` (choose, read, check, place,
    prove the combined hash) of the laid-out state."""

    def __init__(self, bench: Bench) -> None:
        from jobwarden.checkpoint.store import CheckpointStore
        from jobwarden.events import Emitter
        from jobwarden.sdk.leaves import Flattener
        from jobwarden.shards.hash import ShardedStateHasher, layout_of

        self.bench = bench
        self.directory = bench.directory("sharded")
        member = bench.member
        self.store = CheckpointStore(self.directory) if member.writes else None
        self.emitter = Emitter(open("/dev/null", "w"))  # noqa: SIM115 - not the measure
        self.flatten = Flattener()
        self.committer = self.opened().committer
        self.hasher = ShardedStateHasher(member.allgather, layout_of(bench.leaves), member.index)

    def opened(self) -> Any:
        """The restore a sharded run makes (`open_sharded`)."""
        from jobwarden.shards.attach import Place, open_sharded

        place = Place(self.directory, self.bench.member, self.store, None, self.emitter, keep=1)
        return open_sharded(self.bench.state, self.flatten, expected_for, place)

    def prepare(self, step: int) -> Callable[[], object]:
        """The commit of ``step``, its hash made beforehand (a run hashes at its progress)."""
        leaves = self.bench.leaves
        digest, parts = self.hasher(leaves, step)
        manifest = manifest_for(leaves, step, digest, parts)
        return lambda: self.committer.commit(step, manifest, leaves, None)

    def restore(self) -> None:
        """Restore the newest step and wait for its array."""
        opened = self.opened()
        if opened.state is None:
            raise RuntimeError("the sharded restore found no step")
        opened.state["params"]["w"].block_until_ready()


class Replicated:
    """The same state replicated in every member, as a replicated job commits it: the
    members' hashes agree (`Membership.agree`), then member 0 writes the one file
    (`Committer`, keep 1); restored as such a job restores: member 0 selects and reads it
    (`CheckpointStore.select`), and every member gets its values (`Membership.share_start`)."""

    def __init__(self, bench: Bench) -> None:
        from jobwarden.checkpoint.store import CheckpointStore
        from jobwarden.events import Emitter
        from jobwarden.hashing import StateHasher
        from jobwarden.sdk.commits import Committer

        self.member = bench.member
        self.leaves = list(bench.whole.items())
        self.store = CheckpointStore(bench.directory("replicated"))
        sink = open("/dev/null", "w")  # noqa: SIM115 - the events are not the measure
        self.committer = Committer(self.store, Emitter(sink), keep=1, background=False)
        self.hasher = StateHasher()
        self.expected = expected_for(self.leaves, 0)

    def prepare(self, step: int) -> Callable[[], object]:
        """The commit of ``step``, its hash made beforehand."""
        digest, parts = self.hasher(self.leaves, step)
        manifest = manifest_for(self.leaves, step, digest, parts)

        def commit() -> None:
            self.member.agree(step, digest)
            if self.member.writes:
                self.committer.commit(step, manifest, self.leaves, None)

        return commit

    def restore(self) -> None:
        """Member 0 reads the newest file; every member gets its step and values."""
        step, values = 0, [value for _, value in self.leaves]
        if self.member.writes:
            chosen = self.store.select(self.expected).checkpoint
            if chosen is None:
                raise RuntimeError("the replicated restore found no checkpoint")
            step, values = chosen.manifest.step, [chosen.arrays[p] for p, _ in self.leaves]
        self.member.share_start(step, values)


class Orbax:
    """Orbax's own sharded save (`StandardCheckpointer`, every member writing its shards,
    timed until `wait_until_finished`) and restore onto the same sharding.  Orbax does not
    fsync: `fsync` times member 0 syncing every file and folder it wrote.  Its retention
    (the older step's folder removed) is left out of the timing."""

    def __init__(self, bench: Bench) -> None:
        import jax
        import orbax.checkpoint as ocp

        self.bench = bench
        self.directory = bench.directory("orbax")
        w = bench.leaves[1][1]
        self.tree = {"key": bench.whole["key"], "params": {"w": w}}
        self.checkpointer = ocp.StandardCheckpointer()
        self.target = {
            "key": jax.ShapeDtypeStruct((2,), np.uint32),
            "params": {"w": jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=bench.sharding)},
        }
        self.step = 0

    def prepare(self, step: int) -> Callable[[], object]:
        """The save of ``step``, the older one removed first (untimed)."""
        if self.bench.member.writes and self.step:
            shutil.rmtree(self.directory / str(self.step))
        self.step = step

        def save() -> None:
            self.checkpointer.save(self.directory / str(step), self.tree)
            self.checkpointer.wait_until_finished()

        return save

    def fsync(self) -> None:
        """Member 0 fsyncs every file and folder of the newest step."""
        if self.bench.member.writes:
            _fsync_tree(self.directory / str(self.step))

    def restore(self) -> None:
        """Restore the newest step onto the same sharding and wait for its array."""
        back = self.checkpointer.restore(self.directory / str(self.step), self.target)
        back["params"]["w"].block_until_ready()


def _fsync_tree(root: Path) -> None:
    """fsync every file and folder under ``root``, folders after what they hold."""
    import os

    for path in [*sorted(root.rglob("*"), key=lambda p: -len(p.parts)), root, root.parent]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _turn(names: list[str], turn: int) -> list[str]:
    """``names`` rotated by ``turn``: each way goes first, second and last in turn."""
    first = turn % len(names)
    return names[first:] + names[:first]


def member(index: int, members: int, port: int, *, mib: int, repeat: int, folder: Path) -> None:
    """One member: every measure, the three ways side by side in each repeat, in an order
    that turns from one repeat to the next; its seconds as one JSON line on stdout."""
    import jax

    bench = Bench(index, members, port, mib, folder)
    ways = {"sharded": Sharded(bench), "replicated": Replicated(bench), "orbax": Orbax(bench)}
    found: Timed = {}
    for step in range(repeat + 1):  # step 0 warms every way up and is not kept
        for name in _turn(list(ways), step):
            way = ways[name]
            work = way.prepare(step + 1)
            label = "orbax_save" if name == "orbax" else f"{name}_commit"
            found.setdefault(label, []).extend(bench.timed(work, 1))
            if isinstance(way, Sharded):  # the removal of the dropped shards, left to its
                way.committer.settle()  # thread, ends before the next way is timed
            if isinstance(way, Orbax):  # Orbax's data is on disk before the next way
                found.setdefault("orbax_fsync", []).extend(bench.timed(way.fsync, 1))
    hashers = hashes(bench)
    for turn in range(repeat + 1):
        for name in _turn(list(ways), turn):
            found.setdefault(f"{name}_restore", []).extend(bench.timed(ways[name].restore, 1))
        for name, work in hashers.items():
            found.setdefault(name, []).extend(bench.timed(work, 1))
    found = {name: seconds[1:] for name, seconds in found.items()}
    ways["orbax"].checkpointer.close()  # type: ignore[attr-defined]
    sys.stdout.write(json.dumps(found) + "\n")
    sys.stdout.flush()
    jax.distributed.shutdown()
