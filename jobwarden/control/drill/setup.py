"""Before the drills run: the job they copy, and where their faults go.

`prepare` reads the drilled job (a user's job file, or the default job) and, when its
``[run]`` is known, checks that every named drill has room for its fault, before any daemon
starts.  A command job whose program keeps its own ``[run]`` is planned once the reference
run has said what that is (`learn_run`).
"""

from __future__ import annotations

from pathlib import Path

from jobwarden.control.drill.context import DrillParams, Reference
from jobwarden.control.drill.jobs import DrillJob, DrillJobError, default_job, load_job_file
from jobwarden.control.drill.plan import DrillPlanError, FaultPoints, plan
from jobwarden.jobfile import RunSection

GROUP_DRILLS = ("crash", "stall")
"""The drills that rehearse a job of several processes, a fault aimed at one member."""


def prepare(names: list[str], job_file: Path | None, params: DrillParams) -> DrillJob:
    """The job the drills copy (``job_file``, else the default job of ``params``); raises
    `DrillJobError` naming every problem, its fault points' included when they are known."""
    if job_file is not None:
        job = load_job_file(job_file)
    else:
        job = default_job(params.task, params.seed, params.steps, params.checkpoint_every)
    if params.processes is not None:
        job = job.with_processes(params.processes)
    if job.run is not None:
        fault_points(job, names, params)
    return job


def fault_points(job: DrillJob, names: list[str], params: DrillParams) -> FaultPoints:
    """Where the faults of ``names`` go in ``job`` (whose ``[run]`` is known); raises
    `DrillJobError` for every drill the job has no room for."""
    problems = []
    if job.run is None:
        raise DrillJobError(job.origin, ["the job's [run] is not known yet"])
    try:
        points = plan(
            job.run.steps,
            job.run.checkpoint_every,
            job.run.keep_checkpoints,
            names,
            fail_after=params.fail_after,
            stall_at=params.stall_at,
        )
    except DrillPlanError as error:
        problems += error.problems
    if job.run.resume != "auto":
        problems.append(
            f"[run] resume = {job.run.resume!r}: every drill starts its jobs on fresh "
            "checkpoint directories and rehearses a resume, which that policy refuses; drill a "
            'copy with resume = "auto"'
        )
    if "incompatible" in names and job.change is None:
        problems.append(
            "the incompatible drill changes a training field, and the job has none that its "
            "task's schema lets change"
        )
    unready = [name for name in names if name not in GROUP_DRILLS]
    if job.processes > 1 and unready:
        problems.append(
            f"processes = {job.processes}: "
            + (
                f"the {unready[0]} drill rehearses"
                if len(unready) == 1
                else f"the {', '.join(unready)} drills rehearse"
            )
            + " one process only; with several, drill "
            f"{' or '.join(GROUP_DRILLS)} (docs/multiprocess.md)"
        )
    if problems:
        raise DrillJobError(job.origin, problems)
    return points


def learn_run(job: DrillJob, reference: Reference) -> DrillJob:
    """``job`` with its program's own ``[run]``, as the reference run's ``started`` event
    reports it; raises `DrillJobError` if the reference ends without starting."""
    if job.run is not None:
        return job
    started = reference.started()
    return job.learned(RunSection.model_validate(started["run"]))
