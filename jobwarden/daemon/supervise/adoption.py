"""After the daemon's own restart: follow a live attempt again instead of ending it.

A launcher whose attempts do not depend on the daemon's process (Slurm: the
worker runs on a node, its events go to files) can hand back the job's last
attempt (`Launcher.adopt`).  The supervisor then follows it as if it had
started it: its files are read from their first line, so progress, replay
checks and the stall watch pick up where they are, and the writer stays the
one that holds the checkpoint (no new generation, nothing to fence).

An attempt that was itself a recovery keeps its proof: the incident a killed
daemon left open for it is carried on, with a replay plan rebuilt from the
failed attempt's events, and checked again from the first replayed update.
Any other incident left open is concluded as interrupted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from jobwarden.daemon.incidents.records import Incident
from jobwarden.daemon.launch.base import LaunchSpec, RunningAttempt
from jobwarden.daemon.store.jobs import JobRecord
from jobwarden.daemon.supervise.attempt import stdout_name
from jobwarden.daemon.supervise.verification import ReplayVerifier
from jobwarden.jobfolder import EVENTS_FILE
from jobwarden.proof.replay import ReplayPlan
from jobwarden.states import JobState

if TYPE_CHECKING:
    from jobwarden.daemon.supervise.services import Services

log = structlog.get_logger("wardend.adoption")

S = JobState
ADOPTABLE = frozenset({S.STARTING, S.RUNNING, S.RECOVERING})
"""States whose attempt may be followed again; a stop under way (stalled, say) is finished
by a new attempt, as before."""
EXIT_FILE = "exit.json"


async def adopt(
    s: Services, record: JobRecord, left_open: list[Incident]
) -> tuple[RunningAttempt, ReplayVerifier | None] | None:
    """The job's last attempt, followed again, and its recovery's verifier if it was one;
    None when there is nothing to adopt (the caller recovers by a new attempt)."""
    folder = s.root.attempt(record.id, record.attempt)
    if record.state not in ADOPTABLE or record.attempt < 1 or (folder / EXIT_FILE).exists():
        return None
    job = record.job if record.attempt == 1 else record.job.without_faults()
    spec = LaunchSpec(
        record.id,
        record.attempt,
        folder,
        [],
        {},
        processes=job.run.processes,
        stdout=stdout_name(job),
        job=job,
    )
    running = await s.launcher.adopt(spec)
    if running is None:
        return None
    failed = record.attempt - 1
    carried = [i for i in left_open if i.attempt == failed and failed >= 1]
    verifier = None
    if carried:
        plan = ReplayPlan.from_events(failed, s.root.attempt(record.id, failed) / EVENTS_FILE)
        verifier = ReplayVerifier(plan, carried[0])
    rest = [i for i in left_open if i not in carried[:1]]
    s.incidents.interrupt(rest, f"attempt {record.attempt} was re-adopted")
    log.info(
        "attempt.adopted",
        job=record.id,
        attempt=record.attempt,
        launcher=s.launcher.name,
        recovery=verifier is not None,
    )
    return running, verifier
