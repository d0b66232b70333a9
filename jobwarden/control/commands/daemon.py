"""The commands the daemon answers over its control socket: status, submit, stop, tail...

``--root`` or ``$JOBWARDEN_ROOT`` selects the daemon, ``--socket`` names its socket.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobwarden import __version__
from jobwarden.control.commands.output import (
    EXIT_ATTENTION,
    EXIT_NO_SUCH,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    emit,
)
from jobwarden.control.tables import (
    render_checkpoints,
    render_incidents,
    render_job,
    render_status,
)
from jobwarden.protocol import ControlError
from jobwarden.states import NEEDS_ATTENTION, SETTLED, JobState

if TYPE_CHECKING:
    from jobwarden.jobfile import Job

# The names `submit` sends as they are: plain, printable and short.
SPOOL_NAME = re.compile(r"[A-Za-z0-9_+=,@%-][A-Za-z0-9._+=,@%-]{0,100}")
# `status` exits EXIT_ATTENTION when a job is in one of these.
ATTENTION_STATES = frozenset(state.value for state in NEEDS_ATTENTION)
# `tail -f` stops once a job rests here: settled, or preempted until someone resumes it.
RESTING_STATES = frozenset(state.value for state in SETTLED | {JobState.PREEMPTED})


def ask(args: argparse.Namespace, cmd: str, **fields: Any) -> Any:
    """One request to the daemon the command line selects; its answer's data."""
    from jobwarden.control import client

    path = client.socket_for(args.root, args.socket)
    return client.request(path, cmd, getattr(args, "timeout", 10.0), **fields)


def cmd_status(args: argparse.Namespace) -> int:
    """One row per job, or one job in detail."""

    try:
        data = ask(args, "status", job=args.job)
    except ControlError as error:
        sys.stderr.write(f"wardenctl: {error.message}\n")
        return EXIT_NO_SUCH if error.code == "control.no_such_job" else EXIT_REFUSED
    if args.job:
        emit(data, args.json, render_job)
        return EXIT_ATTENTION if data["state"] in ATTENTION_STATES else EXIT_OK
    if args.json:  # one object per job, as scripts read it; the totals beside
        data = {"jobs": data["jobs"], "totals": data["totals"], "daemon": data["daemon"]}
    emit(data, args.json, render_status)
    return EXIT_ATTENTION if data["totals"]["needs_attention"] else EXIT_OK


def cmd_incidents(args: argparse.Namespace) -> int:
    """Every incident, or one job's."""
    emit(ask(args, "incidents", job=args.job), args.json, render_incidents)
    return EXIT_OK


def cmd_runbook(args: argparse.Namespace) -> int:
    """Print an incident's rendered runbook."""
    data = ask(args, "runbook", incident=args.incident)
    emit(data, args.json, lambda d: d["text"].rstrip() + f"\n\n(runbook file: {d['path']})")
    return EXIT_OK


def checked(source: Path) -> tuple[Job, dict[str, Any], dict[str, Any]] | None:
    """The job file at ``source`` as a job, its text's document and that document with a
    relative workdir resolved; None after listing on stderr what is wrong with it."""
    from jobwarden.errors import JobFileError
    from jobwarden.jobfile import job_from_mapping, read_document, resolve_workdir

    try:
        document = read_document(source)
        resolved = resolve_workdir(document, source.absolute().parent)
        return job_from_mapping(resolved, str(source), check_workdir=True), document, resolved
    except JobFileError as error:
        sys.stderr.write(f"wardenctl submit: {source} is invalid, not submitted:\n")
        sys.stderr.write("".join(f"  {problem}\n" for problem in error.problems))
        return None


def cmd_submit(args: argparse.Namespace) -> int:
    """Validate FILE here, hand it to the daemon's spool, and print the job id (and on
    stderr the daemon's warnings about what it will resume)."""
    source = Path(args.file)
    found = checked(source)
    if found is None:
        return EXIT_USAGE
    job, document, resolved = found
    from jobwarden.jobwarnings import job_warnings

    for warning in job_warnings(job):
        sys.stderr.write(f"wardenctl submit: warning: {warning}\n")
    content = source.read_text()
    suffix = ".json" if source.suffix == ".json" else ".toml"
    if resolved is not document:
        # A relative workdir, resolved against the file's folder: send the resolved form.
        content, suffix = json.dumps(resolved, indent=2) + "\n", ".json"
    name = source.stem + suffix
    if not SPOOL_NAME.fullmatch(name):
        name = job.id + suffix  # a name the daemon would refuse: the job id is always plain
    result = ask(args, "submit", name=name, content=content)
    if result["accepted"]:
        for warning in result.get("warnings", []):
            sys.stderr.write(f"wardenctl submit: warning: {warning}\n")
        emit(result, args.json, lambda d: d["job"])
        return EXIT_OK
    emit(
        result,
        args.json,
        lambda d: "rejected: " + "; ".join(d["problems"]) + f" (kept at {d['kept_at']})",
    )
    return EXIT_REFUSED


def cmd_resume(args: argparse.Namespace) -> int:
    """Queue a preempted, failed or escalated job again."""
    emit(ask(args, "resume", job=args.job), args.json, lambda d: f"{d['job']}: {d['state']}")
    return EXIT_OK


def cmd_checkpoints(args: argparse.Namespace) -> int:
    """Every checkpoint file of a job with its validation verdict."""
    emit(ask(args, "checkpoints", job=args.job), args.json, render_checkpoints)
    return EXIT_OK


def cmd_metrics(args: argparse.Namespace) -> int:
    """Prometheus text exposition."""
    data = ask(args, "metrics")
    emit(data, args.json, lambda d: d["text"].rstrip())
    return EXIT_OK


def cmd_shutdown(args: argparse.Namespace) -> int:
    """Ask the daemon to preempt its workers and exit."""
    emit(ask(args, "shutdown"), args.json, lambda d: f"wardend stopping; preempting {d['live']}")
    return EXIT_OK


def cmd_version(args: argparse.Namespace) -> int:
    """Print the client's version, and the daemon's when one answers."""
    from jobwarden.control.client import DaemonBusy, DaemonUnreachable

    data: dict[str, Any] = {"wardenctl": __version__}
    try:
        data["wardend"] = ask(args, "version")
    except (DaemonUnreachable, DaemonBusy) as error:
        data["wardend"] = None
        data["note"] = error.message
    emit(
        data,
        args.json,
        lambda d: (
            f"wardenctl {d['wardenctl']}\n"
            + (
                f"wardend {d['wardend']['wardend']} (pid {d['wardend']['pid']})"
                if d["wardend"]
                else d["note"]
            )
        ),
    )
    return EXIT_OK


def cmd_wait_ready(args: argparse.Namespace) -> int:
    """Wait until the daemon answers (its spool and socket are up), at most --within seconds."""
    import time

    from jobwarden.control.client import DaemonBusy, DaemonUnreachable

    deadline = time.monotonic() + args.within
    while True:
        try:
            answer = ask(args, "version")
        except (DaemonUnreachable, DaemonBusy) as error:
            if time.monotonic() >= deadline:
                sys.stderr.write(f"wardenctl: not ready after {args.within:g} s: {error.message}\n")
                return EXIT_REFUSED
            time.sleep(0.1)
            continue
        if not args.quiet:
            emit(answer, args.json, lambda d: f"wardend {d['wardend']} ready on {d['root']}")
        return EXIT_OK
