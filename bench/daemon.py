"""Daemon benchmark: a real wardend on a temporary root, timed from its own records.

Every measure starts a real ``python -m jobwarden.daemon`` (``--rescan-interval 1``,
as the tests run it) and drives it the way users do, by dropping job files
Maildir-style (write in ``spool/tmp``, rename into ``spool/incoming``).  Times
come from the records the daemon writes anyway: the ISO ``timestamp`` of its
structlog lines in ``ROOT/wardend.log`` and ``ROOT/incidents.jsonl``, and the
wall-clock ``time`` of worker events in ``jobs/<id>/attempts/<n>/events.jsonl``.
All clocks are this machine's wall clock.  Samples run one at a time, so the
two cores are never shared by two measured jobs.

1. Intake: with ``--max-concurrent 1`` and a first job that stalls for 600 s
   right after ``ready`` (so no later job's worker ever starts), N small valid
   jobs are renamed into ``spool/incoming`` 20 ms apart; the latency is
   ``time.time()`` right after ``os.rename`` to the ``job.queued`` log line,
   which the daemon writes after ``state.json`` is persisted.  Two diagnostic
   rows write the files directly in ``spool/incoming`` instead (the watcher's
   close-after-write path), 0.6 s apart and then 20 ms apart, to tell the
   watcher's latency from the rescan's.
2. Worker exit to incident: jobs with ``[faults] crash_after = 1`` (SIGKILL right
   after the progress event of update 1) and ``max_restarts = 0``.  The bench
   opens a pidfd on the worker (pid from ``attempt.started``) and notes when it
   becomes readable (the real exit); "noticed" is the ``attempt.exited`` log
   line and "written" the ``incident.detected`` record of ``incidents.jsonl``.
   Rows: noticed -> written, exit -> written, last progress event -> written.
3. Stall overshoot: ``stall_at = 2``, ``stall_seconds = 30``, ``stall_timeout_s = 1``;
   the daemon records ``details.overshoot_s`` (timer lateness past the timeout)
   in the incident.  A cross-check uses the stack dump the daemon requests on
   detection (SIGUSR1): the mtime of the worker's ``stderr.log`` minus (the last
   ready/progress/checkpoint event's ``time`` + the timeout).  File times come
   from the kernel's coarse clock (one tick), so the check is only good to a tick.
4. Recovery: ``fail_after = 3`` with the default ``restart_backoff_s`` (0.5 s);
   recovery time is the failed attempt's last progress event to the first
   progress event of attempt 2, split into detection, backoff (``recovering``
   transition to ``attempt.started``), spawn to ``ready``, and the first update.
   Variants: one daemon on a pre-warmed ``--compile-cache``; a fresh daemon with
   an empty cache per job (attempt 1 fills it before attempt 2 starts); and a
   fresh daemon whose cache the bench empties during the backoff (a truly cold
   restart).  Side by side, a standalone ``python -m jobwarden.worker`` from
   process start to its first progress event, with an empty and a warm cache.

Run with ``make bench`` or ``.venv/bin/python bench/daemon.py`` (``--quick`` for
fewer samples, ``--samples N`` to use N samples for every measure, ``--keep``
to keep the temporary roots).  It prints a table and writes
``bench/results/daemon.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from figures import Figure, at_most, records

from jobwarden.states import SETTLED
from jobwarden.worker.command import worker_argv

RESULTS = Path(__file__).resolve().parent / "results" / "daemon.json"
POLL_S = 0.01
DROP_SPACING_S = 0.02
ISOLATED_SPACING_S = 0.6
SETTLE_S = 1.5  # before each intake round: let events the watcher still holds drain
RESCAN_INTERVAL_S = 1.0
DEFAULT_BACKOFF_S = 0.5
ALIVE_EVENTS = ("ready", "progress", "checkpoint")
SETTLED_STATES = tuple(sorted(state.value for state in SETTLED))
HOLD_JOB = {
    "faults": {"stall_at": 0, "stall_seconds": 600},
    "supervision": {"stall_timeout_s": 600, "startup_timeout_s": 600, "stop_grace_s": 1},
}
CRASH_JOB = {"faults": {"crash_after": 1}, "supervision": {"max_restarts": 0}}
STALL_JOB = {
    "faults": {"stall_at": 2, "stall_seconds": 30},
    "supervision": {"stall_timeout_s": 1, "max_restarts": 0, "stop_grace_s": 1},
}
RECOVERY_JOB = {"faults": {"fail_after": 3}}

Record = dict[str, Any]
Match = Callable[[Record], bool]


# ---- records


def toml_value(value: object) -> str:
    """A Python scalar as TOML."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def job_text(job_id: str, sections: Mapping[str, Mapping[str, object]] | None = None) -> str:
    """A linreg job file with the given sections."""
    lines = [f'id = "{job_id}"', 'task = "linreg"']
    for name, fields in (sections or {}).items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in fields.items()]
    return "\n".join(lines) + "\n"


