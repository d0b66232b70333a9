"""The nodes a job's next attempt avoids (``sbatch --exclude``): those that failed under it.

A node failed under an attempt when it ran one of the attempt's members (``member.<i>.node``;
a single process: the job's batch host) and Slurm now reports it down, drained, failing
or not responding (``scontrol -o show nodes``).  The exclusion is kept in ``slurm.json``
and carried to every later attempt of the job, so a node Slurm returns to service
(``ReturnToService``) is not tried again by the job it failed; it is dropped, and logged,
when the cluster would be left with fewer nodes than the job needs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import structlog

from jobwarden.daemon.launch.base import LauncherError, LaunchSpec
from jobwarden.daemon.launch.slurm.ctl import query, slurm_command
from jobwarden.daemon.launch.slurm.script import JOB_RECORD, member_node
from jobwarden.daemon.launch.slurm.state import parse_fields

log = structlog.get_logger("wardend.slurm")
FAILED_STATES = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "NOT_RESPONDING"})


def failed(state: str) -> bool:
    """Whether a node in Slurm's ``State`` (``IDLE``, ``DOWN+NOT_RESPONDING``, ``MIXED*``)
    cannot be trusted with an attempt: any failed flag, or ``*`` (not responding)."""
    return state.endswith("*") or not FAILED_STATES.isdisjoint(state.rstrip("*").split("+"))


def plan(earlier: set[str], ran: set[str], states: dict[str, str], needed: int) -> list[str]:
    """The nodes to exclude: those excluded before, and those of ``ran`` that failed
    (``states``: every node's state); none when fewer than ``needed`` nodes would be left."""
    exclude = sorted(earlier | {node for node in ran if failed(states.get(node, ""))})
    return exclude if len(set(states) - set(exclude)) >= needed else []


async def node_states() -> dict[str, str]:
    """Every node of the cluster and its state; raises `LauncherError` when scontrol fails."""
    status, out, err = await slurm_command("scontrol", "-o", "show", "nodes")
    if status != 0:
        raise LauncherError(f"scontrol show nodes: {err.strip()}")
    fields = [parse_fields(line) for line in out.splitlines() if line.strip()]
    return {f["NodeName"]: f.get("State", "") for f in fields if "NodeName" in f}


async def exclusion(spec: LaunchSpec, needed: int) -> list[str]:
    """The nodes attempt ``spec.attempt`` avoids, from the attempt before it (`plan`)."""
    previous = spec.folder.parent / str(spec.attempt - 1)
    if spec.attempt < 2 or not previous.is_dir():
        return []
    record = _record(previous)
    listed = record.get("exclude")
    earlier = {str(node) for node in listed} if isinstance(listed, list) else set()
    ran = {node for i in range(spec.processes) if (node := member_node(previous, i))}
    try:
        if not ran and "slurm_job" in record:
            job = await query(str(record["slurm_job"]))
            ran = {job.node} if job is not None and job.node else set()
        states = await node_states()
    except LauncherError as error:
        log.warning("slurm.node_states", job=spec.job_id, error=str(error))
        return sorted(earlier)
    exclude = plan(earlier, ran, states, needed)
    wanted = plan(earlier, ran, states, 0)
    if wanted != exclude:
        log.warning("slurm.exclude_dropped", job=spec.job_id, nodes=wanted, needed=needed)
    elif exclude:
        log.info("slurm.exclude", job=spec.job_id, attempt=spec.attempt, nodes=exclude)
    return exclude


def _record(folder: Path) -> dict[str, Any]:
    try:
        found = json.loads((folder / JOB_RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
