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
    """``was killed by SIGKILL``, ``exited 1 (worker.crash)``, ``exited 0 before it
    completed``, or ``was lost with its node (n2, DOWN+NOT_RESPONDING)``."""
    if member.get("node_lost"):
        return f"was lost with its node ({member['node_lost']})"
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


def runbook_line(first: int, stderr: object, lost: str | None = None) -> str:
    """The runbook's line for a multi-process failure: where to look first (``lost``: the
    node lost under the member, ``n2, DOWN*``, when it was the machine that failed)."""
    if lost:
        return lost_node_line(first, lost)
    return (
        f"Member {first} failed first: read its stderr ({stderr}) before the others'. "
        "The other members' errors follow from it (a collective cannot go on without "
        "every member), so the cause is not in theirs."
    )


def lost_node(view: Mapping[str, Any], index: int) -> str | None:
    """The lost node of member ``index`` in the members' view, if its node was lost."""
    found = (m for m in view.get("members") or [] if m.get("process") == index)
    return next((m.get("node_lost") for m in found), None)


def lost_node_line(first: int, lost: str) -> str:
    """The runbook's line when member ``first``'s node was lost under it (``n2, DOWN*``)."""
    node = lost.split(",", 1)[0]
    return (
        f"Member {first}'s node was lost ({lost}): the cause is the machine, not the "
        "program, and the other members' errors follow from it. The next attempt excludes "
        f"{node} where the cluster has nodes enough (slurm.json's exclude); "
        f"`scontrol show node {node}` gives Slurm's reason."
    )
