"""One timed run of `bench/async_commit.py`: the ``mlp`` task's update, committing one way.

Run as a child process (one per run, so no mode inherits another's page cache,
threads or compiled code); prints one JSON line.  Every mode runs the same
loop on the same arrays: the task's own data, initial state and update
(`jobwarden.tasks.mlp`), jitted as the built-in program jits it, with the
worker's single-threaded XLA pins, warmed up once before the window.  The
window is the ``steps`` updates, with a commit after every ``EVERY``-th one
before the last, and ends when the last update is done and the commit in
flight (if any) is durable:

* ``none``: no commit;
* ``sync``: jobwarden's `Committer` on the training thread;
* ``async``: the same `Committer` in the background (``[run] async_commit``);
* ``orbax``: Orbax's `CheckpointManager` with asynchronous checkpointing, the
  same state pytree, ``wait_until_finished`` at the end of the window.

The jobwarden modes commit through the objects the SDK's step loop uses
(`Flattener` for the host views, `Committer`, `CheckpointStore`), with a
manifest whose state hash is a placeholder: hashing the state is the SDK's
cost, not the commit's, and Orbax has none.
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import time
from pathlib import Path
from typing import Any

from jobwarden.runtime import pin_environment

EVERY = 10


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def jobwarden_saver(folder: Path, background: bool, state: Any) -> tuple[Any, Any, io.StringIO]:
    """A save function and a settle function over jobwarden's committer."""
    from jobwarden.checkpoint.manifest import Manifest, Provenance, leaf_specs
    from jobwarden.checkpoint.store import CheckpointStore
    from jobwarden.events import Emitter
    from jobwarden.sdk.commits import Committer
    from jobwarden.sdk.leaves import Flattener

    folder.mkdir(mode=0o700, parents=True)
    events = io.StringIO()
    committer = Committer(CheckpointStore(folder), Emitter(events), 2, background)
    flatten = Flattener()
    specs = leaf_specs(flatten(state))
    provenance = Provenance("c" * 64, "d" * 32, "s" * 64, {"backend": "cpu"}, 1)

    def save(step: int, state: Any) -> float:
        manifest = Manifest(
            "mlp", "bench", step, "threefry2x32", specs, {}, provenance, "h" * 32, {}, time.time()
        )
        return committer.commit(step, manifest, flatten(state), None)

    return save, committer.settle, events


def orbax_saver(folder: Path) -> tuple[Any, Any, Any]:
    """A save function and a settle function over Orbax's asynchronous manager."""
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True, max_to_keep=2)
    manager = ocp.CheckpointManager(folder.resolve(), options=options)

    def save(step: int, state: Any) -> float:
        began = time.perf_counter()
        manager.save(step, args=ocp.args.StandardSave(state))
        return time.perf_counter() - began

    def settle() -> float:
        began = time.perf_counter()
        manager.wait_until_finished()
        return time.perf_counter() - began

    return save, settle, manager


def run(mode: str, width: int, steps: int, folder: Path) -> dict[str, Any]:
    """Warm up, then time the window of ``steps`` updates committing as ``mode`` says."""
    pin_environment()
    import jax

    from jobwarden.tasks.mlp import MLP, MLPTrain

    task = MLP(MLPTrain(width=width))
    data = task.data()
    state = task.init_state(data)
    update = jax.jit(task.update(data))
    jax.block_until_ready(update(state))  # type: ignore[no-untyped-call]
    save: Any = None
    settle: Any = None
    keep: Any = None
    if mode in ("sync", "async"):
        save, settle, keep = jobwarden_saver(folder, mode == "async", state)
    elif mode == "orbax":
        save, settle, keep = orbax_saver(folder)
    blocked: list[float] = []
    cpu, began = _cpu(), time.perf_counter()
    for step in range(1, steps + 1):
        state, loss = update(state)
        jax.block_until_ready((state, loss))  # type: ignore[no-untyped-call]
        if save is not None and step % EVERY == 0 and step < steps:
            blocked.append(save(step, state))
    settled = settle() if settle is not None else 0.0
    window = time.perf_counter() - began
    cpu = _cpu() - cpu
    commits = []
    if isinstance(keep, io.StringIO):
        commits = [json.loads(line) for line in keep.getvalue().splitlines()]
    elif keep is not None:
        keep.close()
    size = sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(state))
    return {
        "mode": mode,
        "window_s": window,
        "cpu_s": cpu,
        "blocked_s": blocked,
        "settle_s": settled,
        "commit_s": [e["seconds"] for e in commits],
        "bytes": size,
    }


def commit_cpu(width: int, repeats: int, folder: Path) -> dict[str, Any]:
    """The commit thread's own CPU and wall seconds for ``repeats`` background commits of the
    task's initial state, one at a time with nothing training (retention keeps one file)."""
    pin_environment()
    import threading

    import jax

    from jobwarden.checkpoint.manifest import Manifest, Provenance, leaf_specs
    from jobwarden.checkpoint.store import CheckpointStore
    from jobwarden.sdk.leaves import Flattener
    from jobwarden.tasks.mlp import MLP

    task = MLP(MLP.Train(width=width))
    state = jax.block_until_ready(task.init_state(task.data()))  # type: ignore[no-untyped-call]
    leaves = Flattener()(state)
    provenance = Provenance("c" * 64, "d" * 32, "s" * 64, {"backend": "cpu"}, 1)
    folder.mkdir(mode=0o700, parents=True)
    store = CheckpointStore(folder)
    walls: list[float] = []
    cpus: list[float] = []

    def commit(step: int) -> None:
        manifest = Manifest(
            "mlp",
            "bench",
            step,
            "threefry2x32",
            leaf_specs(leaves),
            {},
            provenance,
            "h" * 32,
            {},
            time.time(),
        )
        began, cpu = time.perf_counter(), time.thread_time()
        store.commit(step, manifest, leaves)
        walls.append(time.perf_counter() - began)
        cpus.append(time.thread_time() - cpu)
        store.retain(1)

    for step in range(1, repeats + 1):
        thread = threading.Thread(target=commit, args=(step,))
        thread.start()
        thread.join()
    return {"wall_s": walls, "cpu_s": cpus, "bytes": sum(a.nbytes for _, a in leaves)}


def main() -> None:
    """One run; prints its JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("none", "sync", "async", "orbax", "commit_cpu"))
    parser.add_argument("--repeats", type=int, default=7, help="commits, for commit_cpu")
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--folder", type=Path, required=True)
    args = parser.parse_args()
    if args.mode == "commit_cpu":
        print(json.dumps(commit_cpu(args.width, args.repeats, args.folder)))
        return
    print(json.dumps(run(args.mode, args.width, args.steps, args.folder)))


if __name__ == "__main__":
    main()