def stamp(record: Record) -> float:
    """The wall-clock seconds of a structlog record's ISO ``timestamp``."""
    return datetime.fromisoformat(record["timestamp"]).timestamp()


def read_events(path: Path) -> list[Record]:
    """The worker events of one attempt (malformed lines skipped; none yet: empty)."""
    events: list[Record] = []
    if not path.exists():
        return events
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return events


def first_time(events: list[Record], kind: str) -> float | None:
    """The ``time`` of the first event of ``kind``."""
    return next((e["time"] for e in events if e.get("event") == kind), None)


def last_time(events: list[Record], kinds: tuple[str, ...]) -> float | None:
    """The ``time`` of the last event of one of ``kinds``."""
    times = [e["time"] for e in events if e.get("event") in kinds]
    return times[-1] if times else None


def need(value: float | None, job: str, what: str) -> float:
    """``value``, which a run must have produced."""
    if value is None:
        raise RuntimeError(f"{job}: no {what} event")
    return value


def is_event(name: str, **fields: object) -> Match:
    """A predicate on a record's ``event`` and fields."""
    return lambda r: r.get("event") == name and all(r.get(k) == v for k, v in fields.items())


def transition_to(job: str, *targets: str) -> Match:
    """A predicate for ``job.transition`` of ``job`` into one of ``targets``."""
    return lambda r: (
        r.get("event") == "job.transition" and r.get("job") == job and r.get("target") in targets
    )


