"""Stall detection: a deadline on the phase an attempt is in, each phase with its own watch.

The phases, what marks them and how each watch is chosen are
`daemon.supervise.phases`'s.  Deadlines are timers on a monotonic clock (the
daemon's loop), re-armed as each event moves the attempt into a phase, so
detection is as late as the timer fires, a few milliseconds past the watch.
The clock is anything with the loop's ``time()`` and ``call_at()``, so tests
drive it by hand.  A plain program's heartbeat has no phases: after its
start-up, each beat re-arms the ``step`` watch (`StallWatch.alive`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from jobwarden.daemon.supervise.phases import RULES, Durations, StallPhase, history
from jobwarden.events import Event

P = StallPhase
AUTO_FLOOR_S = RULES[P.STEP].floor_s
"""The shortest automatic step watch."""
AUTO_FACTOR = RULES[P.STEP].factor
"""The automatic step watch, in multiples of the slowest update seen."""
COMMIT_MODES = ("sync", "background")
"""The values of a ``progress`` event's ``commit`` field: how the step is committed."""


class Timer(Protocol):
    """A scheduled callback that can be cancelled (`asyncio.TimerHandle`)."""

    def cancel(self) -> None:
        """Do not run the callback."""


class Clock(Protocol):
    """Monotonic time and timers: the asyncio loop, or a test's hand-driven clock."""

    def time(self) -> float:
        """Now, in seconds."""
        ...

    def call_at(self, when: float, callback: Callable[[], object], /) -> Timer:
        """Run ``callback`` at ``when``."""
        ...


def auto_timeout(slowest_gap_s: float) -> float:
    """The automatic step watch after a slowest update of ``slowest_gap_s``."""
    return RULES[P.STEP].timeout(slowest_gap_s)


