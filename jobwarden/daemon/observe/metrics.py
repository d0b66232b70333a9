"""Prometheus text exposition of the daemon's state, through prometheus_client.

Values are read from the daemon by a custom collector each time `render` runs,
always on the loop (the table is the loop's alone): for ``wardenctl metrics``,
and each sampling turn for ``--metrics-listen`` and ``--metrics-textfile``
(`jobwarden.daemon.observe.exporter`).  Nothing is counted twice and nothing is kept
in a second place.

Every counter counts from the daemon's start and never falls, as Prometheus
expects of a process's counters (``rate`` and ``increase`` read a restart as a
reset): totals that live in job records, incident files and events are counted
by what they grew since the start (`jobwarden.daemon.stats.SinceStart`).  The
series named by job (goodput) are rendered for ``wardenctl metrics`` alone,
whose socket admits only the daemon's user and group; the listener and the
textfile, which any local user can read, hold counts by state, kind and
outcome only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from jobwarden.daemon.stats import ALL_JOBS, Key
from jobwarden.states import JobState

if TYPE_CHECKING:
    from jobwarden.daemon.incidents.goodput import Goodput
    from jobwarden.daemon.store.jobs import JobRecord
    from jobwarden.daemon.view import View

RECORDS, INCIDENTS, GOODPUT = "records", "incidents", "goodput"
"""The sources of `SinceStart` counters: job records, the incident log, each job's goodput."""


def begin(daemon: View) -> None:
    """At the daemon's start, once the table is loaded: what it holds was counted before."""
    since = daemon.stats.since_start
    jobs = [record.id for record in daemon.table]
    since.begin(RECORDS, jobs)
    since.begin(INCIDENTS, [ALL_JOBS])
    since.begin(GOODPUT, jobs)
    now = time.time()
    for record in daemon.table:  # each its baseline; a job's goodput, once it is known
        since.read(RECORDS, record.id, record_totals(record))
        goodput_since_start(daemon, record, now)
    since.read(INCIDENTS, ALL_JOBS, incident_totals(daemon))


def record_totals(record: JobRecord) -> dict[Key, float]:
    """A job record's whole-life totals."""
    return {
        ("restarts",): record.restarts,
        ("replayed_updates",): record.replayed_updates,
        ("time_lost_s",): record.time_lost_s,
    }


def incident_totals(daemon: View) -> dict[Key, float]:
    """Incidents of every kept job, by kind."""
    return {(kind,): count for kind, count in daemon.incidents.kinds.items()}


class WardendCollector:
    """Collects jobwarden_* metrics from a running daemon; ``per_job`` adds the series by job."""

    def __init__(self, daemon: View, per_job: bool) -> None:
        self.daemon = daemon
        self.per_job = per_job

    def collect(self) -> Iterator[Metric]:
        """Every metric family, computed now."""
        daemon = self.daemon
        records = list(daemon.table)
        since = daemon.stats.since_start
        since.keep({record.id for record in records})
        jobs = GaugeMetricFamily("jobwarden_jobs", "Jobs by state.", labels=["state"])
        for state in JobState:
            jobs.add_metric([state.value], sum(1 for r in records if r.state is state))
        yield jobs
        for record in records:
            since.read(RECORDS, record.id, record_totals(record))
        counted = since.summed(RECORDS)
        yield CounterMetricFamily(
            "jobwarden_restarts",
            "Recovery attempts started.",
            value=counted.get(("restarts",), 0.0),
        )
        incidents = CounterMetricFamily(
            "jobwarden_incidents", "Incidents by kind.", labels=["kind"]
        )
        since.read(INCIDENTS, ALL_JOBS, incident_totals(daemon))
        for (kind,), count in sorted(since.summed(INCIDENTS).items()):
            incidents.add_metric([kind], count)
        yield incidents
        yield CounterMetricFamily(
            "jobwarden_replayed_updates",
            "Updates done again after a recovery.",
            value=counted.get(("replayed_updates",), 0.0),
        )
        yield CounterMetricFamily(
            "jobwarden_time_lost_seconds",
            "Time from a failure to the first new update past it.",
            value=counted.get(("time_lost_s",), 0.0),
        )
        yield from stats_metrics(daemon)
        by_job = goodput_metrics(daemon, records)  # read each time, so that it counts
        if self.per_job:
            yield from by_job


