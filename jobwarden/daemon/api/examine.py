"""``inspect`` and ``verify`` through the socket: the daemon reads the evidence for the operator.

Under systemd the state directory is private to the daemon's user, so a
member of the control group can ask about a job but not open its files.
These requests read them as the daemon, in a thread (a checkpoint is hashed
whole; a long run's events are many), and answer what the file forms of
``wardenctl inspect`` and ``wardenctl verify`` print.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobwarden.checkpoint.shardrecord import RECORD, record_name
from jobwarden.checkpoint.store import NAME, file_name
from jobwarden.daemon.api.arguments import int_arg, job_record
from jobwarden.daemon.background import off_loop
from jobwarden.protocol import ControlError

if TYPE_CHECKING:
    from jobwarden.daemon.view import View


def checkpoint_file(directory: Path, step: int | None) -> Path:
    """The committed checkpoint at ``step``, or the newest; raises control.no_such_checkpoint."""
    if step is not None:
        for path in (directory / file_name(step), directory / record_name(step)):
            if path.is_file():
                return path
        raise ControlError(
            "control.no_such_checkpoint", f"no checkpoint of step {step} in {directory}"
        )
    committed = sorted(
        p for p in directory.glob("ckpt-*") if NAME.fullmatch(p.name) or RECORD.fullmatch(p.name)
    )
    if not committed:
        raise ControlError("control.no_such_checkpoint", f"no committed checkpoint in {directory}")
    return committed[-1]


def describe_checkpoint(directory: Path, step: int | None, values: bool) -> dict[str, Any]:
    """`jobwarden.proof.inspect.describe` of the chosen file (in a thread)."""
    from jobwarden.proof import inspect

    return inspect.describe(checkpoint_file(directory, step), values=values)


def verify_jobs(candidate: Path, reference: Path) -> dict[str, Any]:
    """The verify report of one job folder against another (in a thread)."""
    from jobwarden.proof import verify

    try:
        report = verify.verify(verify.load_run(reference), verify.load_run(candidate))
    except verify.VerifyInputError as error:
        raise ControlError("control.unverifiable", str(error)) from error
    return {**report.as_record(), "text": verify.render(report)}


async def inspect_job(daemon: View, args: dict[str, Any]) -> Any:
    """inspect job [step values]: a checkpoint of the job, described and judged."""
    record = job_record(daemon, args)
    step = None if args.get("step") is None else int_arg(args, "step", 0, 0)
    values = args.get("values", False)
    if not isinstance(values, bool):
        raise ControlError("control.bad_request", "values must be a boolean")
    directory = daemon.root.checkpoints / record.checkpoint
    return await off_loop(describe_checkpoint, directory, step, values)


async def verify_job(daemon: View, args: dict[str, Any]) -> Any:
    """verify job reference: prove the job's run continued the reference job's."""
    candidate = job_record(daemon, args)
    reference = job_record(daemon, {"job": args.get("reference")})
    return await off_loop(verify_jobs, daemon.root.job(candidate.id), daemon.root.job(reference.id))


def handlers(daemon: View) -> dict[str, Any]:
    """The requests this module answers."""
    return {
        "inspect": lambda args: inspect_job(daemon, args),
        "verify": lambda args: verify_job(daemon, args),
    }
