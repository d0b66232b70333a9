"""The run a job's program keeps: its own ``steps`` and ``checkpoint_every``.

A task runs the ``[run]`` of its job file.  A command job's SDK program may keep its own
settings where its ``[run]`` leaves them out (the run file gives the program only the
fields the job file sets); it reports them in its ``started`` event, and the daemon keeps
them in the job's record (`JobRecord.program_run`) for status, metrics and runbooks.  A
plain program (``sdk = false``) reports none.
"""

from __future__ import annotations

from collections.abc import Mapping

from jobwarden.jobfile import Job


def run_value(job: Job, reported: Mapping[str, int] | None, name: str) -> int | None:
    """``name`` (``steps`` or ``checkpoint_every``) of the run: as the program reported it,
    else as its job file gives it to the program; None when neither is known (a plain
    program, or an SDK program before its first ``started``)."""
    found = (reported or {}).get(name)
    if isinstance(found, int):
        return found
    program = job.program
    if program is None or (program.sdk and name in job.run.model_fields_set):
        value: int = getattr(job.run, name)
        return value
    return None
