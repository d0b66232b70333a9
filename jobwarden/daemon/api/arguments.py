"""What every control handler checks first: the job named, and bounded integer arguments.

Its own module so that the handler modules (commands, lifecycle, tailing,
examine) share it without importing each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobwarden.daemon.store.jobs import JobRecord
from jobwarden.protocol import MAX_INT, ControlError, is_int

if TYPE_CHECKING:
    from jobwarden.daemon.view import View


def job_record(daemon: View, args: dict[str, Any]) -> JobRecord:
    """The record named by ``args["job"]``; raises control.no_such_job."""
    job_id = args.get("job")
    record = daemon.table.get(job_id) if isinstance(job_id, str) else None
    if record is None:
        raise ControlError("control.no_such_job", f"no job {job_id!r:.80}")
    return record


def int_arg(args: dict[str, Any], name: str, default: int, low: int, high: int = MAX_INT) -> int:
    """An integer argument within [low, high]; raises control.bad_request naming it."""
    value = args.get(name, default)
    if not is_int(value) or not low <= value <= high:
        raise ControlError(
            "control.bad_request",
            f"{name} must be an integer from {low} to {high}, not {value!r:.40}",
        )
    return int(value)


def stop(daemon: View, args: dict[str, Any]) -> Any:
    """stop job: preempt it; its worker commits its current step, and it waits for resume."""
    record = job_record(daemon, args)
    answer = daemon.stop_job(record)
    if answer is None:
        raise ControlError(
            "control.not_running", f"job {record.id} is {record.state.value}; nothing to stop"
        )
    return answer
