"""The phases of an attempt, the rule of each one's watch, and the durations a job has shown.

An attempt of a job that emits events moves through phases its events mark
(`daemon.stall.StallWatch` follows them):

| phase | from | until |
|---|---|---|
| ``startup`` | the spawn | ``started`` (interpreter, imports, writer lock, peers joined) |
| ``restore`` | ``started`` | ``ready`` (the restore, and the program's own set-up) |
| ``compile`` | ``ready`` | the first ``progress`` (the first update compiles the step) |
| ``step`` | an update's ``progress`` | the next one |
| ``commit`` | a ``progress`` whose ``commit`` field announces one | that commit's ``checkpoint`` |
| ``final`` | the update before the last one; ``completed`` | the last ``progress``; the exit |
| ``exit`` | ``failed`` | the exit |

A background commit (``[run] async_commit``) holds the training only when a
second one must wait for it, or the run ends with it in flight: only then is
the attempt in ``commit``, watched from the start of the commit it waits on.

Each phase's watch is its explicit ``[supervision]`` setting when the job
file gives one, else its `Rule`: ``default_s`` until the job has shown the
phase, then ``max(floor_s, factor x the longest it has shown)``, over this
attempt and the earlier ones (each attempt's durations are kept as
``phases.json`` in its folder, so a restarted daemon learns them again).  A
restore is learned only from attempts that restored a checkpoint: a fresh
start's few seconds say nothing of a large model's restore.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobwarden.daemon.store import evidence
from jobwarden.sections import SupervisionSection

PHASES_FILE = "phases.json"
SCHEMA = 1
HISTORY_ATTEMPTS = 50
"""How many of a job's latest attempts its history is read from at a daemon start."""


class StallPhase(enum.StrEnum):
    """What the watch is waiting for: the phase an attempt is in."""

    STARTUP = "startup"
    RESTORE = "restore"
    COMPILE = "compile"
    STEP = "step"
    COMMIT = "commit"
    FINAL = "final"
    EXIT = "exit"


P = StallPhase


@dataclass(frozen=True)
class Rule:
    """How long a phase may last when no setting says: a default before the job has shown
    the phase, then ``max(floor_s, factor x the longest seen)``."""

    default_s: float
    floor_s: float
    factor: float

    def timeout(self, longest: float | None) -> float:
        """The watch after a longest duration of ``longest`` (None: never seen)."""
        return self.default_s if longest is None else max(self.floor_s, self.factor * longest)


RULES: dict[StallPhase, Rule] = {
    P.STARTUP: Rule(60.0, 60.0, 3.0),
    P.RESTORE: Rule(600.0, 60.0, 3.0),
    P.COMPILE: Rule(600.0, 60.0, 3.0),
    P.STEP: Rule(60.0, 60.0, 10.0),
    P.COMMIT: Rule(300.0, 10.0, 10.0),
    P.FINAL: Rule(600.0, 60.0, 3.0),
    P.EXIT: Rule(60.0, 60.0, 3.0),
}
"""Why these: ``import jax`` takes under a second, so a start-up of 60 s is a hang, as it
has always been (``startup_timeout_s``); 600 s lets a first restore read 240 GB at the
slowest rate measured here (400 MB/s) and a first compile take ten minutes, and a restore
seen once then gets three times its length; an update keeps the rule it had, ten times
the slowest seen and never under a minute; a first commit gets 300 s (100 GB at
400 MB/s, synchronously), then ten times the longest, never under 10 s: a job whose
commits take a second has a hung one found in ten."""


AWAITED: dict[StallPhase, str] = {
    P.STARTUP: "started",
    P.RESTORE: "ready",
    P.COMPILE: "progress",
    P.STEP: "progress",
    P.COMMIT: "checkpoint",
    P.FINAL: "progress or exit",
    P.EXIT: "exit",
}
"""The event (or end) each phase waits for."""


