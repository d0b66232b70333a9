"""How a multi-process attempt's members ended, in words: the one that failed first, and
what its failure did to the others.

Pure functions of the members' view (``members.json``, `GroupAttempt.members_view`), for
the incident's symptom and runbook.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def where(member: Mapping[str, Any]) -> str:
    """``pid 41 on node-a``: what names the member's process."""
    pid, node = member.get("pid"), member.get("node")
    place = f"pid {pid}" if pid is not None else "no pid known"
    return f"{place} on {node}" if node else place


def how_ended(member: Mapping[str, Any]) -> str:
    """``was killed by SIGKILL``, ``exited 1 (worker.crash)``, or ``exited 0 before it
    completed``."""
    if member.get("exit_signal"):
        return f"was killed by {member['exit_signal']}"
    status = member.get("exit_status")
    if status is None:
        return "did not end"
    failure = member.get("failure")
    if status == 0:
        return "exited 0 before it completed"
    return f"exited {status}" + (f" ({failure})" if failure else "")


def consequence(member: Mapping[str, Any]) -> str:
    """What became of a member after another had failed first."""
    index = member.get("process")
    if member.get("stopped"):
        ended = member.get("exit_signal") or f"status {member.get('exit_status')}"
        return f"member {index} was then stopped by the daemon ({ended})"
    text = f"member {index} then {how_ended(member)}"
    if member.get("peer_lost"):
        return f"{text}: the collective lost its peer"
    return text


def first_failure(view: Mapping[str, Any] | None) -> str | None:
    """``Member 1 (pid 41 on node-a) failed first: it was killed by SIGKILL after update 9;
    member 0 then exited 1: the collective lost its peer.``; None when no member failed."""
    if not view or view.get("failed_member") is None:
        return None
    members = list(view.get("members") or [])
    index = view["failed_member"]
    first = next((m for m in members if m.get("process") == index), None)
    if first is None:
        return None
    step = first.get("step") or 0
    after = f" after update {step}" if step else " before its first update"
    text = f"Member {index} ({where(first)}) failed first: it {how_ended(first)}{after}"
    others = [consequence(m) for m in members if m.get("process") != index]
    return "; ".join([text, *others]) + "."


def runbook_line(first: int, stderr: object) -> str:
    """The runbook's line for a multi-process failure: where to look first."""
    return (
        f"Member {first} failed first: read its stderr ({stderr}) before the others'. "
        "The other members' errors follow from it (a collective cannot go on without "
        "every member), so the cause is not in theirs."
    )
