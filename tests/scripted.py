"""A launcher whose attempts play scripts: a supervisor's world without processes.

`ScriptedLauncher` is a `Launcher` like any other: the daemon would load it
with ``--launcher tests.scripted:ScriptedLauncher`` (`launch.registry.load`),
with no change anywhere else.  Each `start` takes the next script planned for
the job (`ScriptedLauncher.plan`) and returns a `ScriptedAttempt`, which plays
it: the lines a worker writes on stdout (events encoded by the worker's own
`jobwarden.events.encode`), read through the launcher seam's own `pump`, then
an exit with a chosen status or signal.

The attempt runs in step with its reader, as if the pipe held one line: a
line is produced when the supervisor reads, so whatever the supervisor does
on an event (a kill on a replay mismatch, say) happens before the next line.
It records every signal, kill and stop it gets (`ScriptedAttempt.received`)
and reacts as the built-in worker does: SIGTERM commits and exits 75 after a
``preempted`` event (or is ignored, or kills, per `Script.on_term`), SIGUSR1
writes a stack dump into ``stderr.log`` and the run goes on, a kill ends it
at once with no further line.

Only `LaunchSpec.job_id`, ``attempt``, ``folder`` and ``stdout`` are read.
`Worker` builds the events of one experiment's run, as the worker emits them.
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobwarden.daemon.config import LaunchSettings
from jobwarden.daemon.launch.base import (
    ExitInfo,
    Launcher,
    LauncherError,
    LaunchSpec,
    OnEvent,
    OnMalformed,
    RunningAttempt,
    pump,
)
from jobwarden.errors import JobwardenError, PreemptedExit
from jobwarden.events import encode

PID_BASE = 4_000_000
"""Fake pids start here (beyond the kernel's usual pid range): nothing ever signals them."""
STACK_DUMP = (
    "Thread 0x00007f0000000001 (most recent call first):\n"
    '  File "train.py", line 42 in update\n'
    '  File "train.py", line 99 in main\n'
)
"""What the attempt writes into stderr.log on SIGUSR1, as faulthandler would."""


# ---- the steps of a script


@dataclass(frozen=True)
class Emit:
    """One event line on stdout, encoded as the worker encodes it (its ``time`` is now)."""

    kind: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class Line:
    """One raw line on stdout (a malformed event, or a plain program's output)."""

    text: str


@dataclass(frozen=True)
class Stderr:
    """Text appended to the attempt's ``stderr.log``."""

    text: str


@dataclass(frozen=True)
class Hang:
    """Stop producing output (a hung or busy worker) until a signal or kill ends the wait,
    or the test calls `ScriptedAttempt.release`; ``label`` names the instant for `reached`."""

    label: str = "hang"


@dataclass(frozen=True)
class Exit:
    """End with ``status`` (negative: killed by that signal) after running ``ran_s``."""

    status: int
    ran_s: float = 1.0


Step = Emit | Line | Stderr | Hang | Exit


@dataclass(frozen=True)
class Script:
    """One attempt's steps, and what it does on SIGTERM: ``preempt`` (commit, a
    ``preempted`` event, exit 75, as the worker), ``ignore``, or ``die`` (killed by it)."""

    steps: tuple[Step, ...]
    on_term: str = "preempt"

    def __post_init__(self) -> None:
        if self.on_term not in ("preempt", "ignore", "die"):
            raise ValueError(f"on_term is preempt, ignore or die, not {self.on_term!r}")


@dataclass(frozen=True)
class Refuse:
    """The launch itself fails: `ScriptedLauncher.start` raises ``error``."""

    error: Exception


Plan = Script | Refuse | Iterable[Step]


# ---- the events of one experiment, as the worker emits them


def digest(*parts: object) -> str:
    """A 128-bit hex digest, shaped as the worker's xxh3-128 state hashes are."""
    return hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=16).hexdigest()


