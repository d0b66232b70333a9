"""One attempt of a job: restore or start, warm up, update, checkpoint, report.

The attempt holds its checkpoint directory's writer lock for its whole life.
SIGTERM is preemption: the update in flight finishes, the current step is
committed, ``preempted`` is emitted and the process exits with
`PreemptedExit.exit_status` (75).  A broken stdout means the supervisor is gone
and is treated the same way.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import jax
import jax.numpy as jnp

from jobwarden import state as state_tree
from jobwarden import testfaults
from jobwarden.checkpoint.format import Manifest, Provenance, leaf_specs
from jobwarden.checkpoint.lock import WriterLock
from jobwarden.checkpoint.store import CheckpointStore
from jobwarden.checkpoint.validate import Expected
from jobwarden.errors import (
    JobwardenError,
    PreemptedExit,
    ResumePolicyError,
    WorkerInternalError,
)
from jobwarden.events import Emitter, SupervisorGone
from jobwarden.hashing import config_hash, files_digest, leaves_digest, state_hash
from jobwarden.jobfile import Job
from jobwarden.tasks.base import State
from jobwarden.testfaults import Fault
from jobwarden.worker.faults import FaultPlan
from jobwarden.worker.runtime import SUPERVISOR_ENV, enable_compilation_cache, runtime_identity

PR_SET_PDEATHSIG = 1


class Preemption:
    """Records SIGTERM for the loop; the handler only sets a flag."""

    def __init__(self) -> None:
        self.requested = False
        self.reason = ""

    def install(self) -> None:
        """Route SIGTERM here and SIGUSR1 to a stack dump of every thread on stderr.

        Under a supervisor (``$JOBWARDEN_SUPERVISOR_PID``) the kernel also sends
        SIGTERM when the supervisor dies, so an orphaned worker commits and exits.
        """
        signal.signal(signal.SIGTERM, self._on_term)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        supervisor = os.environ.get(SUPERVISOR_ENV)
        if supervisor and supervisor.isdigit():
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != int(supervisor):
                self.requested, self.reason = True, "supervisor gone before start"

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        self.reason = "SIGTERM" if os.getppid() != 1 else "SIGTERM (supervisor gone)"


@dataclass
class TrainingRun:
    """The worker's fixed context for its step loop: job, store, emitter, expectations, faults.

    The daemon keeps its own record of each attempt; this is only the worker's side of one.
    """

    job: Job
    store: CheckpointStore
    emitter: Emitter
    expected: Expected
    faults: FaultPlan

    def commit(self, step: int, state: State, report: bool = True) -> Path:
        """Commit ``state`` at ``step``, apply retention and (unless told not to) report it."""
        leaves = state_tree.flatten(state)
        digest, components = state_hash(leaves, step)
        manifest = Manifest(
            task=self.job.task,
            job_id=self.job.id,
            step=step,
            key_impl=self.job.task_instance().key_impl,
            leaves=leaf_specs(leaves),
            train=self.expected.train,
            provenance=Provenance(
                config_hash=self.expected.config_hash,
                data_hash=self.expected.data_hash,
                source_hash=self.expected.source_hash,
                runtime=self.expected.runtime,
                writer_generation=self.expected.generation,
            ),
            state_hash=digest,
            components=components,
            created=time.time(),
        )
        began = time.perf_counter()
        path, size = self.store.commit(step, manifest, leaves, self.faults.commit_hook(step))
        seconds = time.perf_counter() - began
        self.store.retain(self.job.run.keep_checkpoints)
        if report:
            self.emitter.emit(
                "checkpoint",
                step=step,
                file=str(path),
                bytes=size,
                seconds=seconds,
                state_hash=digest,
            )
        return path


def source_files(job: Job) -> list[Path]:
    """The task module and this step loop: the code that defines an update."""
    return [*job.task_instance().source_files(), Path(__file__)]


def expected_for(job: Job, data: dict[str, Any], template: State, generation: int) -> Expected:
    """What a checkpoint must match to be restored by this attempt."""
    return Expected(
        task=job.task,
        train=job.train_fields(),
        config_hash=config_hash(job.task, job.train_fields()),
        data_hash=leaves_digest(state_tree.flatten(data)),
        source_hash=files_digest(source_files(job)),
        runtime=runtime_identity(),
        leaves=leaf_specs(state_tree.flatten(template)),
        max_step=job.run.steps,
        generation=generation,
    )


def run_attempt(
    job: Job,
    directory: Path,
    emitter: Emitter,
    lock: WriterLock,
    compile_cache: Path | None = None,
    *,
    signing_key: bytes | None = None,
) -> int:
    """Run one attempt holding ``lock`` (the directory's writer lock); returns the exit status.

    With ``signing_key`` checkpoints are signed and only correctly signed ones restored.
    """
    preemption = Preemption()
    preemption.install()
    try:
        store = CheckpointStore(directory, lock, signing_key)
        return _run(job, store, emitter, lock, compile_cache=compile_cache, preemption=preemption)
    except JobwardenError as error:
        return emitter.failed(error)
    except SupervisorGone:
        sys.stderr.write("jobwarden worker: stdout closed before any state existed; exiting\n")
        return PreemptedExit.exit_status
    except Exception as error:  # noqa: BLE001 - reported as worker.internal with its traceback
        trace = traceback.format_exc()
        sys.stderr.write(trace)
        internal = WorkerInternalError(
            f"{type(error).__name__}: {error}",
            exception=type(error).__name__,
            traceback=trace[-2000:],
        )
        return emitter.failed(internal)


def _run(
    job: Job,
    store: CheckpointStore,
    emitter: Emitter,
    lock: WriterLock,
    *,
    compile_cache: Path | None,
    preemption: Preemption,
) -> int:
    if compile_cache is not None:
        enable_compilation_cache(compile_cache)
    emitter.emit(
        "started",
        pid=os.getpid(),
        backend=jax.default_backend(),
        devices=[str(d) for d in jax.devices()],
        runtime=runtime_identity(),
        job=job.id,
        task=job.task,
        checkpoint_dir=str(store.directory),
        signing=store.signing_key is not None,
    )
    task = job.task_instance()
    data = task.data()
    template = task.init_state(data)
    expected = expected_for(job, data, template, lock.generation)
    directory = store.directory
    training = TrainingRun(job, store, emitter, expected, FaultPlan(job.faults, emitter))

    policy = job.run.resume
    if policy == "never" and store.committed():
        raise ResumePolicyError(
            f"resume = 'never' but {directory} already holds "
            f"{len(store.committed())} checkpoint(s)",
            directory=str(directory),
        )
    selection = store.select(expected)
    skipped = [s.as_record() for s in selection.skipped]
    if selection.checkpoint is None:
        if policy == "require":
            raise ResumePolicyError(
                f"resume = 'require' but {directory} holds no checkpoint", directory=str(directory)
            )
        state, step = template, 0
    else:
        restored = selection.checkpoint
        state = state_tree.unflatten_like(template, restored.arrays)
        step = restored.manifest.step
        if testfaults.active(Fault.ZERO_OPT_STATE_ON_RESTORE):
            state = {
                **state,
                "opt_state": jax.tree_util.tree_map(jnp.zeros_like, state["opt_state"]),
            }
        emitter.emit(
            "restored",
            step=step,
            file=str(restored.path),
            state_hash=restored.manifest.state_hash,
            components=dict(restored.manifest.components),
            checks=list(selection.checks),
            skipped=skipped,
            checksum=restored.checksum,
            writer_generation=restored.manifest.provenance.writer_generation,
        )

    update = jax.jit(task.update(data))
    began = time.perf_counter()
    jax.block_until_ready(update(state))  # type: ignore[no-untyped-call]
    start_hash, start_components = state_hash(state_tree.flatten(state), step)
    emitter.emit(
        "ready",
        step=step,
        warmup_s=time.perf_counter() - began,
        state_hash=start_hash,
        components=start_components,
        generation=lock.generation,
        quarantined=skipped,
    )

    committed_step = step if selection.checkpoint is not None else -1
    steps, every = job.run.steps, job.run.checkpoint_every
    try:
        while step < steps:
            if preemption.requested:
                if step > 0 and committed_step != step:
                    training.commit(step, state)
                emitter.emit("preempted", step=step, reason=preemption.reason)
                return PreemptedExit.exit_status
            training.faults.before_update(step)
            began = time.perf_counter()
            state, loss = update(state)
            jax.block_until_ready((state, loss))  # type: ignore[no-untyped-call]
            elapsed = time.perf_counter() - began
            step += 1
            fields: dict[str, Any] = {"state_hash": None}
            if step % job.run.hash_every == 0 or step == steps:
                digest, components = state_hash(state_tree.flatten(state), step)
                fields = {"state_hash": digest, "components": components}
            emitter.emit(
                "progress",
                step=step,
                loss=float(loss),
                examples=task.examples_per_update(),
                update_s=elapsed,
                **fields,
            )
            if step % every == 0 or step == steps:
                training.commit(step, state)
                committed_step = step
            training.faults.after_update(step)
    except SupervisorGone:
        if step > 0 and committed_step != step:
            training.commit(step, state, report=False)
        sys.stderr.write(f"jobwarden worker: stdout is gone; committed step {step} and exiting\n")
        return PreemptedExit.exit_status

    digest, components = state_hash(state_tree.flatten(state), step)
    emitter.emit(
        "completed",
        step=step,
        state_hash=digest,
        components=components,
        file=str(store.committed()[-1][1]) if store.committed() else "",
    )
    return 0
