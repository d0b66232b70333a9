"""What the dashboard reads from the daemon, through its control socket alone.

This is the one module that knows the field names of the daemon's answers: each
answer is turned here into a frozen view object, so a renamed field is a change of
one line here and none in the pages.  Nothing here writes to the daemon: the
commands asked are ``status``, ``incidents``, ``runbook``, ``checkpoints``,
``events`` and ``tail``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobwarden.control.client import request

MAX_EVENT_PAGES = 50
"""``events`` answers read for one job's loss curves at most (2,000 lines each)."""


@dataclass(frozen=True)
class JobRow:
    """One line of the jobs table."""

    id: str
    state: str
    attempt: int
    step: int
    steps: int | None
    progress_age_s: float | None
    restarts_without_progress: int
    time_lost_s: float
    incidents: int


@dataclass(frozen=True)
class Health:
    """The daemon's own health, from the totals of a ``status`` answer."""

    pid: int | None
    version: str
    uptime_s: float
    jobs: int
    states: dict[str, int]
    needs_attention: int
    rejected: int

    @property
    def backlog(self) -> int:
        """Jobs waiting in the queue for an attempt."""
        return self.states.get("queued", 0)


@dataclass(frozen=True)
class Table:
    """One ``status`` answer: every job's row and the daemon's health."""

    rows: tuple[JobRow, ...]
    health: Health


@dataclass(frozen=True)
class Transition:
    """One move of a job's state machine."""

    time: float
    source: str | None
    target: str
    reason: str
    incident: str | None


@dataclass(frozen=True)
class Goodput:
    """A job's wall time: productive seconds and the badput by cause."""

    ratio: float | None
    wall_s: float
    productive_s: float
    badput_s: dict[str, float]


@dataclass(frozen=True)
class Member:
    """One process of a multi-process job's live attempt."""

    process: int
    pid: int | None
    step: int
    progress_age_s: float | None


@dataclass(frozen=True)
class JobDetail:
    """``status JOB``: the row, the history, the goodput and the live members."""

    row: JobRow
    reason: str
    task: str | None
    history: tuple[Transition, ...]
    goodput: Goodput | None
    members: tuple[Member, ...]


@dataclass(frozen=True)
class Check:
    """One replay check of a recovery: the logged hash against the one found."""

    step: int
    what: str
    logged: str | None
    found: str | None
    ok: bool


@dataclass(frozen=True)
class Incident:
    """An incident's latest record, the parts a page shows."""

    id: str
    job: str
    kind: str
    status: str
    opened: float
    attempt: int | None
    symptom: str
    outcome: str
    evidence: tuple[str, ...]
    """The names of the evidence kept (``stderr``, ``events``...)."""
    verdict: str | None
    checks: tuple[Check, ...]

    @property
    def first_divergence(self) -> Check | None:
        """The first replay check that did not reproduce its logged hash."""
        return next((check for check in self.checks if not check.ok), None)


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint file and its verdict."""

    name: str
    step: int | None
    bytes: int | None
    created: float | None
    where: str
    ok: bool
    verdict: str


@dataclass(frozen=True)
class Curve:
    """The losses one attempt logged, by update."""

    attempt: int
    points: tuple[tuple[int, float], ...]


def job_row(fields: dict[str, Any]) -> JobRow:
    """A full status row (``rows: true`` or ``status JOB``) as a `JobRow`."""
    return JobRow(
        id=str(fields["id"]),
        state=str(fields["state"]),
        attempt=int(fields.get("attempt") or 0),
        step=int(fields.get("step") or 0),
        steps=fields.get("steps"),
        progress_age_s=fields.get("last_progress_age_s"),
        restarts_without_progress=int(fields.get("restarts_without_progress") or 0),
        time_lost_s=float(fields.get("time_lost_s") or 0.0),
        incidents=len(fields.get("incidents") or ()),
    )


def health(answer: dict[str, Any]) -> Health:
    """The daemon part and totals of a ``status`` answer."""
    daemon, totals = answer.get("daemon") or {}, answer.get("totals") or {}
    return Health(
        pid=daemon.get("pid"),
        version=str(daemon.get("version", "?")),
        uptime_s=float(daemon.get("uptime_s") or 0.0),
        jobs=int(totals.get("jobs") or 0),
        states=dict(totals.get("states") or {}),
        needs_attention=int(totals.get("needs_attention") or 0),
        rejected=int(totals.get("rejected") or 0),
    )


def transition(entry: dict[str, Any]) -> Transition:
    """One entry of a job's ``history``."""
    return Transition(
        time=float(entry.get("time") or 0.0),
        source=entry.get("from"),
        target=str(entry.get("to")),
        reason=str(entry.get("reason", "")),
        incident=entry.get("incident"),
    )


def goodput(record: dict[str, Any] | None) -> Goodput | None:
    """A ``goodput`` record, or None while the daemon is still reading the events."""
    if not record:
        return None
    return Goodput(
        ratio=record.get("goodput"),
        wall_s=float(record.get("wall_s") or 0.0),
        productive_s=float(record.get("productive_s") or 0.0),
        badput_s={str(k): float(v) for k, v in (record.get("badput_s") or {}).items()},
    )


