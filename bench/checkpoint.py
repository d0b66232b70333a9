"""Checkpoint benchmark: jobwarden's format against raw I/O, side by side in one run.

For each state size (the ``mlp`` task's real state: nested params, Adam's
count, mu and nu, and the key, taken one optimizer step past initialization so
mu and nu are not all zeros) it measures, as medians over repeats:

* ``save``: a durable jobwarden commit (`CheckpointStore.commit`: encode with
  the xxh3-128 checksum, then `atomic.commit`) to a fresh file name;
* ``raw durable write``: the same leaf bytes, concatenated beforehand, written
  with ``os.write`` to a pending file, fsync, ``os.replace``, fsync the directory;
* ``load``: `format.read` of a cold file, with full checksum verification;
* ``raw cold read``: the same number of bytes read from a cold raw file into a
  buffer allocated for the read, as the load allocates its own (``np.empty``,
  then ``preadv`` in the load's chunks), no verification: the load's baseline;
* ``raw cold read, reused buffer``: the same into one bytearray reused across
  repeats, which never pays the first touch of fresh memory (for reference);
* optionally orbax-checkpoint's save and restore of the same state pytree.

It also shows `state_hash`, which the worker computes for the manifest before
each save (outside ``save``, as in the worker's own checkpoint timing).

Files are made cold before every timed read: fsync, then
``posix_fadvise(POSIX_FADV_DONTNEED)``, then ``/proc/sys/vm/drop_caches`` when
it is writable; the page-cache residency left is checked with ``mincore``.
The jobwarden and raw measurements alternate within each repeat, so drift in
the machine affects both alike.  Ratios are throughput ratios from the medians
of this same run; the targets are save >= 0.8x raw durable write and verified
load >= 0.8x the allocating raw cold read (the ratio to the reused buffer is
reported beside it).  Finally it times the per-checkpoint cost of the
``linreg`` task's tiny state (target < 2 ms).  MB/s counts 10**6 bytes of state.

Run with ``make bench`` or ``.venv/bin/python bench/checkpoint.py``
(``--quick`` for sizes 4,64 MiB and 3 repeats; ``--help`` for the rest).
It prints a table and writes ``bench/results/checkpoint.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import jax
import numpy as np
from checkpoint_io import Evictor, raw_durable_write, raw_read, raw_read_allocating, tree_bytes
from figures import at_least, at_most, context, records

from jobwarden.checkpoint import format
from jobwarden.checkpoint.store import CheckpointStore, file_name
from jobwarden.hashing import Leaves, config_hash, state_hash
from jobwarden.statetree import flatten
from jobwarden.tasks.base import State, Task
from jobwarden.tasks.linreg import LinReg, LinRegTrain
from jobwarden.tasks.mlp import MLP, MLPTrain, width_for_bytes

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_SIZES = (4, 64, 512)
QUICK_SIZES = (4, 64)
DEFAULT_REPEATS = 5
QUICK_REPEATS = 3
TINY_COMMITS = 200
TARGET_RATIO = 0.8
TARGET_TINY_MS = 2.0
ORBAX_MISSING = "orbax-checkpoint not installed (pip install -e '.[bench]')"
PACKAGES = ("jax", "jaxlib", "numpy", "xxhash", "optax", "orbax-checkpoint", "tensorstore")

T = TypeVar("T")


def timed(action: Callable[[], T]) -> tuple[float, T]:
    """Seconds ``action`` took, and its result (kept so freeing it is not timed)."""
    began = time.perf_counter()
    result = action()
    return time.perf_counter() - began, result


@dataclass
class Op:
    """Samples of one timed operation over ``nbytes`` of state."""

    name: str
    nbytes: int
    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        """Median seconds."""
        return statistics.median(self.samples)

    @property
    def mb_per_s(self) -> float:
        """Throughput of the median, in 10**6 bytes of state per second."""
        return self.nbytes / self.median / 1e6

    def record(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "median_s": self.median,
            "mb_per_s": self.mb_per_s,
            "bytes": self.nbytes,
            "samples_s": self.samples,
        }


def ratio(ours: Op, baseline: Op) -> float:
    """Throughput of ``ours`` relative to ``baseline`` (same byte count)."""
    return ours.mb_per_s / baseline.mb_per_s


# ---------------------------------------------------------------- states


def build_manifest(task: Task, leaves: Leaves, step: int) -> format.Manifest:
    """A manifest like the worker's for ``leaves`` at ``step`` (hashes the state)."""
    digest, components = state_hash(leaves, step)
    train = task.train.model_dump()
    return format.Manifest(
        task=task.name,
        job_id="bench",
        step=step,
        key_impl=task.key_impl,
        leaves=format.leaf_specs(leaves),
        train=train,
        provenance=format.Provenance(
            config_hash=config_hash(task.name, train),
            data_hash="bench",
            source_hash="bench",
            runtime={"jax": jax.__version__, "backend": jax.default_backend()},
            writer_generation=1,
        ),
        state_hash=digest,
        components=components,
        created=time.time(),
    )


