"""The crash and stall drills of a job of N cooperating processes (``--processes N``).

The fault is aimed at one member (`DRILLED_MEMBER`, ``[faults] process``), and the
drill checks every member apart: each member's updates after the restore, from its own
``events.<i>.jsonl``, against the same member of the reference run (also N processes),
and the daemon's check of each member's replay against that member's own log of the
failed attempt, as ``members.json`` of the recovery attempt records it.  Member 0's
replay is proven by the daemon's incident, as for a single process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jobwarden.control.drill.context import Drill
from jobwarden.control.drill.verdict import Check
from jobwarden.events import Event, read_events
from jobwarden.jobfolder import EVENTS_FILE, attempt_folder

DRILLED_MEMBER = 1
"""The member a drill of several processes fails or hangs: not member 0, which holds the
writer lock, so the drill shows that a member without it takes the whole group down."""
STACK_MARKS = ("Thread 0x", "Current thread")
"""What a Python stack dump (faulthandler) starts with."""


def aimed(drill: Drill, faults: dict[str, Any]) -> dict[str, Any]:
    """``faults`` aimed at `DRILLED_MEMBER` when the job has several members."""
    return {**faults, "process": DRILLED_MEMBER} if drill.job.processes > 1 else faults


def drilled(drill: Drill) -> int:
    """The member the drill's fault hits (member 0 of a single process)."""
    return DRILLED_MEMBER if drill.job.processes > 1 else 0


def events_file(index: int) -> str:
    """Member ``index``'s event log in an attempt folder, as the daemon names it: member 0's
    is ``events.jsonl``, member i's ``events.<i>.jsonl``."""
    return EVENTS_FILE if index == 0 else f"events.{index}.jsonl"


def member_events(
    drill: Drill, job: str, index: int, first_attempt: int = 1, last_attempt: int | None = None
) -> list[Event]:
    """Member ``index``'s valid events of the attempts from ``first_attempt`` to
    ``last_attempt`` (None: the last), in order."""
    found: list[Event] = []
    for folder in _attempts(drill, job):
        path = folder / events_file(index)
        within = first_attempt <= int(folder.name) <= (last_attempt or int(folder.name))
        if within and path.exists():
            found += [e for e in read_events(path) if isinstance(e, Event)]
    return found


def members_record(drill: Drill, job: str, attempt: int) -> dict[str, Any]:
    """The ``members.json`` the daemon kept for one attempt of the job; empty when none."""
    path = attempt_folder(drill.folder(job), attempt) / "members.json"
    try:
        loaded: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded


def member_checks(
    drill: Drill, reference: str, job: str, restored: int, incident: dict[str, Any]
) -> tuple[list[Check], list[dict[str, Any]]]:
    """Two checks per member, and a summary line per member: its resumed updates equal the
    reference's same member at every step after ``restored``, and its replay was verified
    against its own log of the failed attempt."""
    if drill.job.processes == 1:
        return [], []
    steps = list(range(restored + 1, drill.points.steps + 1))
    last = max((int(f.name) for f in _attempts(drill, job)), default=1)
    record = members_record(drill, job, last).get("members") or []
    daemon_checks = len((incident.get("verification") or {}).get("checks", []))
    checks: list[Check] = []
    lines: list[dict[str, Any]] = []
    for index in range(drill.job.processes):
        ref = {e["step"]: e.get("state_hash") for e in _progress(drill, reference, index, 1)}
        resumed = _progress(drill, job, index, 2)
        differing = [e["step"] for e in resumed if ref.get(e["step"]) != e.get("state_hash")]
        replayed = [e["step"] for e in resumed]
        mine: dict[str, Any] = next((m for m in record if m.get("process") == index), {})
        if index == 0:  # member 0's replay is the daemon's own proof (the incident)
            count, proven = daemon_checks, incident.get("status") == "verified"
        else:
            count, proven = int(mine.get("replay_checks", 0)), bool(mine.get("replay_ok"))
        verified = proven and count > 0
        line = {
            "process": index,
            "replayed_steps": replayed,
            "differing_steps": differing,
            "replay_checks": count,
            "replay_verified": verified,
            "exit_status": mine.get("exit_status"),
        }
        lines.append(line)
        checks += [
            Check(
                f"member {index}: every resumed update's state equals the reference's member "
                f"{index}",
                replayed == steps and not differing,
                {"replayed_steps": replayed, "expected": steps, "differing_steps": differing},
            ),
            Check(
                f"member {index}: its replay was verified against its own log of the failed "
                "attempt",
                verified,
                {"replay_checks": count, "by": "incident" if index == 0 else "members.json"},
            ),
        ]
    return checks, lines


def crash_checks(drill: Drill, job: str) -> list[Check]:
    """The group's first attempt ended by the drilled member's failure (several members)."""
    if drill.job.processes == 1:
        return []
    first = members_record(drill, job, 1)
    return [
        Check(
            f"the attempt failed by member {DRILLED_MEMBER}, and every member was stopped",
            first.get("failed_member") == DRILLED_MEMBER
            and all(m.get("exit_status") is not None for m in first.get("members", [])),
            {
                "failed_member": first.get("failed_member"),
                "exit_statuses": [m.get("exit_status") for m in first.get("members", [])],
            },
        )
    ]


def stall_checks(drill: Drill, job: str, incident: dict[str, Any]) -> list[Check]:
    """The stall named the hung member, and every member's stacks were dumped."""
    if drill.job.processes == 1:
        return []
    details = incident.get("details", {})
    folder = attempt_folder(drill.folder(job), 1)
    stacks = {}
    for index in range(drill.job.processes):
        path = folder / ("stderr.log" if index == 0 else f"stderr.{index}.log")
        text = path.read_text(errors="replace") if path.exists() else ""
        stacks[index] = any(mark in text for mark in STACK_MARKS)
    return [
        Check(
            f"the stall names member {DRILLED_MEMBER}, the one that hung",
            details.get("stalled_member") == DRILLED_MEMBER and details.get("missing") == [],
            {"stalled_member": details.get("stalled_member"), "missing": details.get("missing")},
        ),
        Check(
            "every member's stacks were dumped into its stderr",
            all(stacks.values()),
            {"dumped": [i for i, ok in stacks.items() if ok]},
        ),
    ]


def _attempts(drill: Drill, job: str) -> list[Path]:
    folders = [p for p in drill.folder(job).glob("attempts/*") if p.name.isdigit()]
    return sorted(folders, key=lambda p: int(p.name))


def _progress(drill: Drill, job: str, index: int, first_attempt: int) -> list[Event]:
    return [e for e in member_events(drill, job, index, first_attempt) if e.kind == "progress"]
