"""``wardenctl drill``: rehearse a failure through a real daemon and keep the evidence.

Each drill hands the daemon a faulted copy of the drilled job (the default linreg job, or a
user's own job file), as an operator would, and checks the outcome update by update against
an uninterrupted reference copy of it; the drills of one run share that reference.  Where a
state differs, the verdict names the first diverging step, the state component and the leaf.
With no ``--root`` a private daemon is started on ``OUT/root`` and stopped afterwards, and
``all`` runs every drill in it at once; with ``--root`` the drills run one after the other.
Each drill's evidence bundle, under ``OUT/<drill>/``: the failure timeline, the accepted
checkpoint's identity, the full-state comparison of every resumed update, the refusals, the
incident records and rendered runbooks, ``loss.svg`` and ``verdict.json``.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from jobwarden.control.drill.cases import DRILLS
from jobwarden.control.drill.context import Drill, DrillParams, Reference
from jobwarden.control.drill.daemon import JobRejected, daemon_for
from jobwarden.control.drill.divergence import first_difference
from jobwarden.control.drill.jobs import DrillJob, DrillJobError
from jobwarden.control.drill.plan import FaultPoints
from jobwarden.control.drill.setup import fault_points, learn_run, prepare
from jobwarden.control.drill.verdict import Check, DrillResult
from jobwarden.events import step_ranges

__all__ = [
    "DRILLS",
    "DrillJob",
    "DrillJobError",
    "DrillParams",
    "DrillResult",
    "prepare",
    "render",
    "run_drills",
]

# Jobs a drill has in the daemon at once, at most (the duplicate-writer drill's primary and
# its refused second job); the private daemon gets a slot for each, and one for the reference.
JOBS_PER_DRILL = 2


AS_DESIGNED = {
    "incompatible": "refused as designed",
    "duplicate-writer": "the second writer refused as designed",
}
"""The verdict of a drill that by design recovers nothing: what it proves instead."""


def run_drills(
    names: list[str],
    root: Path | None,
    out: Path,
    job: DrillJob,
    params: DrillParams,
    *,
    compile_cache: Path | None = None,
) -> list[DrillResult]:
    """Run the named drills on ``job`` in one daemon, each writing its evidence under
    ``out/<name>``; their faults go where ``job``'s ``[run]`` has room (`fault_points`, with
    the fault points of ``params`` when given).

    Raises `DrillJobError` when a program that keeps its own ``[run]`` turns out to have no
    room for a named drill's fault: the reference run has to say what its ``[run]`` is.
    In the private daemon (no ``root``, compiling into ``compile_cache`` when given) the
    drills run at once, one thread each; in the daemon of ``root``, whose slots belong to
    its operator, one after the other.  The results come in the order of ``names``.
    """
    out.mkdir(parents=True, exist_ok=True)
    stamp = f"{time.strftime('%H%M%S')}-{time.time_ns() % 10**6:06d}"
    slots = JOBS_PER_DRILL * len(names) + 1
    with daemon_for(root, out / "root", compile_cache=compile_cache, slots=slots) as handle:
        reference = Reference(
            handle, job, job.tag(names[0] if len(names) == 1 else "all", stamp) + "-reference"
        )
        try:
            reference.submit()
            job = learn_run(job, reference)
        except JobRejected as error:
            return [_rejected(name, job, _fresh(out / name), error) for name in names]
        points = fault_points(job, names, params)
        drills = [
            Drill(handle, job, points, _fresh(out / name), job.tag(name, stamp), reference)
            for name in names
        ]
        if not handle.private or len(drills) == 1:
            return [_run(name, drill) for name, drill in zip(names, drills, strict=True)]
        pool = ThreadPoolExecutor(max_workers=len(drills), thread_name_prefix="drill")
        try:
            futures = [
                pool.submit(_run, name, drill) for name, drill in zip(names, drills, strict=True)
            ]
            return [future.result() for future in futures]
        except BaseException:
            handle.abandoned.set()  # the other drills stop at their next poll
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _fresh(folder: Path) -> Path:
    """An empty evidence folder."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def _run(name: str, drill: Drill) -> DrillResult:
    """One drill, its verdict kept as ``verdict.json`` in its evidence folder."""
    try:
        checks, summary = DRILLS[name](drill)
    except JobRejected as error:
        return _rejected(name, drill.job, drill.out, error, drill.points)
    plot = drill.out / "loss.svg"
    summary["plot"] = str(plot) if plot.exists() else None
    about = _about(drill.job, drill.points)
    return _kept(
        DrillResult(name, checks, drill.out, about | summary | first_difference(drill.report))
    )


def _about(job: DrillJob, points: FaultPoints | None) -> dict[str, Any]:
    """What was drilled, for the verdict: the job and its fault points."""
    return {
        "drilled_job": job.name,
        "job_file": None if job.is_default else job.origin,
        "fault_points": dataclasses.asdict(points) if points else None,
    }


def _rejected(
    name: str, job: DrillJob, out: Path, error: JobRejected, points: FaultPoints | None = None
) -> DrillResult:
    """The verdict of a drill whose job the daemon would not take."""
    check = Check("the daemon took the drill's job in", False, error.evidence)
    summary = _about(job, points) | first_difference(None)
    return _kept(DrillResult(name, [check], out, summary))


def _kept(result: DrillResult) -> DrillResult:
    (result.out / "verdict.json").write_text(
        json.dumps(result.as_record(), indent=2, default=str) + "\n"
    )
    return result


def render(result: DrillResult) -> str:
    """One drill's verdict for a terminal."""
    summary = result.summary
    lines = [
        f"drill {result.drill} of {summary.get('drilled_job', 'the default job')}: "
        + ("PASS" if result.ok else "FAIL")
    ]
    for check in result.checks:
        shown = ", ".join(
            f"{k}={v}"
            for k, v in check.observed.items()
            if v is not None and (not isinstance(v, dict | list) or len(str(v)) < 120)
        )
        lines.append(
            f"  [{'ok' if check.ok else 'FAIL'}] {check.name}" + (f": {shown}" if shown else "")
        )
    if summary.get("restored_step") is not None:
        lines.append(f"restored step: {summary['restored_step']}")
        lines.append(f"replayed steps: {step_ranges(summary['replayed_steps'] or [])}")
    if "all_hashes_equal" in summary:
        lines.append(
            "every state hash matched the reference: "
            + ("yes" if summary["all_hashes_equal"] else "NO")
        )
    if summary.get("first_diverging_step") is not None:
        leaf = f", leaf {summary['leaf']}" if summary.get("leaf") else ""
        lines.append(
            f"first diverging step: {summary['first_diverging_step']} "
            f"({summary['diverged_in']}), component {summary['component']}{leaf}"
        )
        lines.append(f"  {summary['explanation']}")
    for name in ("runbook", "plot"):
        if summary.get(name):
            lines.append(f"{name}: {summary[name]}")
    lines.append(f"evidence: {result.out}")
    lines.append(
        "verdict: "
        + (
            f"PASS, {AS_DESIGNED.get(result.drill, 'recovery verified')}"
            if result.ok
            else f"FAIL: {'; '.join(result.failed)}"
        )
    )
    return "\n".join(lines)
