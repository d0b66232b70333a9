"""What a job just submitted will resume, told at submit when it is not what a user expects.

A new job of an existing checkpoint directory resumes its newest checkpoint:
``submit --replace`` archives the old job but keeps that directory.  Two
resumes surprise: a checkpoint at the end of the run (the job "completes" at
once and trains nothing) and one saved with another training config (its
restore refuses it and the job escalates).  `warnings` names them, each
with the remedy, ``submit --replace --fresh``, which archives the directory
with the old job so that the new one starts from step 0.

Only the newest committed checkpoint's header is read, not its data; a
command job's program holds its own config and step count, so for it only
the end of a run is told, from the job file's ``steps`` or from the archived
job of that checkpoint that completed at that very step.
"""

from __future__ import annotations

from jobwarden.checkpoint import format
from jobwarden.checkpoint.errors import CheckpointError, ConfigMismatch
from jobwarden.checkpoint.store import CheckpointStore
from jobwarden.checkpoint.validate import check_config
from jobwarden.daemon.store import archive
from jobwarden.daemon.store.layout import Root
from jobwarden.jobfile import Job

FRESH = "submit --replace --fresh to start from step 0 (the checkpoints are archived, not deleted)"
"""The remedy every warning ends with."""


def warnings(root: Root, job: Job) -> list[str]:
    """What the newest checkpoint of ``job``'s directory makes of its resume, if surprising
    (reads files: run it in a thread)."""
    if job.run.resume == "never":
        return []
    directory = root.checkpoints / job.checkpoint
    try:
        committed = CheckpointStore(directory).committed() if directory.is_dir() else []
        if not committed:
            return []
        step, path = committed[-1]
        manifest = format.read_manifest(path)[0]
    except (OSError, CheckpointError):
        return []  # nothing a resume could take: the worker says so itself
    named = f"job {job.id} resumes checkpoint {job.checkpoint!r} at step {step}"
    if job.task is not None:
        try:
            check_config(str(path), manifest, job.task, job.train_fields())
        except ConfigMismatch as error:
            return [
                f"{named}, whose {error.detail}; a restore refuses it and the job escalates; "
                + FRESH
            ]
    ends = end_of_run(root, job, step)
    if ends is None:
        return []
    return [f"{named}, {ends}: the job completes at once, training nothing; {FRESH}"]


def end_of_run(root: Root, job: Job, step: int) -> str | None:
    """Where ``step`` is the end of ``job``'s run, how that is known; else None."""
    if job.task is not None or "steps" in job.run.model_fields_set:
        return f"the end of its run (steps = {job.run.steps})" if step >= job.run.steps else None
    finished = [
        row
        for row in archive.rows(root)
        if row.get("checkpoint") == job.checkpoint
        and row.get("state") == "completed"
        and row.get("step") == step
    ]
    if not finished:
        return None
    return f"where the archived job {finished[-1]['id']} completed"