@dataclass(frozen=True)
class Worker:
    """The events of one deterministic experiment (``seed``): the same seed gives the same
    state hash at every step, a different seed a different experiment."""

    seed: str = "a"
    steps: int = 8
    checkpoint_every: int = 2
    checkpoint_dir: str = "checkpoints/job"
    generation: int = 1

    def state_hash(self, step: int) -> str:
        """The full-state hash after ``step`` updates."""
        return digest(self.seed, "state", step)

    def components(self, step: int) -> dict[str, str]:
        """The digest of each state component after ``step`` updates."""
        return {name: digest(self.seed, name, step) for name in ("params", "opt_state", "key")}

    def file(self, step: int) -> str:
        """The committed checkpoint file of ``step``."""
        return f"{self.checkpoint_dir}/ckpt-{step:010d}.safetensors"

    def start(self, at: int = 0, *, skipped: tuple[dict[str, Any], ...] = ()) -> list[Step]:
        """``started``, then ``restored`` (when resuming at a step past 0), then ``ready``."""
        steps: list[Step] = [
            Emit(
                "started",
                {
                    "pid": 0,  # the attempt puts its own pid here
                    "backend": "cpu",
                    "devices": ["TFRT_CPU_0"],
                    "runtime": {"python": "3.11.7", "jax": "0.4.30", "backend": "cpu"},
                    "job": "job",
                    "task": "linreg",
                    "checkpoint_dir": self.checkpoint_dir,
                    "signing": False,
                    "checkpoints": "jobwarden",
                    "run": {"steps": self.steps, "checkpoint_every": self.checkpoint_every},
                    "faults": {},
                },
            )
        ]
        if at > 0:
            steps.append(
                Emit(
                    "restored",
                    {
                        "step": at,
                        "file": self.file(at),
                        "state_hash": self.state_hash(at),
                        "components": self.components(at),
                        "checks": ["checksum", "schema", "config", "data", "runtime", "tree"],
                        "skipped": list(skipped),
                        "checksum": digest(self.seed, "file", at),
                        "writer_generation": self.generation - 1,
                    },
                )
            )
        steps.append(
            Emit(
                "ready",
                {
                    "step": at,
                    "warmup_s": 0.05,
                    "state_hash": self.state_hash(at),
                    "components": self.components(at),
                    "generation": self.generation,
                    "quarantined": [],
                },
            )
        )
        return steps

    def updates(self, first: int, last: int) -> list[Step]:
        """``progress`` for each step from ``first`` to ``last``, with a ``checkpoint`` after
        each step the cadence commits (every ``checkpoint_every``, and the last step), whose
        ``progress`` announces it (``commit``)."""
        steps: list[Step] = []
        for step in range(first, last + 1):
            committed = step % self.checkpoint_every == 0 or step == self.steps
            steps.append(
                Emit(
                    "progress",
                    {
                        "step": step,
                        "loss": 1.0 / step,
                        "examples": 32,
                        "update_s": 0.01,
                        "state_hash": self.state_hash(step),
                        "components": self.components(step),
                        **({"commit": "sync"} if committed else {}),
                    },
                )
            )
            if committed:
                steps.append(
                    Emit(
                        "checkpoint",
                        {
                            "step": step,
                            "file": self.file(step),
                            "bytes": 4096,
                            "seconds": 0.002,
                            "blocked_s": 0.002,
                            "background": False,
                            "state_hash": self.state_hash(step),
                        },
                    )
                )
        return steps

    def completed(self) -> list[Step]:
        """``completed`` at the last step, then exit 0."""
        last = self.steps
        fields = {
            "step": last,
            "state_hash": self.state_hash(last),
            "components": self.components(last),
            "file": self.file(last),
        }
        return [Emit("completed", fields), Exit(0)]

    def run(self, at: int = 0) -> list[Step]:
        """A whole healthy attempt from step ``at``: start, every update, completion."""
        return [*self.start(at), *self.updates(at + 1, self.steps), *self.completed()]

    @staticmethod
    def failed(error: type[JobwardenError], message: str) -> list[Step]:
        """A refusal as the worker reports it: a ``failed`` event, then its exit status."""
        fields = {"code": error.code, "message": message, "exit_status": error.exit_status}
        return [Emit("failed", fields), Exit(error.exit_status)]


