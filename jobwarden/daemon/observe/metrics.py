"""Prometheus text exposition of the daemon's state, through prometheus_client.

Values are read from the daemon by a custom collector each time `render` runs,
always on the loop (the table is the loop's alone): for ``wardenctl metrics``,
and each sampling turn for ``--metrics-listen`` and ``--metrics-textfile``
(`jobwarden.daemon.observe.exporter`).  Nothing is counted twice and nothing is kept
in a second place.  Totals that
live in job records (restarts, replayed updates, time lost) survive daemon
restarts; the rest count from the daemon's start.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from jobwarden.states import JobState

if TYPE_CHECKING:
    from jobwarden.daemon.store.jobs import JobRecord
    from jobwarden.daemon.view import View


class WardendCollector:
    """Collects jobwarden_* metrics from a running daemon."""

    def __init__(self, daemon: View) -> None:
        self.daemon = daemon

    def collect(self) -> Iterator[Metric]:
        """Every metric family, computed now."""
        daemon = self.daemon
        records = list(daemon.table)
        jobs = GaugeMetricFamily("jobwarden_jobs", "Jobs by state.", labels=["state"])
        for state in JobState:
            jobs.add_metric([state.value], sum(1 for r in records if r.state is state))
        yield jobs
        yield CounterMetricFamily(
            "jobwarden_restarts",
            "Recovery attempts started.",
            value=sum(r.restarts for r in records),
        )
        incidents = CounterMetricFamily(
            "jobwarden_incidents", "Incidents by kind.", labels=["kind"]
        )
        for kind, count in sorted(daemon.incidents.kinds.items()):
            incidents.add_metric([kind], count)
        yield incidents
        yield CounterMetricFamily(
            "jobwarden_replayed_updates",
            "Updates done again after a recovery.",
            value=sum(r.replayed_updates for r in records),
        )
        yield CounterMetricFamily(
            "jobwarden_time_lost_seconds",
            "Time from a failure to the first new update past it.",
            value=sum(r.time_lost_s for r in records),
        )
        yield CounterMetricFamily(
            "jobwarden_stall_detections",
            "Stalls detected.",
            value=daemon.stats.stalls_detected,
        )
        stats = daemon.stats
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
        intake.add_metric(["accepted"], daemon.stats.intake_accepted)
        intake.add_metric(["rejected"], daemon.stats.intake_rejected)
        yield intake
        yield CounterMetricFamily(
            "jobwarden_malformed_event_lines",
            "Worker stdout lines that were not valid events.",
            value=daemon.stats.malformed_event_lines,
        )
        notifications = CounterMetricFamily(
            "jobwarden_notifications",
            "Notifications by outcome: sent, dropped after their tries, overflowed a full queue.",
            labels=["outcome"],
        )
        for outcome, count in daemon.notifications_delivered().items():
            notifications.add_metric([outcome], count)
        yield notifications
        yield from goodput_metrics(daemon, records)


def goodput_metrics(daemon: View, records: list[JobRecord]) -> Iterator[Metric]:
    """Each job's goodput (a gauge) and its productive and badput seconds (counters); a job
    whose events are still being read has none of these until then, but a reading gauge."""
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
        found = daemon.incidents.traces.goodput(daemon.root.jobs / record.id, record.history, now)
        if found.reading:
            reading.add_metric([record.id], len(found.reading))
            continue
        if found.goodput is not None:
            share.add_metric([record.id], found.goodput)
        productive.add_metric([record.id], found.productive_s)
        for cause, seconds in found.badput_s.items():
            badput.add_metric([record.id, cause], seconds)
    yield share
    yield productive
    yield badput
    yield reading


def render(daemon: View) -> str:
    """The exposition text."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WardendCollector(daemon))
    return generate_latest(registry).decode()
