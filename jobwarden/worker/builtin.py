"""The built-in program: a job's `Task` driven by an SDK run, the product's one step loop.

The task gives the data, the initial complete state and a pure update; this
module jits the update, warms it up between restore and ``ready``, and reports
every update through `jobwarden.sdk.run.Run`.  Its source is hashed with the
task's and the SDK's (`jobwarden.sdk.provenance.SDK_SOURCES`): together they
are the code that defines an update.  JAX is imported only once the run holds
its writer lock.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobwarden import sdk
from jobwarden import statetree as state_tree
from jobwarden.hashing import leaves_digest
from jobwarden.jobfile import Job
from jobwarden.runtime import release_code_pages_once

if TYPE_CHECKING:
    from jobwarden.worker.warm import Warm


def source_files(job: Job) -> list[Path]:
    """The task's modules and this driver; the SDK adds its own step loop."""
    return [*job.task_instance().source_files(), Path(__file__)]


def run_job(
    job: Job,
    directory: Path,
    compile_cache: Path | None = None,
    signing_key: Path | None = None,
    warm: Warm | None = None,
) -> int:
    """Run one attempt of ``job`` on ``directory``; returns the exit status (docs/worker.md).

    ``warm``: the data and compiled update a warm spare prepared (`jobwarden.worker.spare`).
    """
    task = job.task_instance()
    data = functools.cache(task.data) if warm is None else (lambda: warm.data)

    def data_hash() -> str:
        return leaves_digest(state_tree.flatten(data()))

    run = sdk.attach(
        config=job.train_fields(),
        sources=source_files(job),
        data_hash=data_hash,
        name=job.task,
        job_id=job.id,
        checkpoint_dir=directory,
        **job.run.model_dump(),
        faults=job.faults,
        compile_cache=compile_cache,
        signing_key=signing_key,
        key_impl=task.key_impl,
        argv=[],
        environ={},
    )
    try:
        with run:
            update = task.update(data()) if warm is None else None
            step = None if warm is None else warm.step
            _train(run, task.init_state(data()), update, task.examples_per_update(), step)
    except sdk.RunEnded as ended:
        return ended.exit_status
    return 0


def _train(run: sdk.Run, init_state: Any, update: Any, examples: int, jitted: Any) -> None:
    import jax

    state = run.restore(init_state)
    step_fn = jax.jit(update) if jitted is None else jitted
    jax.block_until_ready(step_fn(state))  # type: ignore[no-untyped-call]
    release_code_pages_once(wait=True)  # compiled: what a crash's exit would free, let go now
    for step in run.steps(state):
        state, loss = step_fn(state)
        jax.block_until_ready((state, loss))  # type: ignore[no-untyped-call]
        run.progress(step, state, loss=float(loss), examples=examples)
