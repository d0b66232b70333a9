"""Notifications: an exec hook or a webhook told of job state changes and incidents.

Three event names, in the spirit of supervisord's ``PROCESS_STATE_*``
eventlistener events but as JSON objects (docs/daemon.md, "Notifications"):

- ``job.state``: a job moved ``from`` one state ``to`` another (``from`` is
  null when an accepted job enters ``queued``);
- ``incident.opened`` and ``incident.concluded``: an incident's ``kind``,
  ``symptom``, ``status`` and, once concluded, ``outcome``.

The loop only enqueues (`Notifications.job_state`, `Notifications.incident`):
each sink has a bounded queue that drops its oldest event when full, counted
and logged as ``notify.overflow``, and its own thread that delivers each
event with retries and backoff.  An event still undelivered after its last
try is logged as ``notify.dropped`` with the error, and the next one is sent.
The sinks themselves, and how each of their tries is bounded, are in `sinks`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from jobwarden.daemon.config import NotifySettings
from jobwarden.daemon.observe.sinks import ExecHook, Sink, Webhook
from jobwarden.errors import JobwardenError
from jobwarden.events import iso_twin

if TYPE_CHECKING:
    from jobwarden.daemon.incidents.records import Incident, IncidentLog
    from jobwarden.daemon.store.jobs import JobRecord, JobTable
    from jobwarden.daemon.store.layout import Root
    from jobwarden.states import JobState

log = structlog.get_logger("wardend.notify")

SCHEMA = 2
"""The version of the event objects (2: ``time`` is epoch seconds beside ``time_iso``, and
an incident's text is ``symptom``, the names the rest of jobwarden uses)."""
QUEUE_SIZE = 1000
"""Events each sink holds while its deliveries lag; beyond it the oldest is dropped."""
MAX_TRIES = 10
"""Tries of one event at most: each later event waits behind them (and their doubling backoff)."""
MAX_BACKOFF_S = 60.0
"""The longest first wait between tries."""
DRAIN_S = 5.0
"""How long a stopping daemon waits for each sink's queued events."""
SUMMARY_CHARS = 500
"""An incident's symptom and outcome are cut to this length."""


class NotifySettingError(JobwardenError):
    """Raised at start when ``--notify-exec`` or ``--notify-webhook`` cannot be used."""

    code = "notify.setting"
    exit_status = 2

    def __init__(self, option: str, value: str, problem: str) -> None:
        super().__init__(f"{option} {value!r}: {problem}", option=option, value=value)


def stamped() -> dict[str, Any]:
    """The wall time as epoch seconds, ``time``, and as ISO 8601 in UTC to the millisecond,
    ``time_iso``: the pair every jobwarden output carries."""
    now = time.time()
    return {"time": now, "time_iso": iso_twin(now)}


def job_state_event(record: JobRecord, source: JobState | None, reason: str) -> dict[str, Any]:
    """The ``job.state`` event of a transition that has just been persisted."""
    return {
        "event": "job.state",
        "schema": SCHEMA,
        **stamped(),
        "job": record.id,
        "from": source.value if source is not None else None,
        "to": record.state.value,
        "reason": reason,
        "attempt": record.attempt,
    }


def incident_event(incident: Incident, name: str) -> dict[str, Any]:
    """The ``incident.opened`` or ``incident.concluded`` event of an incident."""
    event: dict[str, Any] = {
        "event": name,
        "schema": SCHEMA,
        **stamped(),
        "job": incident.job,
        "incident": incident.id,
        "kind": str(incident.kind),
        "symptom": incident.symptom[:SUMMARY_CHARS],
        "status": incident.status,
        "attempt": incident.attempt,
    }
    if name == "incident.concluded":
        event["outcome"] = incident.outcome[:SUMMARY_CHARS]
    return event


def check_webhook(url: str) -> str:
    """The URL, if it is an http or https URL with a host; raises `NotifySettingError`."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise NotifySettingError("--notify-webhook", url, "expected an http:// or https:// URL")
    return url


def check_program(program: str) -> str:
    """The hook's absolute path (a bare name is looked up on PATH); raises `NotifySettingError`."""
    found = shutil.which(program) if os.sep not in program else program
    if found is None or not Path(found).is_file() or not os.access(found, os.X_OK):
        raise NotifySettingError("--notify-exec", program, "not an executable file")
    return str(Path(found).absolute())


def check_retries(timeout_s: float, tries: int, backoff_s: float) -> None:
    """Refuse a try's timeout, a count of tries or a backoff no delivery could keep to."""
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise NotifySettingError("--notify-timeout", f"{timeout_s:g}", "expected seconds above 0")
    if not 1 <= tries <= MAX_TRIES:
        raise NotifySettingError("--notify-tries", str(tries), f"expected 1 to {MAX_TRIES}")
    if not (math.isfinite(backoff_s) and 0 <= backoff_s <= MAX_BACKOFF_S):
        raise NotifySettingError(
            "--notify-backoff", f"{backoff_s:g}", f"expected seconds from 0 to {MAX_BACKOFF_S:g}"
        )


class Channel:
    """One sink's bounded queue and the thread that delivers from it."""

    def __init__(
        self,
        sink: Sink,
        *,
        size: int = QUEUE_SIZE,
        tries: int = NotifySettings.tries,
        backoff_s: float = NotifySettings.backoff_s,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.sink = sink
        self.size, self.tries, self.backoff_s, self.sleep = size, tries, backoff_s, sleep
        self.pending: deque[dict[str, Any]] = deque()
        self.wake = threading.Condition()
        self.busy = False
        self.closing = False
        self.sent = self.dropped = self.overflowed = 0
        self.thread = threading.Thread(target=self._run, name=f"notify-{sink.name}", daemon=True)

    def put(self, event: dict[str, Any]) -> None:
        """Queue one event (from the loop; never waits on a delivery)."""
        with self.wake:
            if len(self.pending) >= self.size:
                lost = self.pending.popleft()
                self.overflowed += 1
                log.warning(
                    "notify.overflow",
                    sink=self.sink.name,
                    lost=lost["event"],
                    job=lost.get("job"),
                    overflowed=self.overflowed,
                )
            self.pending.append(event)
            self.wake.notify()

    def _run(self) -> None:
        while True:
            with self.wake:
                while not self.pending and not self.closing:
                    self.wake.wait()
                if not self.pending:
                    return
                event = self.pending.popleft()
                self.busy = True
            try:
                self._deliver(event)
            finally:
                with self.wake:
                    self.busy = False
                    self.wake.notify_all()

    def _deliver(self, event: dict[str, Any]) -> None:
        body = (json.dumps(event, default=str) + "\n").encode()
        error: BaseException | None = None
        for attempt in range(self.tries):
            if attempt:
                self.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                self.sink.deliver(body, event)
            except Exception as failed:  # noqa: BLE001 - DeliveryError, or a bug that must not end the thread
                error = failed
            else:
                self.sent += 1
                return
        self.dropped += 1
        log.error(
            "notify.dropped",
            sink=self.sink.name,
            notification=event["event"],
            job=event.get("job"),
            tries=self.tries,
            error=str(error),
        )

    def close(self, timeout_s: float = DRAIN_S) -> None:
        """Deliver what is queued for up to ``timeout_s``, then stop the thread."""
        deadline = time.monotonic() + timeout_s
        with self.wake:
            self.closing = True
            self.wake.notify_all()
            while (self.pending or self.busy) and time.monotonic() < deadline:
                self.wake.wait(max(0.0, deadline - time.monotonic()))
            left = len(self.pending)
            self.pending.clear()
            self.wake.notify_all()
        if left:
            log.error("notify.abandoned", sink=self.sink.name, events=left)
        self.thread.join(max(0.0, deadline - time.monotonic()))


class Notifications:
    """Every configured sink; the daemon's table and incident log call it on each change."""

    def __init__(
        self,
        sinks: list[Sink],
        *,
        tries: int = NotifySettings.tries,
        backoff_s: float = NotifySettings.backoff_s,
    ) -> None:
        self.channels = [Channel(sink, tries=tries, backoff_s=backoff_s) for sink in sinks]

    @classmethod
    def of(cls, settings: NotifySettings, environ: Mapping[str, str], cwd: Path) -> Notifications:
        """The sinks ``settings`` ask for, a hook run in ``cwd`` with the workers' environment."""
        sinks: list[Sink] = []
        if settings.exec is not None:
            sinks.append(ExecHook(settings.exec, environ, cwd, settings.timeout_s))
        if settings.webhook is not None:
            sinks.append(Webhook(settings.webhook, settings.timeout_s))
        return cls(sinks, tries=settings.tries, backoff_s=settings.backoff_s)

    @classmethod
    def attach(
        cls, settings: NotifySettings, root: Root, table: JobTable, incidents: IncidentLog
    ) -> Notifications:
        """The sinks ``settings`` ask for, in the root folder, hearing the table and the log."""
        notifications = cls.of(settings, os.environ, root.path)
        table.listeners.append(notifications.job_state)
        incidents.listeners.append(notifications.incident)
        return notifications

    def start(self) -> None:
        """Start each sink's thread."""
        for channel in self.channels:
            channel.thread.start()
            log.info("notify.started", sink=channel.sink.name)

    def publish(self, event: dict[str, Any]) -> None:
        """Queue ``event`` for every sink."""
        for channel in self.channels:
            channel.put(event)

    def job_state(self, record: JobRecord, source: JobState | None, reason: str) -> None:
        """A `JobTable` listener: a job changed state."""
        if self.channels:
            self.publish(job_state_event(record, source, reason))

    def incident(self, incident: Incident, name: str) -> None:
        """An `IncidentLog` listener: an incident was opened or concluded."""
        if self.channels:
            self.publish(incident_event(incident, name))

    def counts(self) -> dict[str, int]:
        """Events sent, dropped after their tries, and lost to a full queue, over all sinks."""
        return {
            "sent": sum(c.sent for c in self.channels),
            "dropped": sum(c.dropped for c in self.channels),
            "overflowed": sum(c.overflowed for c in self.channels),
        }

    def close(self) -> None:
        """Drain and stop every sink (at daemon stop)."""
        for channel in self.channels:
            if channel.thread.is_alive():
                channel.close()