class JsonLines:
    """An incremental reader of a JSON-lines file another process appends to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.rest = b""
        self.records: list[Record] = []

    def poll(self) -> None:
        """Read the complete lines appended since the last poll."""
        try:
            with self.path.open("rb") as stream:
                stream.seek(self.offset)
                data = stream.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        *lines, self.rest = (self.rest + data).split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError):
                self.records.append(json.loads(line))


# ---- the daemon


class Wardend:
    """One wardend process on its own root, and readers of its log and incident records."""

    def __init__(self, root: Path, cache: Path, *extra: str) -> None:
        self.root = root
        self.cache = cache
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = JsonLines(root / "wardend.log")
        self.incidents = JsonLines(root / "incidents.jsonl")

    def start(self, timeout: float = 60) -> Wardend:
        """Start the daemon and wait for its ``wardend.ready`` line."""
        argv = [
            sys.executable,
            "-m",
            "jobwarden.daemon",
            "--root",
            str(self.root),
            "--rescan-interval",
            str(RESCAN_INTERVAL_S),
            "--compile-cache",
            str(self.cache),
            *self.extra,
        ]
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root.parent / f"{self.root.name}.stderr").open("ab") as err:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        self.wait_for(self.log, is_event("wardend.ready"), timeout)
        return self

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM the daemon and wait for it to exit (SIGKILL past ``timeout``)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def wait_for(self, stream: JsonLines, match: Match, timeout: float = 120) -> Record:
        """The first record of ``stream`` that matches, polling until ``timeout``."""
        deadline = time.monotonic() + timeout
        checked = 0
        while True:
            stream.poll()
            for record in stream.records[checked:]:
                if match(record):
                    return record
            checked = len(stream.records)
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"wardend exited with status {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no matching record in {stream.path.name}")
            time.sleep(POLL_S)

    def drop(self, name: str, text: str) -> float:
        """Create the request in spool/tmp, rename it into spool/incoming; returns the time."""
        tmp = self.root / "spool" / "tmp" / name
        tmp.write_text(text)
        os.rename(tmp, self.root / "spool" / "incoming" / name)
        return time.time()

    def write_incoming(self, name: str, text: str) -> float:
        """Write the request directly in spool/incoming (one write, then close)."""
        fd = os.open(
            self.root / "spool" / "incoming" / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600
        )
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        return time.time()

    def events(self, job: str, attempt: int) -> list[Record]:
        """The worker events of one attempt."""
        return read_events(self.root / "jobs" / job / "attempts" / str(attempt) / "events.jsonl")

    def attempt_folder(self, job: str, attempt: int) -> Path:
        """jobs/<id>/attempts/<n>."""
        return self.root / "jobs" / job / "attempts" / str(attempt)


@contextlib.contextmanager
def running(root: Path, cache: Path, *extra: str) -> Iterator[Wardend]:
    """A started daemon, stopped (SIGTERM) on the way out."""
    daemon = Wardend(root, cache, *extra)
    try:
        yield daemon.start()
    finally:
        daemon.stop()


def wait_exit(pid: int, timeout: float) -> float | None:
    """When process ``pid`` exits, seen through a pidfd; None if it was already gone."""
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return None
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        return time.time() if ready else None
    finally:
        os.close(fd)


def clear_folder(folder: Path) -> int:
    """Remove everything inside ``folder`` (keeping it and its mode); returns entries removed."""
    removed = 0
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
        removed += 1
    return removed


def count_files(folder: Path) -> int:
    """Files under ``folder``."""
    return sum(len(files) for _, _, files in os.walk(folder))


def private_dir(path: Path) -> Path:
    """An empty 0700 directory (the worker refuses a compile cache others can read)."""
    path.mkdir(mode=0o700, parents=True)
    path.chmod(0o700)
    return path


# ---- statistics and the table


@dataclass
class Measure:
    """One row of the table: samples in seconds, and a target on one statistic."""

    name: str
    samples: list[float]
    unit: str = "ms"
    target_s: float | None = None
    target_on: str = "p99"
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def stat(self, which: str) -> float | None:
        """p50, p99, min, max or mean (linear interpolation between ranks)."""
        if not self.samples:
            return None
        values = np.asarray(self.samples)
        if which == "mean":
            return float(values.mean())
        if which == "min":
            return float(values.min())
        if which == "max":
            return float(values.max())
        return float(np.percentile(values, float(which.lstrip("p"))))

    def verdict(self) -> str:
        """PASS, MISS, or '-' without a target."""
        value = self.stat(self.target_on)
        if self.target_s is None or value is None:
            return "-"
        return "PASS" if value <= self.target_s else "MISS"

    def show(self, seconds: float | None) -> str:
        """A value in the row's unit."""
        if seconds is None:
            return "-"
        return f"{seconds * 1000:.1f} ms" if self.unit == "ms" else f"{seconds:.3f} s"

    def target_text(self) -> str:
        """The target as printed."""
        if self.target_s is None:
            return "-"
        return f"{self.target_on} <= {self.show(self.target_s)}"

    def as_record(self) -> dict[str, Any]:
        """JSON-ready form (seconds)."""
        return {
            "name": self.name,
            "n": len(self.samples),
            **{k: self.stat(k) for k in ("p50", "p99", "min", "max", "mean")},
            "target_s": self.target_s,
            "target_on": self.target_on,
            "verdict": self.verdict(),
            "note": self.note,
            "samples_s": self.samples,
            **self.extra,
        }


def measure_figures(measures: list[Measure]) -> list[Figure]:
    """The summary's rows: every measure with a target, on its statistic."""
    out = []
    for m in measures:
        value = m.stat(m.target_on)
        if m.target_s is None or value is None:
            continue
        scale, fmt, unit = (1000, ".1f", " ms") if m.unit == "ms" else (1, ".3f", " s")
        out.append(
            at_most(f"{m.name}, {m.target_on}", value * scale, m.target_s * scale, fmt, unit)
        )
    return out


