"""Sharded state: the combined state hash and the sharded commit, against the same state
held whole by one process (its plain hash, its single-file durable commit).

N members (N = 2, 4) joined by jax.distributed on loopback (gloo) hold one float32 leaf
of ``--mib`` MiB laid out over a mesh of one device per member (split on its rows), and
a replicated key.  Each member times the combined hash (`ShardedStateHasher`: its own
boxes, one all-gather of 16-byte digests) and the sharded commit (`ShardCommitter`: its
shard file durable, the gather, member 0's record), as member 0 sees them.  The baseline
is the same state whole in one process: `StateHasher` over it and `CheckpointStore.commit`
of its single file.  Medians of ``--repeat``; this machine is shared, so they are noisy.
Usage: python bench/sharded.py [--mib 64] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def state_values(mib: int) -> dict[str, np.ndarray]:
    """The state whole: one float32 matrix of ``mib`` MiB (1024 columns) and a key."""
    rows = max(4, mib * 256 // 4 * 4)
    rng = np.random.default_rng(3)
    return {
        "params/w": rng.standard_normal((rows, 1024), dtype=np.float32),
        "key": np.array([0, 7], np.uint32),
    }


def member(index: int, members: int, port: int, *, mib: int, repeat: int, folder: Path) -> None:
    """One member: lay the state out, time the combined hash and the sharded commit."""
    import jax
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from jobwarden.checkpoint.format import Manifest, Provenance, leaf_specs
    from jobwarden.events import Emitter
    from jobwarden.shards.commit import ShardCommitter, make_group
    from jobwarden.shards.files import ShardFiles
    from jobwarden.shards.hash import ShardedStateHasher, layout_of

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # type: ignore[no-untyped-call]
    jax.distributed.initialize(f"127.0.0.1:{port}", members, index)
    mesh = Mesh(np.array(jax.devices()), ("m",))
    values = state_values(mib)
    leaves: list[tuple[str, Any]] = []
    for path, value in values.items():
        spec = PartitionSpec("m") if value.ndim == 2 else PartitionSpec()  # type: ignore[no-untyped-call]
        sharding = NamedSharding(mesh, spec)
        placed = jax.make_array_from_callback(value.shape, sharding, lambda i, v=value: v[i])
        leaves.append((path, placed if value.ndim == 2 else value))
    del values

    def gather(rows: np.ndarray) -> np.ndarray:
        return np.asarray(multihost_utils.process_allgather(rows))

    layout = layout_of(leaves)
    hasher = ShardedStateHasher(gather, layout, index)
    hashes = []
    for _ in range(repeat):
        began = time.perf_counter()
        digest, components = hasher(leaves, 1)
        hashes.append(time.perf_counter() - began)
    files = ShardFiles(folder, index, members, lambda: None)
    group = make_group(
        leaves, layout=layout, gather=gather, files=files, member=index, local_devices=1
    )
    emitter = Emitter(open("/dev/null", "w")) if index == 0 else None  # noqa: SIM115
    committer = ShardCommitter(group, emitter, keep=1)
    manifest = Manifest(
        task="bench",
        job_id="bench",
        step=0,
        key_impl="threefry2x32",
        leaves=leaf_specs(leaves),
        train={},
        provenance=Provenance("c", "d", "s", {}, 0),
        state_hash=digest,
        components=components,
        created=0.0,
    )
    commits = []
    for step in range(1, repeat + 1):
        gather(np.zeros((1, 1), np.uint8))  # start together
        began = time.perf_counter()
        committer.commit(step, Manifest(**{**manifest.__dict__, "step": step}), leaves, None)
        commits.append(time.perf_counter() - began)
    out = {"hash_s": statistics.median(hashes), "commit_s": statistics.median(commits)}
    sys.stdout.write(json.dumps(out) + "\n")
    jax.distributed.shutdown()


def whole(mib: int, repeat: int, folder: Path) -> dict[str, float]:
    """The baseline: the same state whole in one process, hashed and committed as one file."""
    from jobwarden.checkpoint.format import Manifest, Provenance, leaf_specs
    from jobwarden.checkpoint.store import CheckpointStore
    from jobwarden.hashing import StateHasher

    leaves = list(state_values(mib).items())
    hasher = StateHasher()
    hashes, commits = [], []
    for _ in range(repeat):
        began = time.perf_counter()
        digest, components = hasher(leaves, 1)
        hashes.append(time.perf_counter() - began)
    store = CheckpointStore(folder)
    for step in range(1, repeat + 1):
        manifest = Manifest(
            "bench", "bench", step, "threefry2x32", leaf_specs(leaves), {},
            Provenance("c", "d", "s", {}, 0), digest, components, 0.0,
        )  # fmt: skip
        began = time.perf_counter()
        store.commit(step, manifest, leaves)
        store.retain(1)
        commits.append(time.perf_counter() - began)
    return {"hash_s": statistics.median(hashes), "commit_s": statistics.median(commits)}


def group(members: int, mib: int, repeat: int, folder: Path) -> dict[str, float]:
    """Member 0's medians in a job of ``members``."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [sys.executable, __file__, "--member", "{i}", str(members), str(port)]
    procs = [
        subprocess.Popen(
            [a.format(i=i) for a in argv]
            + ["--mib", str(mib), "--repeat", str(repeat)]
            + ["--folder", str(folder)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(members)
    ]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    return dict(json.loads(outs[0].strip().splitlines()[-1]))


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--member", nargs=3, type=int)
    parser.add_argument("--folder", type=Path)
    args = parser.parse_args()
    if args.member:
        member(*args.member, mib=args.mib, repeat=args.repeat, folder=args.folder)
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, members in (
            ("whole, 1 process", 1),
            ("sharded, N = 2", 2),
            ("sharded, N = 4", 4),
        ):
            folder = Path(tmp) / name.replace(" ", "").replace(",", "-")
            folder.mkdir(mode=0o700)
            found = (
                whole(args.mib, args.repeat, folder)
                if members == 1
                else group(members, args.mib, args.repeat, folder)
            )
            rows.append((name, found))
    print(f"| {args.mib} MiB state | combined hash | commit (durable) |")
    print("|---|---|---|")
    for name, found in rows:
        print(f"| {name} | {found['hash_s'] * 1e3:.1f} ms | {found['commit_s'] * 1e3:.0f} ms |")


if __name__ == "__main__":
    main()