def mlp_state(mib: int) -> tuple[MLP, State]:
    """The mlp task and its state of about ``mib`` MiB, one Adam step past init."""
    width = width_for_bytes(mib << 20, depth=2)
    task = MLP(MLPTrain(width=width, depth=2))
    data = task.data()
    state, _ = jax.jit(task.update(data))(task.init_state(data))
    jax.block_until_ready(state)
    return task, state


def load_orbax() -> Any | None:
    """The orbax.checkpoint module, or None when it is not installed."""
    try:
        import orbax.checkpoint as ocp
    except ImportError:
        return None
    return ocp


def version_of(package: str) -> str | None:
    """Installed version of ``package``, or None."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------- measurements


@dataclass
class SizeResult:
    """Everything measured at one state size."""

    mib: int
    width: int
    leaves: int
    state_bytes: int
    file_bytes: int
    ops: dict[str, Op]
    orbax_bytes: int | None = None

    def ratios(self) -> dict[str, float]:
        """Throughput ratios against the raw baselines of this run."""
        ops = self.ops
        found = {
            "save_vs_raw_write": ratio(ops["save"], ops["raw_write"]),
            "load_vs_raw_read": ratio(ops["load"], ops["raw_read"]),
            "load_vs_raw_read_reused": ratio(ops["load"], ops["raw_read_reused"]),
        }
        if "orbax_save" in ops:
            found["orbax_save_vs_raw_write"] = ratio(ops["orbax_save"], ops["raw_write"])
            found["orbax_restore_vs_raw_read"] = ratio(ops["orbax_restore"], ops["raw_read"])
        return found

    def targets(self) -> dict[str, bool]:
        """Whether each throughput target is met."""
        found = self.ratios()
        return {
            "save_vs_raw_write": found["save_vs_raw_write"] >= TARGET_RATIO,
            "load_vs_raw_read": found["load_vs_raw_read"] >= TARGET_RATIO,
        }

    def record(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "mib": self.mib,
            "mlp_width": self.width,
            "leaves": self.leaves,
            "state_bytes": self.state_bytes,
            "file_bytes": self.file_bytes,
            "orbax_bytes_on_disk": self.orbax_bytes,
            "operations": {name: op.record() for name, op in self.ops.items()},
            "ratios": self.ratios(),
            "targets_met": self.targets(),
        }


@dataclass(frozen=True)
class Run:
    """How often each measurement runs, how files are made cold, and orbax (or None)."""

    repeats: int
    warmup: int
    evictor: Evictor
    ocp: Any | None


@dataclass(frozen=True)
class Trial:
    """One timed action of round ``index``, with untimed steps before and after it."""

    name: str
    action: Callable[[int], object]
    before: Callable[[int], object] | None = None
    after: Callable[[int], object] | None = None


def run_trials(run: Run, trials: list[Trial], ops: dict[str, Op]) -> None:
    """Time every trial in each round, reversing their order every other round."""
    for index in range(run.warmup + run.repeats):
        for trial in trials if index % 2 == 0 else trials[::-1]:
            if trial.before is not None:
                trial.before(index)
            seconds, result = timed(partial(trial.action, index))
            del result  # freed before the next trial, and outside its timing
            if trial.after is not None:
                trial.after(index)
            if index >= run.warmup:
                ops[trial.name].samples.append(seconds)


def bench_size(mib: int, run: Run, workdir: Path) -> SizeResult:
    """Measure jobwarden against raw I/O (and orbax) at one state size."""
    task, state = mlp_state(mib)
    leaves = flatten(state)
    nbytes = sum(array.nbytes for _, array in leaves)
    raw = memoryview(b"".join(array.tobytes() for _, array in leaves))
    folder = workdir / f"{mib}mib"
    folder.mkdir()
    store = CheckpointStore(folder)
    names = ("save", "raw_write", "state_hash", "load", "raw_read", "raw_read_reused")
    ops = {name: Op(name, nbytes) for name in names}
    manifests: dict[int, format.Manifest] = {}

    def prepare_save(index: int) -> None:
        manifests[index] = build_manifest(task, leaves, index)

    def save(index: int) -> tuple[Path, int]:
        return store.commit(index, manifests.pop(index), leaves)

    def raw_name(index: int) -> Path:
        return folder / f"raw-{index}.bin"

    # Writes: a fresh file name each round, deleted after it (untimed).
    run_trials(
        run,
        [
            Trial("save", save, prepare_save, lambda i: (folder / file_name(i)).unlink()),
            Trial(
                "raw_write",
                lambda i: raw_durable_write(raw_name(i), raw),
                None,
                lambda i: raw_name(i).unlink(),
            ),
            Trial("state_hash", lambda i: state_hash(leaves, i)),
        ],
        ops,
    )

    # Reads: one file of each kind, made cold before every timed read.
    manifest = build_manifest(task, leaves, 10**9)
    ckpt_path, file_bytes = store.commit(manifest.step, manifest, leaves)
    raw_path = folder / "raw-read.bin"
    raw_durable_write(raw_path, raw)
    if state_hash(format.read(ckpt_path).leaves(), manifest.step)[0] != manifest.state_hash:
        raise RuntimeError("the checkpoint read back differs from the state saved")
    buffer = bytearray(nbytes)
    run_trials(
        run,
        [
            Trial("load", lambda _: format.read(ckpt_path), lambda _: run.evictor.evict(ckpt_path)),
            Trial(
                "raw_read",
                lambda _: raw_read_allocating(raw_path, nbytes),
                lambda _: run.evictor.evict(raw_path),
            ),
            Trial(
                "raw_read_reused",
                lambda _: raw_read(raw_path, buffer),
                lambda _: run.evictor.evict(raw_path),
            ),
        ],
        ops,
    )
    result = SizeResult(mib, task.train.width, len(leaves), nbytes, file_bytes, ops)
    if run.ocp is not None:
        result.ops.update(bench_orbax(run, state, nbytes, folder))
        result.orbax_bytes = tree_bytes(folder / "orbax-read")
    shutil.rmtree(folder)
    return result


def bench_orbax(run: Run, state: State, nbytes: int, folder: Path) -> dict[str, Op]:
    """orbax-checkpoint's StandardCheckpointer: save until finished, and cold restore."""
    ocp = run.ocp
    ops = {name: Op(name, nbytes) for name in ("orbax_save", "orbax_restore")}
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    read_path = folder / "orbax-read"
    with ocp.StandardCheckpointer() as checkpointer:

        def save_to(path: Path) -> None:
            checkpointer.save(path, state)
            checkpointer.wait_until_finished()

        def restore(_: int) -> Any:
            return jax.block_until_ready(checkpointer.restore(read_path, abstract))

        def save_name(index: int) -> Path:
            return folder / f"orbax-{index}"

        run_trials(
            run,
            [
                Trial(
                    "orbax_save",
                    lambda i: save_to(save_name(i)),
                    None,
                    lambda i: shutil.rmtree(save_name(i)),
                ),
            ],
            ops,
        )
        save_to(read_path)
        same = jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), restore(0), state)
        if not all(jax.tree.leaves(same)):
            raise RuntimeError("orbax restored a state that differs from the one saved")
        run_trials(
            run,
            [Trial("orbax_restore", restore, lambda _: run.evictor.evict(read_path))],
            ops,
        )
    return ops