def member(view: dict[str, Any]) -> Member:
    """One entry of ``members``."""
    return Member(
        process=int(view.get("process") or 0),
        pid=view.get("pid"),
        step=int(view.get("step") or 0),
        progress_age_s=view.get("progress_age_s"),
    )


def incident(record: dict[str, Any]) -> Incident:
    """An incident record."""
    verification = record.get("verification") or {}
    return Incident(
        id=str(record["id"]),
        job=str(record.get("job", "")),
        kind=str(record.get("kind", "")),
        status=str(record.get("status", "")),
        opened=float(record.get("opened") or 0.0),
        attempt=record.get("attempt"),
        symptom=str(record.get("symptom", "")),
        outcome=str(record.get("outcome") or ""),
        evidence=tuple(str(name) for name in record.get("evidence") or {}),
        verdict=verification.get("verdict"),
        checks=tuple(
            Check(
                step=int(check.get("step") or 0),
                what=str(check.get("what", "")),
                logged=check.get("logged"),
                found=check.get("found"),
                ok=bool(check.get("ok")),
            )
            for check in verification.get("checks") or ()
        ),
    )


def checkpoint(entry: dict[str, Any]) -> Checkpoint:
    """One entry of a ``checkpoints`` answer."""
    verdict = entry.get("verdict") or {}
    return Checkpoint(
        name=Path(str(entry.get("file", "?"))).name,
        step=entry.get("step"),
        bytes=entry.get("bytes"),
        created=entry.get("created"),
        where=str(entry.get("where", "")),
        ok=bool(verdict.get("ok")),
        verdict=str(verdict.get("message", "")),
    )


def curves(events: list[dict[str, Any]]) -> tuple[Curve, ...]:
    """The loss of every ``progress`` event, one curve per attempt."""
    points: dict[int, list[tuple[int, float]]] = {}
    for event in events:
        loss = event.get("loss")
        if event.get("event") == "progress" and isinstance(loss, int | float):
            points.setdefault(int(event.get("attempt") or 0), []).append(
                (int(event.get("step") or 0), float(loss))
            )
    return tuple(Curve(attempt, tuple(found)) for attempt, found in sorted(points.items()))


def tail_line(line: dict[str, Any]) -> str:
    """One line of a ``tail`` answer as text: stderr as written, an event as its fields."""
    if "line" in line and len(line) <= 2:
        return str(line["line"])
    return " ".join(f"{key}={value}" for key, value in line.items() if key != "components")


class Source:
    """The daemon behind one control socket, asked one request at a time."""

    def __init__(self, socket: Path, timeout: float = 10.0) -> None:
        self.socket = socket
        self.timeout = timeout
        self.requests = 0
        """Requests sent so far: what the dashboard has cost the daemon."""

    def ask(self, cmd: str, **args: Any) -> Any:
        """One request; its answer."""
        self.requests += 1
        return request(self.socket, cmd, self.timeout, **args)

    def table(self) -> Table:
        """Every job's row and the daemon's health: one ``status`` request."""
        answer = self.ask("status", rows=True)
        return Table(tuple(job_row(fields) for fields in answer["jobs"]), health(answer))

    def job(self, job_id: str) -> JobDetail:
        """One job in detail."""
        fields = self.ask("status", job=job_id)
        return JobDetail(
            row=job_row(fields),
            reason=str(fields.get("reason", "")),
            task=fields.get("task"),
            history=tuple(transition(entry) for entry in fields.get("history") or ()),
            goodput=goodput(fields.get("goodput")),
            members=tuple(member(view) for view in fields.get("members") or ()),
        )

    def incidents(self, job_id: str | None = None) -> tuple[Incident, ...]:
        """The latest record of each incident, of one job or of all."""
        args = {} if job_id is None else {"job": job_id}
        return tuple(incident(record) for record in self.ask("incidents", **args))

    def runbook(self, incident_id: str) -> str:
        """An incident's runbook, its markdown text."""
        return str(self.ask("runbook", incident=incident_id).get("text", ""))

    def checkpoints(self, job_id: str) -> tuple[Checkpoint, ...]:
        """Every checkpoint file of a job with its verdict."""
        return tuple(checkpoint(entry) for entry in self.ask("checkpoints", job=job_id))

    def curves(self, job_id: str) -> tuple[Curve, ...]:
        """The loss curves of every attempt, read with ``events`` from the first attempt on."""
        cursor: dict[str, Any] = {"attempt": 1, "offset": 0}
        events: list[dict[str, Any]] = []
        for _ in range(MAX_EVENT_PAGES):
            answer = self.ask("events", job=job_id, **cursor)
            if not answer["events"]:
                break
            events += answer["events"]
            cursor = dict(answer["cursor"])
        return curves(events)

    def tail(self, job_id: str, attempt: int, stream: str, lines: int = 200) -> list[str]:
        """The last lines of one attempt's events or stderr, the worker's alone."""
        answer = self.ask(
            "tail", job=job_id, attempt=attempt, stream=stream, lines=lines, daemon=False
        )
        return [tail_line(line) for line in answer.get("lines") or ()]


def now() -> float:
    """Wall time, for the ages of records that carry wall times."""
    return time.time()