def stats_metrics(daemon: View) -> Iterator[Metric]:
    """The counters the daemon keeps in memory (`Stats`) and its notification counts."""
    stats = daemon.stats
    yield CounterMetricFamily(
        "jobwarden_stall_detections", "Stalls detected.", value=stats.stalls_detected
    )
    yield CounterMetricFamily(
        "jobwarden_checkpoints", "Checkpoints committed.", value=stats.checkpoints
    )
    yield CounterMetricFamily(
        "jobwarden_checkpoint_bytes",
        "Bytes of checkpoints committed.",
        value=stats.checkpoint_bytes,
    )
    yield CounterMetricFamily(
        "jobwarden_checkpoint_seconds",
        "Seconds spent committing checkpoints.",
        value=stats.checkpoint_seconds,
    )
    intake = CounterMetricFamily(
        "jobwarden_requests", "Spool requests by outcome.", labels=["outcome"]
    )
    intake.add_metric(["accepted"], stats.intake_accepted)
    intake.add_metric(["rejected"], stats.intake_rejected)
    yield intake
    yield CounterMetricFamily(
        "jobwarden_malformed_event_lines",
        "Worker stdout lines that were not valid events.",
        value=stats.malformed_event_lines,
    )
    notifications = CounterMetricFamily(
        "jobwarden_notifications",
        "Notifications by outcome: sent, dropped after their tries, overflowed a full queue.",
        labels=["outcome"],
    )
    for outcome, count in daemon.notifications_delivered().items():
        notifications.add_metric([outcome], count)
    yield notifications


def goodput_since_start(
    daemon: View, record: JobRecord, now: float
) -> tuple[Goodput, dict[Key, float]]:
    """A job's goodput now, and its productive and badput seconds since the daemon's start
    (none while its events are still being read)."""
    found = daemon.incidents.traces.goodput(daemon.root.jobs / record.id, record.history, now)
    if found.reading:
        return found, {}
    totals: dict[Key, float] = {("productive",): found.productive_s}
    totals.update({("badput", cause): s for cause, s in found.badput_s.items()})
    return found, daemon.stats.since_start.read(GOODPUT, record.id, totals)


def goodput_metrics(daemon: View, records: list[JobRecord]) -> list[Metric]:
    """Each job's goodput (a gauge, over its whole life) and its productive and badput
    seconds since the daemon's start (counters); a job whose events are still being read
    has none of these until then, but a reading gauge."""
    now = time.time()
    share = GaugeMetricFamily(
        "jobwarden_goodput_ratio", "Share of a job's wall time on new updates.", labels=["job"]
    )
    productive = CounterMetricFamily(
        "jobwarden_productive_seconds", "Wall time a job spent on new updates.", labels=["job"]
    )
    badput = CounterMetricFamily(
        "jobwarden_badput_seconds", "Wall time a job lost, by cause.", labels=["job", "cause"]
    )
    reading = GaugeMetricFamily(
        "jobwarden_goodput_reading",
        "Attempts of a job whose events file is still being read (its goodput waits).",
        labels=["job"],
    )
    for record in records:
        found, counted = goodput_since_start(daemon, record, now)
        if found.reading:
            reading.add_metric([record.id], len(found.reading))
            continue
        if found.goodput is not None:
            share.add_metric([record.id], found.goodput)
        productive.add_metric([record.id], counted[("productive",)])
        for key, seconds in sorted(counted.items()):
            if key[0] == "badput":
                badput.add_metric([record.id, key[1]], seconds)
    return [share, productive, badput, reading]


def render(daemon: View, per_job: bool = True) -> str:
    """The exposition text; without ``per_job``, none of the series named by job."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WardendCollector(daemon, per_job))
    return generate_latest(registry).decode()