def bench_tiny(run: Run, workdir: Path) -> dict[str, Op]:
    """Per-checkpoint cost of the linreg task's tiny state, ``run.repeats`` of each."""
    task = LinReg(LinRegTrain())
    state = task.init_state(task.data())
    leaves = flatten(state)
    nbytes = sum(array.nbytes for _, array in leaves)
    raw = memoryview(b"".join(array.tobytes() for _, array in leaves))
    folder = workdir / "tiny"
    folder.mkdir()
    store = CheckpointStore(folder)
    full_offset = 10**6  # the full-cost commits use their own step numbers
    manifests: dict[int, format.Manifest] = {}

    def prepare_commit(index: int) -> None:
        manifests[index] = build_manifest(task, leaves, index)

    def commit(index: int) -> tuple[Path, int]:
        return store.commit(index, manifests.pop(index), leaves)

    def full(index: int) -> tuple[Path, int]:
        step = full_offset + index
        current = flatten(state)
        return store.commit(step, build_manifest(task, current, step), current)

    trials = [
        Trial("commit", commit, prepare_commit),
        Trial("full", full),
        Trial("raw_write", lambda i: raw_durable_write(folder / f"raw-{i}.bin", raw)),
    ]
    ops = {trial.name: Op(trial.name, nbytes) for trial in trials}
    if run.ocp is None:
        run_trials(run, trials, ops)
    else:
        with run.ocp.StandardCheckpointer() as checkpointer:

            def orbax_save(index: int) -> None:
                checkpointer.save(folder / f"orbax-{index}", state)
                checkpointer.wait_until_finished()

            trials.append(Trial("orbax_save", orbax_save))
            ops["orbax_save"] = Op("orbax_save", nbytes)
            run_trials(run, trials, ops)
    shutil.rmtree(folder)
    return ops


