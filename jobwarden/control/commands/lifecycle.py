"""``wardenctl stop|cancel|restart|remove|signal|rejected`` and ``status --all``.

``stop``, ``cancel``, ``restart`` and ``remove`` take several job names, or
``all``, as supervisorctl does, and print one line per job.  Their exit
status: 0 when every job was done, 1 when the daemon refused one (its state
does not allow it), else 4 when a named job does not exist.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import sys
from pathlib import Path
from typing import Any

from jobwarden.control.commands.daemon import ask, checked
from jobwarden.control.commands.daemon import cmd_status as show_status
from jobwarden.control.commands.daemon import cmd_submit as submit_file
from jobwarden.control.commands.output import (
    EXIT_NO_SUCH,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    emit,
)


def targets(names: list[str]) -> dict[str, Any]:
    """The request's selection: ``all: true`` for the name ``all``, else the names."""
    return {"all": True} if names == ["all"] else {"jobs": names}


def result_line(result: dict[str, Any]) -> str:
    """One job's outcome as a line."""
    if not result["ok"]:
        return f"{result['job']}: ERROR {result['error']['code']}: {result['error']['message']}"
    if result.get("archived"):
        return f"{result['job']}: {result['state']}, archived as {result['archived']}"
    for doing in ("cancelling", "restarting", "stopping"):
        if result.get(doing):
            pid = f" (pid {result['pid']})" if result.get("pid") else ""
            then = {"cancelling": ", then cancel", "restarting": ", then resume"}.get(doing, "")
            return f"{result['job']}: stopping{pid}{then}"
    return f"{result['job']}: {result['state']}"


def exit_status(results: list[dict[str, Any]]) -> int:
    """0 all done, 1 some refused, else 4 some named job does not exist."""
    codes = [r["error"]["code"] for r in results if not r["ok"]]
    if any(code != "control.no_such_job" for code in codes):
        return EXIT_REFUSED
    return EXIT_NO_SUCH if codes else EXIT_OK


def run_each(args: argparse.Namespace, cmd: str) -> int:
    """Send one multi-job request and print a line per job."""
    if "all" in args.jobs and len(args.jobs) > 1:
        sys.stderr.write(f"wardenctl {cmd}: 'all' stands alone\n")
        return EXIT_USAGE
    data = ask(args, cmd, **targets(args.jobs))
    results = data["results"]
    emit(data, args.json, lambda d: "\n".join(map(result_line, results)) or f"no job to {cmd}")
    return exit_status(results)


def cmd_stop(args: argparse.Namespace) -> int:
    """Preempt jobs: each worker commits its current step and exits."""
    return run_each(args, "stop")


def cmd_cancel(args: argparse.Namespace) -> int:
    """Cancel jobs: queued ones at once, running ones after they commit."""
    return run_each(args, "cancel")


def cmd_restart(args: argparse.Namespace) -> int:
    """Stop jobs (they commit), then resume them."""
    return run_each(args, "restart")


def cmd_remove(args: argparse.Namespace) -> int:
    """Archive settled jobs whole under ROOT/archive/; their ids are free again."""
    return run_each(args, "remove")


def cmd_signal(args: argparse.Namespace) -> int:
    """Send a signal (USR1: the worker's stack dump) to a job's worker."""
    data = ask(args, "signal", job=args.job, signal=args.signal)
    emit(data, args.json, lambda d: f"{d['job']}: sent SIG{d['signal'][3:]} to pid {d['pid']}")
    return EXIT_OK


def cmd_submit(args: argparse.Namespace) -> int:
    """Submit a job file; with --replace, first archive a settled job of the same id; with
    --fresh (which implies --replace) its checkpoint directory too, so the job starts at 0."""
    fresh = getattr(args, "fresh", False)
    if not (args.replace or fresh):
        return submit_file(args)
    found = checked(Path(args.file))
    if found is None:
        return EXIT_USAGE
    job = found[0]
    answer = ask(args, "remove", jobs=[job.id], replacing=True, fresh=fresh)["results"][0]
    if answer["ok"]:
        sys.stderr.write(f"wardenctl submit: {job.id} archived as {answer['archived']}\n")
        if answer.get("checkpoint_archived"):
            sys.stderr.write(
                f"wardenctl submit: its checkpoints archived as {answer['checkpoint_archived']}\n"
            )
    elif answer["error"]["code"] != "control.no_such_job":
        sys.stderr.write(f"wardenctl submit: not replaced: {answer['error']['message']}\n")
        return EXIT_REFUSED
    if fresh:  # a directory left by a job archived without it, or another job's name
        kept = ask(args, "archive_checkpoint", checkpoint=job.checkpoint)
        if kept["archived"]:
            sys.stderr.write(
                f"wardenctl submit: checkpoint {job.checkpoint!r} archived as {kept['archived']}\n"
            )
    return submit_file(args)


def when(seconds: Any) -> str:
    """An epoch time as ISO 8601 with its zone, or ``-``."""
    if not isinstance(seconds, int | float):
        return "-"
    moment = datetime.datetime.fromtimestamp(seconds).astimezone()
    return moment.isoformat(timespec="seconds")


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Rows under a header, each column padded to its widest cell."""
    every = [header, *rows]
    widths = [max(len(row[i]) for row in every) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in every
    )


def render_archived(rows: list[dict[str, Any]]) -> str:
    """Archived jobs as a table."""
    if not rows:
        return "no archived jobs"
    return table(
        ("JOB", "STATE", "STEP", "ARCHIVED", "WHY", "FOLDER"),
        [
            (
                str(r.get("id") or "-"),
                f"{r.get('state') or '?'} (archived)",
                f"{r.get('step', '-')}/{r.get('steps') or '-'}",
                when(r.get("archived")),
                str(r.get("archived_reason") or r.get("error") or "-"),
                f"archive/{r['folder']}",
            )
            for r in rows
        ],
    )


def cmd_status(args: argparse.Namespace) -> int:
    """status, and with --all the archived jobs after the table (marked as such)."""
    if not args.all:
        return show_status(args)
    if args.job:
        sys.stderr.write("wardenctl status: --all lists every job; it takes no JOB\n")
        return EXIT_USAGE
    if args.json:  # the status answer as `status --json` prints it, and the archive beside
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            status = show_status(args)
        if not printed.getvalue():
            return status
        data = json.loads(printed.getvalue())
        data["archived"] = [{**row, "archived_job": True} for row in ask(args, "archived")]
        emit(data, True, str)
        return status
    status = show_status(args)
    sys.stdout.write("\narchived:\n" + render_archived(ask(args, "archived")) + "\n")
    return status


def render_rejected(data: dict[str, Any]) -> str:
    """Rejected requests, newest last, each with its problems."""
    if not data["rejected"]:
        return "no rejected requests"
    lines = []
    for r in data["rejected"]:
        lines.append(f"{when(r['received'])}  {r['submitted_as']}  (kept at {r['kept_at']})")
        lines += [f"    {problem}" for problem in r["problems"]]
    shown = len(data["rejected"])
    if shown < data["count"]:
        lines.append(f"({shown} newest of {data['count']} rejected requests)")
    return "\n".join(lines)


def cmd_rejected(args: argparse.Namespace) -> int:
    """List the rejected requests of the spool with their problems, newest last."""
    emit(ask(args, "rejected", lines=args.lines), args.json, render_rejected)
    return EXIT_OK
