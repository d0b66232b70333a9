"""What the control handlers (`api`) and the observers (`observe`) may read of the daemon.

`Wardend` satisfies this `View`; the handlers and the collectors are written
against it alone, so that they never import the loop that owns them (and so
that a test can hand them a daemon of its own making).  Every member is read
on the loop; the three methods are the only actions a handler takes on jobs
that a supervisor may hold.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from jobwarden.daemon.config import Options
    from jobwarden.daemon.incidents.records import IncidentLog
    from jobwarden.daemon.intake.queue import Intake
    from jobwarden.daemon.intake.spool import Spool
    from jobwarden.daemon.stats import Stats
    from jobwarden.daemon.store.jobs import JobRecord, JobTable
    from jobwarden.daemon.store.layout import Root
    from jobwarden.daemon.supervise.supervisor import JobSupervisor


class View(Protocol):
    """The daemon as its handlers and observers see it."""

    @property
    def root(self) -> Root:
        """The daemon's root folder."""

    @property
    def options(self) -> Options:
        """The settings it runs with."""

    @property
    def table(self) -> JobTable:
        """Every job's record."""

    @property
    def incidents(self) -> IncidentLog:
        """Every job's incidents."""

    @property
    def supervisors(self) -> Mapping[str, JobSupervisor]:
        """The supervisor of each job that holds a slot."""

    @property
    def stats(self) -> Stats:
        """The counters since the daemon started."""

    @property
    def started(self) -> float:
        """When the daemon started (wall time)."""

    @property
    def shutting_down(self) -> bool:
        """Whether the daemon has begun to stop."""

    @property
    def stopping(self) -> asyncio.Event:
        """Set to make the daemon stop (its workers preempted first)."""

    @property
    def spool(self) -> Spool:
        """The spool, and what it rejected."""

    @property
    def intake_queue(self) -> Intake:
        """Where a submitted request is taken in."""

    def metrics_text(self) -> str:
        """The Prometheus exposition of the daemon's state now (`observe.metrics.render`)."""

    def notifications_delivered(self) -> dict[str, int]:
        """Hook and webhook events sent, dropped and overflowed since the daemon started."""

    def is_live(self, job_id: str) -> bool:
        """Whether the job has an attempt running now."""

    def stop_job(self, record: JobRecord) -> dict[str, Any] | None:
        """Preempt a job (its worker commits its current step); None when nothing runs."""

    def resume_job(self, record: JobRecord) -> dict[str, Any]:
        """Queue a preempted, failed or escalated job again, after a person has decided."""