# ---------------------------------------------------------------- report

ROW_NAMES = {
    "save": "save (jobwarden commit)",
    "raw_write": "raw durable write",
    "state_hash": "state_hash (worker, pre-save)",
    "load": "load (format.read, verified)",
    "raw_read": "raw cold read",
    "raw_read_reused": "raw cold read, reused buffer",
    "orbax_save": "orbax save",
    "orbax_restore": "orbax restore",
}
TINY_NAMES = {
    "commit": "jobwarden commit (encode + atomic)",
    "full": "jobwarden full (flatten+hash+manifest+commit)",
    "raw_write": "raw durable write",
    "orbax_save": "orbax save",
}
BASELINES = {
    "save": "raw_write",
    "load": "raw_read",
    "raw_read_reused": "raw_read",
    "orbax_save": "raw_write",
    "orbax_restore": "raw_read",
}
TARGETED = ("save", "load")
FIGURE_NAMES = {
    "save_vs_raw_write": "save vs raw write",
    "load_vs_raw_read": "load vs raw read (allocating)",
    "load_vs_raw_read_reused": "load vs raw read, reused buffer",
}


def verdict(met: bool) -> str:
    """PASS or MISS."""
    return "PASS" if met else "MISS"


def size_table(results: list[SizeResult]) -> list[str]:
    """The throughput table, one block of rows per size."""
    lines = [
        f"{'size':>8}  {'operation':<30} {'median s':>9} {'MB/s':>8} {'vs raw':>7}  target",
    ]
    for result in results:
        label = f"{result.mib} MiB"
        for name, title in ROW_NAMES.items():
            op = result.ops.get(name)
            if op is None:
                continue
            versus, target = "", ""
            if name in BASELINES:
                share = ratio(op, result.ops[BASELINES[name]])
                versus = f"{share:.2f}x"
                if name in TARGETED:
                    target = f"{verdict(share >= TARGET_RATIO)} (>= {TARGET_RATIO}x)"
            lines.append(
                f"{label:>8}  {title:<30} {op.median:>9.4f} {op.mb_per_s:>8.0f} "
                f"{versus:>7}  {target}".rstrip()
            )
            label = ""
        reused = result.ratios()["load_vs_raw_read_reused"]
        lines.append(f"{'':>8}  {'load vs reused-buffer read':<30} {'':>9} {'':>8} {reused:>6.2f}x")
    return lines


def tiny_table(ops: dict[str, Op], count: int) -> list[str]:
    """The tiny-state rows."""
    nbytes = ops["commit"].nbytes
    lines = [f"tiny state (linreg, {nbytes} B), median of {count} checkpoints"]
    for name, title in TINY_NAMES.items():
        op = ops.get(name)
        if op is None:
            continue
        millis = op.median * 1e3
        target = ""
        if name in ("commit", "full"):
            target = f"  {verdict(millis < TARGET_TINY_MS)} (< {TARGET_TINY_MS:g} ms)"
        lines.append(f"{'':>8}  {title:<46} {millis:>8.3f} ms{target}")
    return lines


