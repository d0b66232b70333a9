"""Entering and leaving an attached run: settings, writer lock, signals, runtime, outcome.

`Session` holds what one attempt of a program's run knows; `jobwarden.sdk.run.Run`
adds the step loop on top.  Opening follows the worker's order, so a refusal
costs nothing it need not: settings (``job.invalid``), signing key, writer
lock (``writer.locked``, ``checkpoint.directory_unsafe``), signal handlers, the
CPU pins, the compilation cache (``worker.cache_unsafe``), then ``started``.
JAX is first imported after the lock is held.  Leaving emits ``failed`` for an
exception and raises `RunEnded` with the exit status of docs/worker.md unless
the run completed.
"""

from __future__ import annotations

import enum
import os
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from jobwarden.checkpoint.lock import WriterLock
from jobwarden.checkpoint.signing import load_key
from jobwarden.checkpoint.store import CheckpointStore
from jobwarden.checkpoint.validate import Expected
from jobwarden.errors import JobwardenError, WorkerInternalError
from jobwarden.events import human
from jobwarden.hashing import Leaves, StateHasher
from jobwarden.jobfile import FaultSection
from jobwarden.runtime import enable_compilation_cache, pin_before_start, runtime_identity
from jobwarden.sdk.commits import Committer
from jobwarden.sdk.distributed import Membership
from jobwarden.sdk.external import PendingSaves, unfinished_warning
from jobwarden.sdk.faults import FaultPlan
from jobwarden.sdk.leaves import Flattener, Snapshot, UsageError
from jobwarden.sdk.provenance import Identity, data_identity, normalize_config, source_paths
from jobwarden.sdk.settings import RUN_FILE_ENV, Request, Settings, resolve, split_argv
from jobwarden.sdk.signals import Preemption
from jobwarden.sdk.spare import SpareWait
from jobwarden.sdk.stream import EventStream, RunEmitter

__all__ = ["Phase", "RunEnded", "Session", "UsageError"]


class RunEnded(SystemExit):
    """Raised on leaving a run that did not complete; its ``exit_status`` ends the process.

    A `SystemExit`, so an uncaught one exits with the documented status
    (docs/worker.md: 10 for ``fail_after``, 75 for preemption, 25 for a changed
    training field...) and ``except Exception`` in the program does not catch it.
    """

    def __init__(self, exit_status: int) -> None:
        super().__init__(exit_status)
        self.exit_status = exit_status


class Phase(enum.Enum):
    """Where a run is: outside its ``with``, entered, restored (start state known), stepping."""

    CLOSED = "closed"
    ENTERED = "entered"
    RESTORED = "restored"
    STEPPING = "stepping"