def table(measures: list[Measure]) -> str:
    """The measures as a fixed-width table."""
    head = ("measure", "n", "p50", "p99", "target", "result")
    rows = [
        (
            m.name,
            str(len(m.samples)),
            m.show(m.stat("p50")),
            m.show(m.stat("p99")),
            m.target_text(),
            m.verdict(),
        )
        for m in measures
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = []
    for row in [head, *rows]:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells))
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def fmt(seconds: float | None) -> str:
    """Seconds to three places, or '-'."""
    return "-" if seconds is None else f"{seconds:.3f}"


def median(values: list[float]) -> float | None:
    """The median, or None for no values."""
    return float(np.median(values)) if values else None


# ---- 1. intake


def intake_round(
    daemon: Wardend, label: str, submit: Callable[[str, str], float], n: int, spacing_s: float
) -> tuple[list[float], list[float], int]:
    """Submit ``n`` jobs ``spacing_s`` apart; latencies to job.queued, submitted -> queued,
    and how many never arrived."""
    time.sleep(SETTLE_S)
    sent: dict[str, float] = {}
    for i in range(n):
        job_id = f"intake-{label}-{i:04d}"
        sent[job_id] = submit(f"{job_id}.toml", job_text(job_id))
        time.sleep(spacing_s)
    queued: dict[str, float] = {}
    deadline = time.monotonic() + 30
    while len(queued) < n and time.monotonic() < deadline:
        time.sleep(0.05)
        daemon.log.poll()
        queued = {
            r["job"]: stamp(r)
            for r in daemon.log.records
            if r.get("event") == "job.queued" and r.get("job") in sent
        }
    persist = []
    for job_id, at in queued.items():
        state = json.loads((daemon.root / "jobs" / job_id / "state.json").read_text())
        persist.append(at - state["submitted"])
    return [at - sent[job_id] for job_id, at in queued.items()], persist, n - len(queued)