def parse_sizes(text: str) -> tuple[int, ...]:
    """``4,64,512`` -> (4, 64, 512)."""
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"sizes must be integers in MiB: {text!r}") from error
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be positive MiB counts: {text!r}")
    return sizes


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options; ``--quick`` changes the defaults, explicit options win."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", type=parse_sizes, help="state sizes in MiB (4,64,512)")
    parser.add_argument("--repeats", type=int, help="timed repeats per measurement (5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first (1)")
    parser.add_argument("--quick", action="store_true", help="sizes 4,64 and 3 repeats")
    parser.add_argument(
        "--tiny-commits", type=int, default=TINY_COMMITS, help="tiny-state checkpoints (200)"
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=RESULTS,
        help="folder to make the temporary work folder in; use the filesystem under test "
        "(default: bench/results, on the project's filesystem)",
    )
    parser.add_argument(
        "--out", type=Path, default=RESULTS / "checkpoint.json", help="JSON results file"
    )
    parser.add_argument("--no-orbax", action="store_true", help="skip the orbax peer")
    args = parser.parse_args(argv)
    if args.sizes is None:
        args.sizes = QUICK_SIZES if args.quick else DEFAULT_SIZES
    if args.repeats is None:
        args.repeats = QUICK_REPEATS if args.quick else DEFAULT_REPEATS
    if args.repeats < 1 or args.warmup < 0 or args.tiny_commits < 1:
        parser.error("--repeats and --tiny-commits must be >= 1, --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table and write the JSON results."""
    args = parse_args(argv)
    ocp = None if args.no_orbax else load_orbax()
    orbax_version = version_of("orbax-checkpoint") if ocp is not None else None
    if ocp is None and not args.no_orbax:
        print(ORBAX_MISSING)
    evictor = Evictor()
    args.dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="checkpoint-bench-", dir=args.dir))
    run = Run(args.repeats, args.warmup, evictor, ocp)
    try:
        results = []
        for mib in args.sizes:
            print(f"measuring {mib} MiB ...", file=sys.stderr, flush=True)
            results.append(bench_size(mib, run, workdir))
            gc.collect()
        print("measuring the tiny state ...", file=sys.stderr, flush=True)
        tiny = bench_tiny(Run(args.tiny_commits, args.warmup, evictor, ocp), workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    resident = max(evictor.resident) if evictor.resident else None
    resident_text = "unknown" if resident is None else f"{resident:.1%}"
    orbax_text = f"orbax-checkpoint {orbax_version}" if orbax_version else "no orbax"
    print(
        f"checkpoint benchmark: median of {args.repeats} (after {args.warmup} warm-up), "
        f"cache eviction {evictor.method} (max resident before a read: {resident_text}), "
        f"{orbax_text}"
    )
    for line in [*size_table(results), "", *tiny_table(tiny, args.tiny_commits)]:
        print(line)
    tiny_met = {name: tiny[name].median * 1e3 < TARGET_TINY_MS for name in ("commit", "full")}
    met = all(all(r.targets().values()) for r in results) and all(tiny_met.values())
    print(f"targets: {'all met' if met else 'some missed'}")

    record = {
        "benchmark": "checkpoint",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {
            "sizes_mib": list(args.sizes),
            "repeats": args.repeats,
            "warmup": args.warmup,
            "tiny_commits": args.tiny_commits,
            "mb": 10**6,
        },
        "environment": {
            "python": platform.python_version(),
            "system": platform.system(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "jax_backend": jax.default_backend(),
            "packages": {name: version_of(name) for name in PACKAGES},
        },
        "cache_eviction": {"method": evictor.method, "max_resident_fraction": resident},
        "orbax": {"version": orbax_version, "api": "StandardCheckpointer"} if ocp else None,
        "targets": {"ratio": TARGET_RATIO, "tiny_ms": TARGET_TINY_MS},
        "sizes": [r.record() for r in results],
        "tiny": {
            "operations": {name: op.record() for name, op in tiny.items()},
            "targets_met": tiny_met,
        },
        "targets_met": met,
        "figures": records(
            [
                *(
                    at_least(f"{r.mib} MiB {FIGURE_NAMES[name]}", value, TARGET_RATIO, ".2f")
                    for r in results
                    for name, value in r.ratios().items()
                    if name in ("save_vs_raw_write", "load_vs_raw_read")
                ),
                *(
                    context(
                        f"{r.mib} MiB {FIGURE_NAMES['load_vs_raw_read_reused']}",
                        r.ratios()["load_vs_raw_read_reused"],
                        ".2f",
                    )
                    for r in results
                ),
                *(
                    at_most(
                        f"tiny state, {name}, median",
                        tiny[name].median * 1e3,
                        TARGET_TINY_MS,
                        ".2f",
                        " ms",
                    )
                    for name in ("commit", "full")
                ),
            ]
        ),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {display(args.out)}")
    return 0


def display(path: Path) -> str:
    """``path`` relative to the working folder when it is inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