# ---- the attempt and the launcher


class _Pipe:
    """The attempt's stdout as `pump` reads it: each read plays the script on to its next
    line (empty bytes at the exit)."""

    def __init__(self, attempt: ScriptedAttempt) -> None:
        self.attempt = attempt

    async def read(self, _: int = -1) -> bytes:
        return await self.attempt._next_output()


class ScriptedAttempt(RunningAttempt):
    """One attempt playing its `Script`; what it was sent is in `received`."""

    def __init__(self, spec: LaunchSpec, script: Script, pid: int) -> None:
        super().__init__(spec)
        self.script = script
        self._pid = pid
        self.received: list[str] = []
        """Every signal (``SIGTERM``...), ``kill`` and ``stop(<grace>)``, in order."""
        self.resources: dict[str, Any] = {}
        """What `sample` reports (``rss_mb``, ``status``, ``cpu_s``...): the test sets it."""
        self.step = 0
        """The last update it reported."""
        self.committed = 0
        """The last step it committed (a ``checkpoint`` event)."""
        self.exit: Exit | None = None
        self._state_hash: str | None = None
        self._steps = deque(script.steps)
        self._ending: list[Step] | None = None
        self._closing = False
        self._wake = asyncio.Event()
        self._labels: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)

    @property
    def pid(self) -> int:
        """A fake pid, unique in its launcher."""
        return self._pid

    @property
    def running(self) -> bool:
        """Whether it has not exited yet."""
        return self.exit is None

    async def reached(self, label: str = "hang") -> None:
        """Return once the script has come to the `Hang` called ``label``."""
        await self._labels[label].wait()

    def release(self) -> None:
        """End the current `Hang`: the script goes on."""
        self._wake.set()

    # -- the launcher seam

    async def follow(self, on_event: OnEvent, on_malformed: OnMalformed) -> ExitInfo:
        """Pump stdout (every byte kept in `events`) until the exit; then how it ended."""
        await pump(_Pipe(self), self.events, on_event, on_malformed)
        ended = self.exit or Exit(0)
        return self._ended(ExitInfo.from_status(ended.status, ended.ran_s))

    def signal(self, signum: int) -> None:
        """Record ``signum`` and react as the worker does, if it still runs."""
        if not self.running:
            return
        name = signal.Signals(signum).name
        self.received.append(name)
        if signum == signal.SIGUSR1:
            self._stderr(STACK_DUMP)
        elif signum == signal.SIGTERM and self.script.on_term == "preempt":
            self._end([*self._commit_now(), Exit(PreemptedExit.exit_status)])
        elif signum == signal.SIGTERM and self.script.on_term == "die":
            self._end([Exit(-signal.SIGTERM)])

    def kill(self) -> None:
        """Record the kill and end at once: no further line is written."""
        if not self.running:
            return
        self.received.append("kill")
        self._end([Exit(-signal.SIGKILL)], at_once=True)

    async def stop(self, grace_s: float) -> None:
        """Record the stop, then stop as every attempt does (SIGTERM, grace, kill)."""
        if self.running:
            self.received.append(f"stop({grace_s:g})")
        await super().stop(grace_s)

    def sample(self) -> dict[str, Any]:
        """The figures the test set in `resources`."""
        return dict(self.resources)

    # -- playing

    def _commit_now(self) -> list[Step]:
        """What the worker does on SIGTERM once its update is done: commit the current step
        (unless it is committed already), then report the preemption."""
        steps: list[Step] = []
        if self.step > self.committed and self._state_hash is not None:
            fields = {
                "step": self.step,
                "file": f"ckpt-{self.step:010d}.safetensors",
                "bytes": 4096,
                "seconds": 0.002,
                "blocked_s": 0.002,
                "background": False,
                "state_hash": self._state_hash,
            }
            steps.append(Emit("checkpoint", fields))
        steps.append(Emit("preempted", {"step": self.step, "reason": "SIGTERM"}))
        return steps

    def _end(self, steps: list[Step], at_once: bool = False) -> None:
        """Replace what is left of the script with ``steps``: once, unless ``at_once`` (a
        kill overrides an end already under way)."""
        if not self._closing or at_once:
            self._closing = True
            self._ending = steps
        self._wake.set()

    def _stderr(self, text: str) -> None:
        with (self.spec.folder / "stderr.log").open("a", encoding="utf-8") as stream:
            stream.write(text)

    def _line(self, step: Emit | Line) -> bytes:
        if isinstance(step, Line):
            return step.text.encode() + b"\n"
        fields = dict(step.fields)
        if step.kind == "started":
            fields["pid"] = self.pid
        if step.kind == "progress":
            self.step, self._state_hash = fields["step"], fields["state_hash"]
        elif step.kind == "checkpoint":
            self.committed = fields["step"]
        return encode(step.kind, fields).encode()

    async def _next_output(self) -> bytes:
        while self.exit is None:
            await asyncio.sleep(0)  # a turn of the loop between two lines, as a pipe gives
            if self._ending is not None:
                self._steps, self._ending = deque(self._ending), None
            step = self._steps.popleft() if self._steps else Exit(0)
            if isinstance(step, Exit):
                self.exit = step
            elif isinstance(step, Emit | Line):
                return self._line(step)
            elif isinstance(step, Stderr):
                self._stderr(step.text)
            else:  # a Hang: nothing more until a signal, a kill or `release`
                self._labels[step.label].set()
                self._wake.clear()
                await self._wake.wait()
        return b""