class Session:
    """One attempt of a program's run: its settings, identity, lock, signals and event stream."""

    settings: Settings
    identity: Identity

    def __init__(self, request: Request) -> None:
        self.request = request
        self.emitter = RunEmitter(sys.stdout)
        self.preemption = Preemption()
        self.faults = FaultPlan(FaultSection(), self.emitter)
        self.member = Membership()
        self.runtime: dict[str, str] = {}
        self.generation: int | None = None
        self.start_step = 0
        self.completed = False
        self._stream: EventStream | None = None
        self._lock: WriterLock | None = None
        self._store: CheckpointStore | None = None
        self._committer: Committer | None = None
        self._saves = PendingSaves()
        self._expected: Expected | None = None
        self._key_impl = request.key_impl or ""
        self._quarantined: list[dict[str, str]] = []
        self._status: int | None = None
        self._phase = Phase.CLOSED
        self._mark = time.perf_counter()
        self._step = 0
        self._state: Any = None
        self._pending: int | None = None
        self._yielded_at = 0.0
        self._committed = -1
        self._hashed: tuple[int, str, dict[str, str]] = (-1, "", {})
        self._state_hash = StateHasher()
        self._flatten: Flattener | None = None
        self._options: dict[str, str] = {}
        self._signing = False
        self._spare: SpareWait | None = None
        """Set in a spare until its hand-off (`jobwarden.sdk.spare`)."""
        self._began = time.perf_counter()

    def __enter__(self) -> Self:
        try:
            self._open()
        except BaseException as error:
            status = self._report(error)
            self._close()
            if status is None:
                raise
            raise RunEnded(status) from None
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        error = self._settle_on_exit(error)
        status = self._report(error) if error is not None else self._status
        self._close()
        if error is not None and status is None:
            return
        if status:
            self.member.leave(status)
            raise RunEnded(status) from None

    def checkpointer(self, checkpointer: Any) -> Any:
        """Have the run wait for the program's own checkpointer whenever it stops; returns it.

        ``checkpointer``: an object with ``wait_until_finished()`` (Orbax's
        `CheckpointManager`) or a function that waits.  Before ``completed``,
        ``preempted`` or ``failed`` and before the run is left, its save in
        flight finishes, so a drill's ``fail_after`` never abandons one.
        """
        self._saves.add(checkpointer)
        return checkpointer

    def _settle(self) -> None:
        """Wait for the commit in flight (raising its error), and for the program's own
        checkpointers' saves: the run is about to stop."""
        if self._committer is not None:
            self._committer.settle()
            self._committed = max(self._committed, self._committer.committed)
        self._saves.wait()

    def _settle_on_exit(self, error: BaseException | None) -> BaseException | None:
        """Leaving the run: the commit in flight finishes first; the error to report."""
        try:
            self._settle()
        except Exception as failed:  # noqa: BLE001 - reported below; the first error wins
            return error if error is not None else failed
        finally:
            external = self._store is None
            warning = unfinished_warning(self.settings.checkpoint_dir) if external else ""
            if warning:
                self.stderr(warning)
        return error

    def _report(self, error: BaseException) -> int | None:
        """Emit ``failed`` for ``error``; its exit status, None for what must propagate."""
        if isinstance(error, JobwardenError):
            return self.emitter.failed(error)
        if not isinstance(error, Exception):
            return None  # KeyboardInterrupt, SystemExit: the program's own way out
        trace = "".join(traceback.format_exception(error))
        self.stderr(trace)
        internal = WorkerInternalError(
            f"{type(error).__name__}: {error}",
            exception=type(error).__name__,
            traceback=trace[-2000:],
        )
        return self.emitter.failed(internal)

    @property
    def total_steps(self) -> int:
        """The step the run ends at (``[run] steps``)."""
        return self.settings.run.steps

    @property
    def checkpoint_every(self) -> int:
        """The commit cadence in updates (``[run] checkpoint_every``); an external
        checkpointer saves on it too, so a drill's restore points are where it expects."""
        return self.settings.run.checkpoint_every

    @property
    def keep_checkpoints(self) -> int:
        """How many committed checkpoints retention keeps (``[run] keep_checkpoints``)."""
        return self.settings.run.keep_checkpoints

    @property
    def hash_every(self) -> int:
        """The state hash cadence in updates (``[run] hash_every``)."""
        return self.settings.run.hash_every

    @property
    def job_id(self) -> str:
        """The job's id: the supervisor's, else ``job_id=``, else the program's name."""
        return self.identity.job_id

    @property
    def checkpoint_dir(self) -> Path | None:
        """The checkpoint directory this run holds the writer lock of, if any."""
        self._hand_off()  # a spare's wait ends here: what follows may touch the directory
        return self.settings.checkpoint_dir

    @property
    def preempted(self) -> bool:
        """Whether the loop stopped for SIGTERM or a vanished reader (leaving exits 75)."""
        return self._status == 75

    def emit(self, kind: str, **fields: Any) -> None:
        """Write one event (dropped once nobody reads)."""
        self._hand_off()
        self.emitter.emit(kind, **fields)

    @staticmethod
    def stderr(text: str) -> None:
        """Human output, for the log beside the events (never fatal: `events.human`)."""
        human(text)

    def _open(self) -> None:
        request = self.request
        environ = os.environ if request.environ is None else request.environ
        events = None if RUN_FILE_ENV in environ else request.events  # a supervisor reads stdout
        self._stream = stream = EventStream.open(events, redirect_prints=request.redirect_prints)
        self.emitter = stream.emitter
        self.faults = FaultPlan(FaultSection(), self.emitter)
        argv = sys.argv[1:] if request.argv is None else list(request.argv)
        self._options, rest = split_argv(argv)
        if request.argv is None:
            sys.argv[1:] = rest
        self._resolve(environ)
        if request.environ is None and events is None and SpareWait.wanted(environ):
            self._runtime()  # a spare: what does not depend on the run's identity, no lock
            data_files = [Path(p).resolve() for p in request.data_files or ()]
            self._spare = SpareWait(stream.raw, self.identity.sources, data_files)
            if SpareWait.member(environ):  # it joins the others before any JAX computation
                self._hand_off()
        else:
            self._writer()
            self._runtime()
            self._started()
        self._phase = Phase.ENTERED
        self._mark = time.perf_counter()

    def _resolve(self, environ: Mapping[str, str]) -> None:
        """The settings and the identity, from the run file, command line and arguments."""
        request = self.request
        self.settings = settings = resolve(
            checkpoint_dir=request.checkpoint_dir,
            run=request.run,
            faults=request.faults,
            compile_cache=request.compile_cache,
            signing_key=request.signing_key,
            job_id=request.job_id,
            options=self._options,
            environ=environ,
            checkpoints=request.checkpoints,
        )
        name = request.name or (Path(request.sources[0]).stem if request.sources else "program")
        self.identity = Identity(
            name=name,
            job_id=settings.job_id or name,
            train=normalize_config(request.config),
            sources=tuple(source_paths(request.sources)),
            data_hash=data_identity(request.data, request.data_hash, request.data_files),
        )

    def _hand_off(self) -> None:
        """In a spare, at the first call that needs the run's identity: wait for the attempt,
        check the spare is what a cold start would be, then open the run as one would."""
        spare, self._spare = self._spare, None
        if spare is None:
            return
        handoff = spare.wait(time.perf_counter() - self._began)
        problems = spare.changed(self.settings.checkpoint_dir)
        if problems:
            spare.refuse(problems)
        assert self._stream is not None
        spare.take_over(handoff, self._stream.redirected)
        self._resolve(os.environ)  # the attempt's run file: its job, faults, checkpoints
        self._writer()
        self._started()
        self._mark = time.perf_counter()

    def _writer(self) -> None:
        """The signing key, the writer lock and the store, the signal handlers and faults."""
        settings = self.settings
        external = self.request.checkpoints == "external"
        key = None
        if settings.signing_key is not None and not external:
            key = load_key(settings.signing_key)
        self._signing = key is not None
        self.member = member = Membership.from_environ()
        if settings.checkpoint_dir is not None and member.writes:  # one writer per job
            self._lock = WriterLock(settings.checkpoint_dir).acquire()
            self.generation = self._lock.generation
            if not external:
                self._store = store = CheckpointStore(settings.checkpoint_dir, self._lock, key)
                run = settings.run
                self._committer = Committer(
                    store, self.emitter, run.keep_checkpoints, run.async_commit
                )
        self.preemption.install()
        self.faults = FaultPlan(member.faults(settings.faults), self.emitter)
        self.faults.arm()

    def _runtime(self) -> None:
        """The CPU pins, JAX (after the lock, unless a spare) and the compilation cache."""
        if warning := pin_before_start(exact=self.settings.run.exact):
            self.stderr(warning + "\n")
        import jax  # noqa: F401

        if self.settings.compile_cache is not None:
            enable_compilation_cache(self.settings.compile_cache)

    def _started(self) -> None:
        """Join the other members, then say ``started``."""
        import jax

        settings, member = self.settings, self.member
        member.join()
        self.runtime = member.runtime(runtime_identity())
        self.emit(
            "started",
            pid=os.getpid(),
            backend=jax.default_backend(),
            devices=[str(d) for d in jax.devices()],
            runtime=self.runtime,
            job=self.identity.job_id,
            task=self.identity.name,
            checkpoint_dir=str(settings.checkpoint_dir or ""),
            signing=self._signing,
            checkpoints=self.request.checkpoints,
            run=settings.run.model_dump(),
            faults=settings.faults.model_dump(),
            **({"process": member.index, "processes": member.processes} if member.group else {}),
        )

    def _close(self) -> None:
        self._phase = Phase.CLOSED
        self.faults.disarm()
        self.preemption.uninstall()
        if self._lock is not None:
            self._lock.release()
        if self._stream is not None:
            self._stream.close()

    def _named(self, state: Any) -> Snapshot:
        if self._flatten is None:
            self._flatten = Flattener()
        return self._flatten.named(state)

    def _leaves(self, state: Any) -> Leaves:
        return self._named(state).leaves()

    def _before_start(self, what: str) -> None:
        if self._phase is not Phase.ENTERED:
            raise UsageError(f"{what} comes at most once, inside the run, before run.steps()")

    def _started_at(self, step: int, *, restored: bool) -> None:
        self.start_step = self._step = step
        self._committed = step if restored else -1
        self._phase = Phase.RESTORED
        self._mark = time.perf_counter()

    def _begin(self, state: Any) -> None:
        if self._phase is Phase.STEPPING:
            raise UsageError("run.steps() is called once per run")
        if self._store is not None and self._phase is not Phase.RESTORED:
            raise UsageError("call run.restore(init_state) before run.steps()")
        if self._phase not in (Phase.ENTERED, Phase.RESTORED):
            raise UsageError("run.steps() runs inside the run (`with jw.attach(...) as run:`)")
        warmup = time.perf_counter() - self._mark
        self._state, self._phase = state, Phase.STEPPING
        digest, components = self._state_hash(self._leaves(state), self._step)
        self._hashed = (self._step, digest, components)
        self.emit(
            "ready",
            step=self._step,
            warmup_s=warmup,
            state_hash=digest,
            components=components,
            generation=self.generation,
            quarantined=self._quarantined,
        )