class StallWatch:
    """The deadline of one attempt; calls ``on_stall(phase, gap_s)`` once it passes.

    ``explicit`` maps a phase to its job file setting (None or absent: learned);
    ``history`` is what the job's earlier attempts showed, read, never written.
    """

    def __init__(
        self,
        clock: Clock,
        on_stall: Callable[[StallPhase, float], None],
        explicit: Mapping[StallPhase, float | None] | None = None,
        history: Durations | None = None,
    ) -> None:
        self.clock = clock
        self.on_stall = on_stall
        self.explicit = dict(explicit or {})
        self.history = history or Durations()
        self.seen = Durations()
        """what this attempt has shown, phase by phase"""
        self.phase = P.STARTUP
        self.entered = self.since = clock.time()
        """when the phase began; ``since``: what its deadline counts from (a commit's start)"""
        self.timeout_s = 0.0
        """the deadline now armed, in seconds after ``since``"""
        self.total_steps: int | None = None
        self.last_step = 0
        self.restoring = False
        self.committed = -1
        self.commits: dict[int, tuple[float, bool]] = {}
        """commits announced and not yet reported: step -> (began, in the background)"""
        self._timer: Timer | None = None
        self._ended = False

    @property
    def slowest_gap_s(self) -> float:
        """The longest update seen (this attempt and the earlier ones), 0 before any."""
        return max(self.seen.longest.get(P.STEP, 0.0), self.history.longest.get(P.STEP, 0.0))

    def watch_s(self, phase: StallPhase) -> float:
        """The watch of ``phase`` now: its setting, else its rule over what was shown."""
        given = self.explicit.get(phase)
        if given is not None:
            return given
        shown = [d.longest[phase] for d in (self.history, self.seen) if phase in d.longest]
        return RULES[phase].timeout(max(shown) if shown else None)

    # ---- arming

    def _enter(
        self,
        phase: StallPhase,
        *,
        timeout_s: float | None = None,
        since: float | None = None,
        at_least_s: float = 0.0,
    ) -> None:
        now = self.clock.time()
        self._leave(now)
        self.cancel()
        self.phase, self.entered = phase, now
        self.since = now if since is None else since
        watch = self.watch_s(phase) if timeout_s is None else timeout_s
        self.timeout_s = max(watch, at_least_s)
        self._timer = self.clock.call_at(self.since + self.timeout_s, self._fire)

    def _leave(self, now: float) -> None:
        """Account the phase being left: its span, and its length to learn from."""
        phase, seconds = self.phase, now - self.entered
        self.seen.spent(phase, seconds)
        if phase is P.COMMIT or (phase is P.RESTORE and not self.restoring):
            return  # a commit is learned from its checkpoint; a fresh start is no restore
        self.seen.learn(phase, seconds)

    def _fire(self) -> None:
        self._timer = None
        self.on_stall(self.phase, self.gap())

    def start(self, timeout_s: float | None = None) -> None:
        """Arm the startup deadline (spawn until ``started``, or a plain program's first beat)."""
        self.phase, self.entered = P.STARTUP, self.clock.time()
        self.cancel()
        self.since = self.entered
        self.timeout_s = self.watch_s(P.STARTUP) if timeout_s is None else timeout_s
        self._timer = self.clock.call_at(self.since + self.timeout_s, self._fire)

    def alive(self, stall_timeout_s: float | None, at_least_s: float = 0.0) -> None:
        """A plain program's heartbeat: re-arm the step deadline, of ``stall_timeout_s``, or
        automatic when it is None; never shorter than ``at_least_s``."""
        self._enter(P.STEP, timeout_s=stall_timeout_s, at_least_s=at_least_s)

    # ---- the phases an event moves into

    def observe(self, event: Event) -> None:
        """Follow one event of a program that emits them into the phase it begins."""
        kind = event.kind
        if kind == "started":
            run = event.get("run")
            steps = run.get("steps") if isinstance(run, dict) else None
            self.total_steps = steps if isinstance(steps, int) else self.total_steps
            self._enter(P.RESTORE)
        elif kind == "restored":
            self.restoring = True
        elif kind == "ready":
            self.last_step = event["step"]
            self._enter(P.COMPILE)
        elif kind == "progress":
            self._progress(event)
        elif kind == "checkpoint":
            self._checkpoint(event["step"])
        elif kind == "completed":
            self._enter(P.FINAL)
        elif kind == "failed":
            self._enter(P.EXIT)

    def _progress(self, event: Event) -> None:
        step, mode = event["step"], event.get("commit")
        self.last_step = step
        if mode in COMMIT_MODES and step > self.committed:
            self.commits[step] = (self.clock.time(), mode == "background")
        self._next()

    def _checkpoint(self, step: int) -> None:
        self.committed = max(self.committed, step)
        now = self.clock.time()
        for done in [s for s in self.commits if s <= step]:
            began, _ = self.commits.pop(done)
            self.seen.learn(P.COMMIT, now - began)
        if self.phase is P.COMMIT and self.waited() is None:
            self._next()  # the training goes on; a background commit's report moves nothing

    def waited(self) -> float | None:
        """When the commit the training now waits on began; None when it waits on none.

        A synchronous commit holds it; a background one only once another
        must wait behind it, or the run ends with it in flight.
        """
        if not self.commits:
            return None
        total = self.total_steps
        ending = total is not None and self.last_step >= total
        background = all(behind for _, behind in self.commits.values())
        if background and len(self.commits) < 2 and not ending:
            return None
        return min(began for began, _ in self.commits.values())

    def _next(self) -> None:
        """After an update or a commit: a commit the training waits on, the last update, or
        the next one."""
        began = self.waited()
        if began is not None:
            self._enter(P.COMMIT, since=began)
            return
        total = self.total_steps
        self._enter(P.FINAL if total is not None and self.last_step + 1 >= total else P.STEP)

    # ---- reading

    def gap(self) -> float:
        """Seconds the phase has lasted (a commit's: since the commit began)."""
        return self.clock.time() - self.since

    def ended(self) -> Durations:
        """The attempt has ended: its phase left (once), what it showed in each phase."""
        self.cancel()
        if not self._ended:
            self._ended = True
            self._leave(self.clock.time())
        return self.seen

    def as_record(self) -> dict[str, Any]:
        """The phase now, how long it has lasted and its watch; every phase's durations in
        this attempt and the earlier ones, with the watch each would get now."""
        shown = Durations()
        shown.merge(self.history)
        shown.merge(self.seen)
        phases = shown.as_record()
        for phase in StallPhase:
            phases.setdefault(phase.value, {"longest_s": None, "total_s": None, "count": 0})
            phases[phase.value]["watch_s"] = round(self.watch_s(phase), 3)
            phases[phase.value]["explicit"] = self.explicit.get(phase) is not None
        return {
            "phase": self.phase.value,
            "for_s": round(self.gap(), 3),
            "watch_s": round(self.timeout_s, 3),
            "attempt": self.seen.as_record(),
            "phases": phases,
        }

    @property
    def armed(self) -> bool:
        """Whether a deadline is pending."""
        return self._timer is not None

    def cancel(self) -> None:
        """Disarm (the attempt ended)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def phases_status(watch: StallWatch | None, attempts: Path, number: int) -> dict[str, Any]:
    """``status JOB``'s ``phases``: the live attempt's watch (`StallWatch.as_record`), or,
    with none running, what the job's ended attempts showed of each phase."""
    if watch is not None:
        return watch.as_record()
    return {"phase": None, "phases": history(attempts, number + 1).as_record()}
