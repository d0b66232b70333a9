"""How a plain program's incidents read: a program that uses no SDK, seen from outside.

What could not be known is said plainly: it emits no events, gives no stack
dump, and logs no state, so its recoveries are unverified.  The evidence is
its exit, its heartbeat (`daemon.heartbeat`), its last line of output and its
stderr.
"""

from __future__ import annotations

from typing import Any

from jobwarden.daemon.incidents.records import Incident
from jobwarden.daemon.launch.base import ExitInfo
from jobwarden.daemon.supervise import budget
from jobwarden.daemon.supervise.attempt import Attempt
from jobwarden.daemon.supervise.stallevidence import STALL_KILL_GRACE_S
from jobwarden.errors import IncidentKind

K = IncidentKind


def symptom(attempt: Attempt, info: ExitInfo, kind: IncidentKind) -> str:
    """What was seen of a plain program: its exit, its heartbeat and its last output."""
    record, beat = attempt.record, attempt.heartbeat
    name = f"Attempt {attempt.number} of job {record.id} ({record.job.label()})"
    if beat is None or beat.section is None:
        heard = "it has no heartbeat"
    else:
        heard = f"its last heartbeat was {beat.last_beat}" if beat.last_beat else "no heartbeat yet"
    said = (
        f"; its last line of output was {beat.last_line!r}"
        if beat is not None and beat.last_line
        else "; it wrote nothing on stdout"
    )
    ev = attempt.stall_evidence
    if kind is K.STALL and ev is not None and beat is not None and beat.section is not None:
        cpu = ev.get("cpu_during_gap") or {}
        return (
            f"{name} showed no heartbeat ({beat.section.describe()}) for {ev['gap_s']:.2f} s "
            f"(timeout {ev['timeout_s']:g} s, overshoot {ev['overshoot_s'] * 1000:.0f} ms); "
            f"{heard}{said}. psutil status {ev.get('psutil_status')}, CPU "
            f"{cpu.get('cpu_s')} s over {cpu.get('over_s')} s ({cpu.get('percent')}%). It "
            f"was stopped (SIGTERM, {STALL_KILL_GRACE_S:g} s grace, SIGKILL to its process "
            "group); a plain program is sent no SIGUSR1, so there is no stack dump."
        )
    how = f"was killed by {info.signal}" if info.signal else f"exited with status {info.status}"
    return (
        f"{name} {how} after {info.duration_s:.2f} s; {heard}{said}. It uses no SDK, so it "
        "reported no failure of its own: read its stderr."
    )


def unverified_text(attempt: Attempt) -> str:
    """The outcome of a plain program's recovery, concluded as its attempt starts."""
    return (
        f"Restarted, unverified: attempt {attempt.number} of "
        f"{attempt.record.job.label()} runs. The program uses no SDK and logged no "
        "state, so whether it continued the same experiment cannot be checked; "
        "jobwarden.sdk in its loop would make its recoveries verifiable."
    )


def recovery_action(attempt: Attempt, incident: Incident) -> dict[str, Any]:
    """What the daemon did to recover a plain program, for the incident's Action section."""
    record, pid = attempt.record, attempt.running.pid
    delay = incident.details.get("backoff_s", 0.0)
    spec = attempt.running.spec
    return {
        "attempt": attempt.number,
        "pid": pid,
        "text": (
            f"Started attempt {attempt.number} (pid {pid}) of {record.job.label()} in "
            f"{spec.cwd or spec.folder} after a {delay:.2f} s backoff "
            f"({budget.restart_count(record)}), its "
            f"run file naming checkpoint directory '{record.checkpoint}'. What it "
            "resumes from is the program's own: nothing was logged to check it against."
        ),
    }


def prevention(attempt: Attempt, kind: IncidentKind, incident: Incident) -> list[str]:
    """Prevention work for a plain program's failure."""
    lines = [
        f"Read the program's stderr in {incident.evidence['stderr']} and its output in "
        f"{incident.evidence['output']}. It uses no SDK, so its recoveries cannot be "
        "verified and a stall gives no stack dump: a few lines of jobwarden.sdk in its "
        "loop give validated checkpoints and replay proofs (docs/sdk.md)."
    ]
    if kind is K.RSS_LIMIT:
        limit = attempt.record.job.supervision.max_rss_mb
        lines.append(f"Raise [supervision] max_rss_mb (now {limit}).")
    return lines
