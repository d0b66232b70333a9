"""The daemon's answers to control requests (docs/protocol.md lists them).

Each handler takes the request's ``args`` and returns JSON-ready data or
raises `ControlError`; they run on the daemon's loop, and the slow ones
(reading checkpoint files, the spool drop of ``submit``) hand their work to a
thread and return an awaitable.  Every argument is checked for its type and
bounds before use (a bool is not an integer here, whatever Python says).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobwarden import __version__
from jobwarden.checkpoint.signing import load_key
from jobwarden.checkpoint.store import directory_verdicts
from jobwarden.daemon.api import examine, resuming, status, tailing
from jobwarden.daemon.api.arguments import int_arg, job_record
from jobwarden.daemon.api.lifecycle import Lifecycle
from jobwarden.daemon.background import off_loop
from jobwarden.daemon.intake.queue import Kept, short_of_resources
from jobwarden.daemon.intake.spool import Rejection, name_problems
from jobwarden.daemon.store.evidence import describe
from jobwarden.daemon.supervise.attempt import output_entry, stdout_name
from jobwarden.decoding import loads_json
from jobwarden.jobfile import NAME_PATTERN
from jobwarden.protocol import PROTOCOL_VERSION, SUPPORTED_VERSIONS, ControlError
from jobwarden.states import RESUMABLE

if TYPE_CHECKING:
    from jobwarden.daemon.view import View

Handler = Any
EVENTS_PER_REQUEST = 2000
MAX_SUBMIT_NAME_BYTES = 128
INCIDENT_PATTERN = re.compile(rf"({NAME_PATTERN.pattern})-([0-9]{{1,9}})")


def handlers(daemon: View, lifecycle: Lifecycle) -> dict[str, Handler]:
    """Every command, bound to ``daemon`` (``lifecycle``: its stops, cancels and retention)."""
    rows = status.StatusRows()
    return {
        "status": lambda args: status.status(daemon, args, rows),
        "incidents": lambda args: incidents(daemon, args),
        "runbook": lambda args: runbook(daemon, args),
        "events": lambda args: events(daemon, args),
        "checkpoints": lambda args: checkpoints(daemon, args),
        "submit": lambda args: submit(daemon, args),
        "resume": lambda args: resume(daemon, args),
        "metrics": lambda args: {"text": daemon.metrics_text()},
        "version": lambda args: version(daemon),
        "shutdown": lambda args: shutdown(daemon),
        **lifecycle.handlers(),  # stop (one job, several, or all), cancel, remove...
        **tailing.handlers(daemon),
        **examine.handlers(daemon),
    }


def resume(daemon: View, args: dict[str, Any]) -> Any:
    """resume job: queue a preempted, failed or escalated job again."""
    record = job_record(daemon, args)
    if record.state not in RESUMABLE:
        raise ControlError(
            "control.bad_state",
            f"job {record.id} is {record.state.value}; "
            "resume applies to preempted, failed or escalated jobs",
        )
    return daemon.resume_job(record)


def incidents(daemon: View, args: dict[str, Any]) -> Any:
    """incidents [job]: every incident's latest record."""
    if args.get("job") is not None:
        return daemon.incidents.load(job_record(daemon, args).id)
    return [i for r in daemon.table for i in daemon.incidents.load(r.id)]


def runbook(daemon: View, args: dict[str, Any]) -> Any:
    """runbook incident: the rendered runbook and its path."""
    name = args.get("incident")
    match = INCIDENT_PATTERN.fullmatch(name) if isinstance(name, str) else None
    job_id = match.group(1) if match else None
    path = daemon.root.job(job_id) / "incidents" / f"{name}.md" if job_id else None
    if job_id not in daemon.table or path is None or not path.is_file():
        raise ControlError("control.no_such_incident", f"no incident {name!r:.80}")
    return {"incident": name, "path": str(path), "text": path.read_text()}


def events(daemon: View, args: dict[str, Any]) -> Any:
    """events job [attempt offset]: event lines from a cursor on, and the next cursor."""
    record = job_record(daemon, args)
    attempt = int_arg(args, "attempt", 1, 1)
    offset = int_arg(args, "offset", 0, 0)
    lines: list[dict[str, Any]] = []
    while attempt <= record.attempt and len(lines) < EVENTS_PER_REQUEST:
        folder = daemon.root.attempt(record.id, attempt)
        data = _read_from(folder / stdout_name(record.job), offset)
        complete = data[: data.rfind(b"\n") + 1]
        for raw in complete.split(b"\n")[:-1][: EVENTS_PER_REQUEST - len(lines)]:
            offset += len(raw) + 1
            if not record.job.emits_events:
                lines.append({"attempt": attempt, **output_entry(raw)})
                continue
            try:
                event = loads_json(raw)
            except ValueError as error:
                event = {
                    "event": "malformed",
                    "line": raw.decode(errors="replace"),
                    "reason": str(error),
                }
            lines.append(
                {"attempt": attempt, **event}
                if isinstance(event, dict)
                else {"attempt": attempt, "event": "malformed", "line": str(event)}
            )
        if len(lines) >= EVENTS_PER_REQUEST or attempt == record.attempt:
            break
        attempt, offset = attempt + 1, 0
    return {
        "events": lines,
        "cursor": {"attempt": max(1, attempt), "offset": offset},
        "state": record.state.value,
    }


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with path.open("rb") as stream:
            stream.seek(offset)
            return stream.read(4 << 20)
    except FileNotFoundError:
        return b""