class ScriptedLauncher(Launcher):
    """Starts each attempt of a job as the next script planned for it."""

    name = "scripted"

    def __init__(self, settings: LaunchSettings | None = None) -> None:
        super().__init__(settings)
        self.plans: defaultdict[str, deque[Script | Refuse]] = defaultdict(deque)
        self.attempts: list[ScriptedAttempt] = []
        self.specs: list[LaunchSpec] = []
        """Every spec `start` was given, refused ones included."""
        self._started = asyncio.Event()

    def plan(self, job_id: str, *plans: Plan) -> None:
        """Queue one plan per coming attempt of ``job_id``: a `Script`, its steps, or `Refuse`."""
        for item in plans:
            planned = item if isinstance(item, Script | Refuse) else Script(tuple(item))
            self.plans[job_id].append(planned)

    async def start(self, spec: LaunchSpec) -> ScriptedAttempt:
        """Play the next plan of the job; raises `LauncherError` when none is left."""
        self.specs.append(spec)
        queued = self.plans.get(spec.job_id)
        if not queued:
            raise LauncherError(f"no script left for attempt {spec.attempt} of job {spec.job_id}")
        item = queued.popleft()
        if isinstance(item, Refuse):
            raise item.error
        Path(spec.folder).mkdir(mode=0o700, parents=True, exist_ok=True)
        attempt = ScriptedAttempt(spec, item, PID_BASE + len(self.attempts) + 1)
        self.attempts.append(attempt)
        self._started.set()
        return attempt

    def of(self, job_id: str) -> list[ScriptedAttempt]:
        """The attempts started for ``job_id``, in order."""
        return [a for a in self.attempts if a.spec.job_id == job_id]

    async def attempt(self, job_id: str, number: int) -> ScriptedAttempt:
        """Attempt ``number`` of ``job_id``, once it has started."""
        while len(found := self.of(job_id)) < number:
            self._started.clear()
            await self._started.wait()
        return found[number - 1]