def awaited(phase: StallPhase, emits_events: bool) -> str:
    """What a watch in ``phase`` waited for: an event, or a plain program's heartbeat."""
    return AWAITED[phase] if emits_events else "heartbeat"


def explicit_timeouts(supervision: SupervisionSection) -> dict[StallPhase, float | None]:
    """The watch each ``[supervision]`` field sets (None: learned by its `Rule`)."""
    return {
        P.STARTUP: supervision.startup_timeout_s,
        P.RESTORE: supervision.restore_timeout_s,
        P.COMPILE: supervision.compile_timeout_s,
        P.STEP: supervision.stall_timeout_s,
        P.COMMIT: supervision.commit_timeout_s,
        P.FINAL: supervision.final_timeout_s,
        P.EXIT: supervision.startup_timeout_s,
    }


@dataclass
class Durations:
    """What an attempt (or a job's attempts) spent in each phase, by phase name.

    ``longest`` is what a watch learns from: the longest instance of the phase
    (of a commit, from its announcement to its ``checkpoint`` event; of a
    restore, only where a checkpoint was restored); ``total_s`` and ``count``
    partition the attempt's time by the phase it was in.
    """

    longest: dict[str, float] = field(default_factory=dict)
    total_s: dict[str, float] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)

    def spent(self, phase: StallPhase, seconds: float) -> None:
        """One span of ``seconds`` in ``phase``."""
        self.total_s[phase] = self.total_s.get(phase, 0.0) + max(0.0, seconds)
        self.count[phase] = self.count.get(phase, 0) + 1

    def learn(self, phase: StallPhase, seconds: float) -> None:
        """One instance of ``phase`` that lasted ``seconds``."""
        self.longest[phase] = max(self.longest.get(phase, 0.0), seconds)

    def merge(self, other: Durations) -> None:
        """Add ``other``'s spans and instances to these."""
        for name, seconds in other.longest.items():
            self.longest[name] = max(self.longest.get(name, 0.0), seconds)
        for name, seconds in other.total_s.items():
            self.total_s[name] = self.total_s.get(name, 0.0) + seconds
        for name, count in other.count.items():
            self.count[name] = self.count.get(name, 0) + count

    def as_record(self) -> dict[str, Any]:
        """JSON-ready, by phase, rounded to the millisecond."""
        return {
            name.value: {
                "longest_s": _ms(self.longest.get(name)),
                "total_s": _ms(self.total_s.get(name)),
                "count": self.count.get(name, 0),
            }
            for name in StallPhase
            if name in self.longest or name in self.count
        }


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def from_record(record: Mapping[str, Any]) -> Durations:
    """`Durations.as_record`'s form read back (raises KeyError, TypeError or ValueError)."""
    out = Durations()
    for name, entry in record.items():
        phase = StallPhase(name)
        if entry["longest_s"] is not None:
            out.longest[phase] = float(entry["longest_s"])
        if entry["total_s"] is not None:
            out.total_s[phase] = float(entry["total_s"])
        out.count[phase] = int(entry["count"])
    return out


def save(folder: Path, durations: Durations) -> None:
    """Keep an ended attempt's durations in its folder (atomically; a failure is logged)."""
    evidence.keep(folder / PHASES_FILE, saved_text(durations))


def saved_text(durations: Durations) -> str:
    """The text `save` keeps of an attempt's durations."""
    return json.dumps({"schema": SCHEMA, "phases": durations.as_record()}, indent=2) + "\n"


def load(folder: Path) -> Durations | None:
    """An attempt's saved durations; None when it has none or they cannot be read."""
    try:
        document = json.loads((folder / PHASES_FILE).read_text())
        if document.get("schema") != SCHEMA:
            return None
        return from_record(document["phases"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def history(attempts: Path, before: int) -> Durations:
    """What a job's attempts before ``before`` showed (the latest `HISTORY_ATTEMPTS`)."""
    out = Durations()
    for number in range(max(1, before - HISTORY_ATTEMPTS), before):
        found = load(attempts / str(number))
        if found is not None:
            out.merge(found)
    return out