def checkpoints(daemon: View, args: dict[str, Any]) -> Any:
    """checkpoints job: every file of the job's checkpoint directory with its verdict."""
    record = job_record(daemon, args)
    directory = daemon.root.checkpoints / record.checkpoint
    key = load_key(daemon.options.signing_key) if daemon.options.signing_key else None
    return off_loop(directory_verdicts, directory, record.job, key)


def submit_problems(name: Any, content: Any) -> list[str]:
    """What is wrong with a submit request's name and content (empty when nothing is)."""
    if not isinstance(name, str) or not isinstance(content, str):
        return ["name and content must be strings"]
    # Lone surrogates never get here: the request decoder refuses them in any string.
    problems = [p for p in name_problems(name) if "control characters" in p]
    if "/" in name or name in ("", ".", ".."):
        problems.append("name: must be a plain file name (no '/')")
    if name.startswith("."):
        problems.append("name: must not start with '.'")
    if Path(name).suffix not in (".toml", ".json"):
        problems.append("name: must end in .toml or .json")
    if len(name.encode()) > MAX_SUBMIT_NAME_BYTES:
        problems.append(f"name: over {MAX_SUBMIT_NAME_BYTES} bytes")
    return problems


async def submit(daemon: View, args: dict[str, Any]) -> Any:
    """submit name content: the daemon drops the file into its own spool and takes it in.

    Members of the control group cannot write the daemon's private state
    directory, so the daemon performs the Maildir drop itself (write in
    spool/tmp, fsync, rename into spool/incoming) and reports the outcome.
    The drop and the intake run in the intake thread; a failed drop leaves
    nothing behind.  Short of descriptors, memory or space: a drop that failed
    kept nothing, and the answer is ``control.busy``, which clients send again
    (`jobwarden.control.client.request`); a request dropped but not yet taken in
    stays in the spool for the next rescan, and the answer is
    ``control.exhausted``, which must not be sent again.
    """
    name, content = args.get("name"), args.get("content")
    problems = submit_problems(name, content)
    if problems or not isinstance(name, str) or not isinstance(content, str):
        raise ControlError("control.bad_request", "submit: " + "; ".join(problems))
    try:
        taken = await daemon.intake_queue.submit(name, content.encode())
    except OSError as error:
        if not short_of_resources(error):
            raise
        raise ControlError(
            "control.busy",
            f"submit: the daemon is short of resources ({describe(error)}); "
            "nothing was kept: send it again",
        ) from error
    if isinstance(taken, Kept):
        raise ControlError(
            "control.exhausted",
            f"submit: the daemon is short of resources ({taken.problem}); the request is "
            f"kept in its spool as {taken.name} and is taken in at a rescan once they "
            "return (status or rejected shows it then): do not send it again",
        )
    if taken is None:
        raise ControlError("control.busy", "the request was not taken in (daemon stopping)")
    if isinstance(taken, Rejection):
        return {
            "accepted": False,
            "file": name,
            "problems": taken.problems,
            "kept_at": str(taken.kept_at),
        }
    record = daemon.table.get(taken.id)
    state = record.state.value if record else "queued"
    told = await off_loop(resuming.warnings, daemon.root, taken)
    return {"accepted": True, "job": taken.id, "state": state, "warnings": told}


def version(daemon: View) -> Any:
    """version: the daemon's version, pid, protocols (newest, and every one it speaks) and
    where its spool is."""
    return {
        "wardend": __version__,
        "pid": os.getpid(),
        "protocol": PROTOCOL_VERSION,
        "protocols": list(SUPPORTED_VERSIONS),
        "root": str(daemon.root.path),
        "spool": {
            "tmp": str(daemon.root.spool_tmp),
            "incoming": str(daemon.root.incoming),
            "rejected": str(daemon.root.rejected),
        },
    }


def shutdown(daemon: View) -> Any:
    """shutdown: preempt every worker and exit, as on SIGTERM."""
    daemon.stopping.set()
    return {"stopping": True, "live": sorted(r.id for r in daemon.table if daemon.is_live(r.id))}