def bench_intake(base: Path, cache: Path, n: int) -> list[Measure]:
    """Rename -> job.queued, and the same through a direct write in incoming."""
    with running(base / "intake", cache, "--max-concurrent", "1") as daemon:
        daemon.drop("hold.toml", job_text("hold", HOLD_JOB))
        daemon.wait_for(daemon.log, transition_to("hold", "running"), 180)
        renamed, renamed_persist, renamed_missing = intake_round(
            daemon, "rename", daemon.drop, n, DROP_SPACING_S
        )
        alone, _, alone_missing = intake_round(
            daemon, "alone", daemon.write_incoming, max(2, min(20, n // 10)), ISOLATED_SPACING_S
        )
        written, _, written_missing = intake_round(
            daemon, "write", daemon.write_incoming, n, DROP_SPACING_S
        )
    return [
        Measure(
            "intake: rename -> job.queued",
            renamed,
            target_s=0.015,
            note="time.time() after os.rename into spool/incoming to the job.queued log line",
            extra={
                "missing": renamed_missing,
                "submitted_to_queued_p50_s": median(renamed_persist),
                "rescan_interval_s": RESCAN_INTERVAL_S,
            },
        ),
        Measure(
            "intake diag: write in incoming, 20 ms apart",
            written,
            note="written directly in spool/incoming: the watcher's close-after-write path",
            extra={"missing": written_missing},
        ),
        Measure(
            "intake diag: write in incoming, 0.6 s apart",
            alone,
            note="the same, spaced past watchdog's 0.5 s hold of unpaired IN_MOVED_FROM events",
            extra={"missing": alone_missing},
        ),
    ]


# ---- 2. worker exit -> incident


def bench_crash(base: Path, cache: Path, n: int) -> list[Measure]:
    """crash_after = 1: exit, noticed (attempt.exited), written (incident.detected)."""
    noticed_written, exit_written, progress_written, exit_noticed = [], [], [], []
    with running(base / "crash", cache) as daemon:
        for i in range(n):
            job_id = f"crash-{i:03d}"
            daemon.drop(f"{job_id}.toml", job_text(job_id, CRASH_JOB))
            started = daemon.wait_for(daemon.log, is_event("attempt.started", job=job_id), 180)
            exited_at = wait_exit(started["pid"], 180)
            exited = daemon.wait_for(daemon.log, is_event("attempt.exited", job=job_id))
            incident = daemon.wait_for(daemon.incidents, is_event("incident.detected", job=job_id))
            daemon.wait_for(daemon.log, transition_to(job_id, *SETTLED_STATES))
            written = stamp(incident)
            last_progress = last_time(daemon.events(job_id, 1), ("progress",))
            noticed_written.append(written - stamp(exited))
            if last_progress is not None:
                progress_written.append(written - last_progress)
            if exited_at is not None:
                exit_written.append(written - exited_at)
                exit_noticed.append(stamp(exited) - exited_at)
    return [
        Measure(
            "crash: attempt.exited -> incident written",
            noticed_written,
            target_s=0.020,
            note="attempt.exited log line to the incident.detected record",
        ),
        Measure(
            "crash: worker exit (pidfd) -> incident written",
            exit_written,
            target_s=0.020,
            note="pidfd readable in the bench to the incident.detected record",
            extra={"exit_to_noticed_p50_s": median(exit_noticed)},
        ),
        Measure(
            "crash: last progress event -> incident written",
            progress_written,
            target_s=0.020,
            note="upper bound: includes the worker's own SIGKILL and exit",
        ),
    ]


# ---- 3. stall overshoot


def bench_stall(base: Path, cache: Path, n: int) -> list[Measure]:
    """stall_at = 2 under stall_timeout_s = 1: the daemon's recorded overshoot."""
    overshoot, end_to_end, gaps = [], [], []
    with running(base / "stall", cache) as daemon:
        for i in range(n):
            job_id = f"stall-{i:03d}"
            daemon.drop(f"{job_id}.toml", job_text(job_id, STALL_JOB))
            incident = daemon.wait_for(
                daemon.incidents, is_event("incident.detected", job=job_id), 180
            )
            daemon.wait_for(daemon.log, transition_to(job_id, *SETTLED_STATES))
            details = incident["details"]
            overshoot.append(details["overshoot_s"])
            gaps.append(details["gap_s"])
            alive = last_time(daemon.events(job_id, 1), ALIVE_EVENTS)
            dumped = (daemon.attempt_folder(job_id, 1) / "stderr.log").stat().st_mtime
            if alive is not None:
                end_to_end.append(dumped - alive - details["timeout_s"])
    return [
        Measure(
            "stall: overshoot past stall_timeout_s",
            overshoot,
            target_s=0.250,
            note="details.overshoot_s of the stall incident (loop timer lateness)",
            extra={"gap_s": gaps},
        ),
        Measure(
            "stall: last event -> stack dump - timeout (check)",
            end_to_end,
            note="stderr.log mtime (SIGUSR1 dump at detection) - last alive event time - timeout",
        ),
    ]


# ---- 4. recovery, and the standalone worker side by side


def recovery_sample(daemon: Wardend, job_id: str, empty_cache: bool) -> Record:
    """One fail_after = 3 job: the timeline of its failure and first resumed update."""
    daemon.drop(f"{job_id}.toml", job_text(job_id, RECOVERY_JOB))
    recovering = daemon.wait_for(daemon.log, transition_to(job_id, "recovering"), 180)
    entries = count_files(daemon.cache)
    cleared_at = None
    if empty_cache:
        clear_folder(daemon.cache)
        cleared_at = time.time()
    started = daemon.wait_for(daemon.log, is_event("attempt.started", job=job_id, attempt=2))
    done = daemon.wait_for(daemon.log, transition_to(job_id, *SETTLED_STATES), 180)
    exited = daemon.wait_for(daemon.log, is_event("attempt.exited", job=job_id, attempt=1))
    opened = daemon.wait_for(daemon.incidents, is_event("incident.opened", job=job_id))
    goodput = daemon.wait_for(daemon.incidents, is_event("incident.goodput", job=job_id), 5)
    failed, resumed = daemon.events(job_id, 1), daemon.events(job_id, 2)
    last_progress = need(last_time(failed, ("progress",)), job_id, "progress")
    failed_at = need(first_time(failed, "failed"), job_id, "failed")
    first_progress = need(first_time(resumed, "progress"), job_id, "resumed progress")
    ready = need(first_time(resumed, "ready"), job_id, "resumed ready")
    imported = need(first_time(resumed, "started"), job_id, "resumed started")
    return {
        "job": job_id,
        "final_state": done["target"],
        "recovery_s": first_progress - last_progress,
        "detect_s": stamp(exited) - last_progress,
        "worker_teardown_s": stamp(exited) - failed_at,
        "incident_s": stamp(recovering) - stamp(exited),
        "backoff_configured_s": opened["details"].get("backoff_s"),
        "backoff_s": stamp(started) - stamp(recovering),
        "spawn_to_ready_s": ready - stamp(started),
        "spawn_to_started_s": imported - stamp(started),
        "ready_to_progress_s": first_progress - ready,
        "daemon_time_lost_s": goodput.get("time_lost_s"),
        "cache_files_at_failure": entries,
        "cache_files_at_end": count_files(daemon.cache),
        "cache_cleared_before_spawn": None if cleared_at is None else cleared_at < stamp(started),
    }


def recovery_measure(name: str, samples: list[Record], note: str) -> Measure:
    """A recovery row with its breakdown medians."""
    keys = (
        "detect_s",
        "worker_teardown_s",
        "incident_s",
        "backoff_s",
        "spawn_to_ready_s",
        "spawn_to_started_s",
        "ready_to_progress_s",
        "daemon_time_lost_s",
    )
    return Measure(
        name,
        [s["recovery_s"] for s in samples],
        unit="s",
        target_on="p50",
        note=note,
        extra={
            "breakdown_p50_s": {
                k: median([s[k] for s in samples if s[k] is not None]) for k in keys
            },
            "runs": samples,
        },
    )


def bench_recovery(base: Path, warm_cache: Path, n: int) -> list[Measure]:
    """fail_after = 3 on a warm cache, a fresh cache per job, and a cache emptied in the backoff."""
    with running(base / "recovery-warm", warm_cache) as daemon:
        warm = [recovery_sample(daemon, f"warm-{i:02d}", False) for i in range(n)]
    fresh: list[Record] = []
    cold: list[Record] = []
    for i in range(n):
        for label, runs, empty in (("fresh", fresh, False), ("cold", cold, True)):
            cache = private_dir(base / f"cache-{label}-{i:02d}")
            with running(base / f"recovery-{label}-{i:02d}", cache) as daemon:
                runs.append(recovery_sample(daemon, f"{label}-{i:02d}", empty))
    return [
        recovery_measure(
            "recovery: warm cache",
            warm,
            "last progress of attempt 1 -> first progress of attempt 2, pre-warmed cache",
        ),
        recovery_measure(
            "recovery: fresh cache dir per job",
            fresh,
            "empty cache at daemon start; attempt 1 fills it before attempt 2",
        ),
        recovery_measure(
            "recovery: cache emptied during backoff",
            cold,
            "the bench empties the cache after the recovering transition: a cold restart",
        ),
    ]


def worker_sample(base: Path, name: str, cache: Path) -> Record:
    """A standalone worker from process start to its first progress event."""
    folder = base / name
    folder.mkdir(parents=True)
    job_file = folder / "job.toml"
    job_file.write_text(job_text(name))
    argv = worker_argv(job_file, folder / "checkpoints", cache)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("JOBWARDEN_SUPERVISOR_PID", "JOBWARDEN_COMPILE_CACHE")
    }
    with (folder / "events.jsonl").open("wb") as out, (folder / "stderr.log").open("wb") as err:
        began = time.time()
        status = subprocess.run(argv, stdout=out, stderr=err, env=env, timeout=300, check=False)
    events = read_events(folder / "events.jsonl")
    progress, ready, started = (first_time(events, k) for k in ("progress", "ready", "started"))
    if status.returncode != 0 or progress is None or ready is None or started is None:
        raise RuntimeError(f"worker {name} exited with {status.returncode}")
    return {
        "to_first_progress_s": progress - began,
        "to_started_s": started - began,
        "to_ready_s": ready - began,
    }


def bench_worker(base: Path, warm_cache: Path, n: int) -> list[Measure]:
    """The standalone worker's start, an empty cache and a warm one alternating."""
    empty, warm = [], []
    for i in range(n):
        empty.append(
            worker_sample(base, f"worker-empty-{i:02d}", private_dir(base / f"cache-empty-{i:02d}"))
        )
        warm.append(worker_sample(base, f"worker-warm-{i:02d}", warm_cache))
    rows = []
    for label, runs in (("empty", empty), ("warm", warm)):
        rows.append(
            Measure(
                f"worker start -> first progress, {label} cache",
                [r["to_first_progress_s"] for r in runs],
                unit="s",
                target_on="p50",
                note="python -m jobwarden.worker, from before spawn to its first progress event",
                extra={
                    "to_started_p50_s": median([r["to_started_s"] for r in runs]),
                    "to_ready_p50_s": median([r["to_ready_s"] for r in runs]),
                },
            )
        )
    return rows


# ---- main


def filesystem_of(path: Path) -> str:
    """The filesystem type holding ``path``, from /proc/mounts."""
    best, kind = "", "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and str(path).startswith(parts[1]) and len(parts[1]) > len(best):
                best, kind = parts[1], parts[2]
    return kind


def main(argv: list[str] | None = None) -> int:
    """Run every measure, print the table, write the JSON results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--samples", type=int, help="samples for every measure")
    parser.add_argument("--keep", action="store_true", help="keep the temporary roots")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the JSON results file")
    args = parser.parse_args(argv)
    counts = (
        {"intake": 50, "crash": 5, "stall": 3, "recovery": 2, "worker": 2}
        if args.quick
        else {"intake": 200, "crash": 20, "stall": 10, "recovery": 5, "worker": 5}
    )
    if args.samples is not None:
        counts = dict.fromkeys(counts, args.samples)
    base = Path(tempfile.mkdtemp(prefix="jw-bench-"))
    measures: list[Measure] = []
    began = time.monotonic()
    try:
        warm_cache = private_dir(base / "cache-warm")
        print("warming the compilation cache ...", flush=True)
        worker_sample(base, "prewarm", warm_cache)
        steps: list[tuple[str, Callable[[], list[Measure]]]] = [
            ("standalone worker start", lambda: bench_worker(base, warm_cache, counts["worker"])),
            ("intake", lambda: bench_intake(base, warm_cache, counts["intake"])),
            ("worker exit -> incident", lambda: bench_crash(base, warm_cache, counts["crash"])),
            ("stall overshoot", lambda: bench_stall(base, warm_cache, counts["stall"])),
            ("recovery", lambda: bench_recovery(base, warm_cache, counts["recovery"])),
        ]
        for title, step in steps:
            print(f"{title} ...", flush=True)
            measures += step()
    finally:
        fs = filesystem_of(base)
        if args.keep:
            print(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    print()
    print(table(measures))
    print()
    print(f"recovery breakdown, p50 in s (restart_backoff_s = {DEFAULT_BACKOFF_S} s, the default):")
    for m in measures:
        late = [
            r["job"] for r in m.extra.get("runs", []) if r["cache_cleared_before_spawn"] is False
        ]
        if late:
            print(f"  warning: cache emptied only after attempt 2 started in {', '.join(late)}")
        breakdown = m.extra.get("breakdown_p50_s")
        if breakdown:
            print(f"  {m.name.removeprefix('recovery: ')}:")
            print(
                "    " + "  ".join(f"{k.removesuffix('_s')} {fmt(v)}" for k, v in breakdown.items())
            )
    print(f"roots on {fs}; rescan interval {RESCAN_INTERVAL_S:g} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "daemon",
        "created": time.time(),
        "duration_s": time.monotonic() - began,
        "counts": counts,
        "platform": {
            "python": platform.python_version(),
            "jax": metadata.version("jax"),
            "cpus": os.cpu_count(),
            "filesystem": fs,
        },
        "measures": [m.as_record() for m in measures],
        "figures": records(measure_figures(measures)),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {os.path.relpath(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
