"""``wardenctl``: the operator's command line.

Commands that ask the daemon go over its control socket (``--root`` or
``$JOBWARDEN_ROOT`` selects it, ``--socket`` names it).  ``verify`` and
``inspect`` ask the daemon about jobs, or read files given as paths (no daemon
needed).  This module holds the argument parser and the dispatch; the commands
are in ``jobwarden.control.commands``.

Exit statuses follow supervisorctl's LSB convention where one applies:
0 ok, 1 the daemon is not reachable or refused the request, 2 usage error,
3 ``status``: some job needs attention (failed or escalated), 4 no such job,
5 the daemon is busy (it did not take or answer the request in time),
130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from jobwarden.control.commands import lifecycle, tailing
from jobwarden.control.commands.daemon import (
    cmd_checkpoints,
    cmd_incidents,
    cmd_metrics,
    cmd_resume,
    cmd_runbook,
    cmd_shutdown,
    cmd_version,
    cmd_wait_ready,
)
from jobwarden.control.commands.drills import cmd_drill
from jobwarden.control.commands.evidence import cmd_inspect, cmd_verify
from jobwarden.control.commands.output import EXIT_BUSY, EXIT_NO_SUCH, EXIT_REFUSED, EXIT_USAGE
from jobwarden.protocol import ControlError

DEFAULT_TIMEOUT_S = 10.0
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that names each option's default, unless its text already does or it has none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default in (None, False, argparse.SUPPRESS):
            return text
        return f"{text} (default: {default})" if action.option_strings else text


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    parser = argparse.ArgumentParser(prog="wardenctl", description="Control and inspect jobwarden.")
    parser.add_argument("--root", help="the daemon's root (default $JOBWARDEN_ROOT)")
    parser.add_argument("--socket", help="the control socket (default ROOT/control.sock)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds to wait for the daemon before saying it is busy (exit 5)",
    )
    # The same options after the command (`wardenctl drill crash --root DIR`); SUPPRESS keeps
    # a value given before the command when none is given after it.
    selector = argparse.ArgumentParser(add_help=False)
    selector.add_argument("--root", default=argparse.SUPPRESS, help="the daemon's root")
    selector.add_argument("--socket", default=argparse.SUPPRESS, help="the control socket")
    selector.add_argument("--timeout", type=float, default=argparse.SUPPRESS, help="seconds")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, **options: Any) -> argparse.ArgumentParser:
        options.setdefault("formatter_class", DefaultsFormatter)
        options.setdefault("description", options.get("help"))
        return commands.add_parser(name, parents=[selector], **options)

    helper = command("help", help="this list, or one command's options and their defaults")
    helper.add_argument("topic", nargs="?", metavar="COMMAND")
    helper.set_defaults(func=lambda args: show_help(parser, commands, args.topic))

    status = command("status", help="jobs and their state")
    status.add_argument("job", nargs="?")
    status.add_argument("--json", action="store_true")
    status.add_argument(
        "--all", action="store_true", help="the archived jobs too, after the table (marked)"
    )
    status.set_defaults(func=lifecycle.cmd_status)

    incidents = command("incidents", help="incident records")
    incidents.add_argument("job", nargs="?")
    incidents.add_argument("--json", action="store_true")
    incidents.set_defaults(func=cmd_incidents)

    runbook = command("runbook", help="an incident's runbook")
    runbook.add_argument("incident")
    runbook.add_argument("--json", action="store_true")
    runbook.set_defaults(func=cmd_runbook)

    drill = command("drill", help="rehearse a failure and verify the recovery")
    drill.add_argument(
        "drill", choices=["crash", "stall", "duplicate-writer", "corrupt", "incompatible", "all"]
    )
    drill.add_argument(
        "--job",
        type=Path,
        metavar="FILE",
        help="drill this job file (a task job, or a command job with sdk = true) instead of "
        "the default linreg job; the faults go where its own [run] steps and "
        "checkpoint_every allow",
    )
    drill.add_argument("--out", default="drill-evidence", help="evidence folder")
    drill.add_argument("--json", action="store_true")
    drill.add_argument(
        "--compile-cache",
        type=Path,
        help="the private daemon's JAX compilation cache, a directory of mode 0700 "
        "(default OUT/root/cache/jax; not with --root, whose daemon keeps its own)",
    )
    # No defaults here: cmd_drill starts from DrillParams() and applies only the options
    # given, since importing the drills to read their defaults would slow every command.
    for option, kind, text in (
        ("--seed", int, "the default job's training seed (not with --job)"),
        ("--steps", int, "the default job's training steps (not with --job)"),
        ("--checkpoint-every", int, "the default job's steps between checkpoints (not with --job)"),
        ("--fail-after", int, "the update after which the crash drill fails (default: chosen)"),
        ("--stall-at", int, "completed updates before the stall drill hangs (default: chosen)"),
        ("--task", str, "the default job's task (not with --job)"),
        ("--processes", int, "run the drilled job as N members, the fault aimed at member 1"),
    ):
        drill.add_argument(option, type=kind, default=argparse.SUPPRESS, help=text)
    drill.add_argument(
        "--launcher",
        help="how the private daemon starts attempts (wardend --launcher: local, slurm; "
        "default local; not with --root, whose daemon keeps its own)",
    )
    drill.set_defaults(func=_drill)

    submit = command("submit", help="hand a job file to the daemon's spool")
    submit.add_argument("file")
    submit.add_argument("--json", action="store_true")
    submit.add_argument(
        "--replace",
        action="store_true",
        help="archive a settled (completed, cancelled, failed or escalated) job of the same id "
        "first, then submit",
    )
    submit.add_argument(
        "--fresh",
        action="store_true",
        help="--replace, and archive the job's checkpoint directory too (never deleted), so "
        "that the job starts from step 0 instead of resuming",
    )
    submit.set_defaults(func=lifecycle.cmd_submit)

    for name, func, text in (
        ("stop", lifecycle.cmd_stop, "preempt jobs (each checkpoints first)"),
        ("cancel", lifecycle.cmd_cancel, "cancel jobs: queued at once, running after a commit"),
        ("restart", lifecycle.cmd_restart, "stop jobs (they checkpoint), then resume them"),
        ("remove", lifecycle.cmd_remove, "move settled jobs whole to ROOT/archive/"),
        ("archive", lifecycle.cmd_remove, "the same as remove"),
    ):
        sub = command(name, help=text)
        sub.add_argument("jobs", nargs="+", metavar="JOB", help="job ids, or all")
        sub.add_argument("--json", action="store_true")
        sub.set_defaults(func=func)

    signal = command("signal", help="send a signal to a job's worker (USR1: stack dump)")
    signal.add_argument("job")
    signal.add_argument("signal", help="HUP, INT, QUIT, USR1, USR2, TERM, CONT, STOP or WINCH")
    signal.add_argument("--json", action="store_true")
    signal.set_defaults(func=lifecycle.cmd_signal)

    rejected = command("rejected", help="rejected requests and their problems, newest last")
    rejected.add_argument("-n", "--lines", type=int, default=100, help="how many (default 100)")
    rejected.add_argument("--json", action="store_true")
    rejected.set_defaults(func=lifecycle.cmd_rejected)

    for name, func, text in (
        ("resume", cmd_resume, "queue a stopped or escalated job again"),
        ("checkpoints", cmd_checkpoints, "checkpoints and their verdicts"),
    ):
        sub = command(name, help=text)
        sub.add_argument("job")
        sub.add_argument("--json", action="store_true")
        sub.set_defaults(func=func)

    tail = command("tail", help="the end of a job's events and the daemon's actions for it")
    tail.add_argument("job")
    tail.add_argument("-n", "--lines", type=int, default=20, help="how many lines (default 20)")
    tail.add_argument("-f", "--follow", action="store_true", help="follow until the job rests")
    tail.add_argument("--attempt", type=int, help="one attempt only (default: every attempt)")
    tail.add_argument("--stderr", action="store_true", help="the attempt's stderr instead")
    sources = tail.add_mutually_exclusive_group()
    sources.add_argument(
        "--no-daemon", action="store_true", help="the worker's lines only, not the daemon's"
    )
    sources.add_argument(
        "--daemon",
        dest="daemon_only",
        action="store_true",
        help="the daemon's own lines only (transitions, exits, stalls, incidents)",
    )
    tail.add_argument(
        "--kind",
        action="append",
        metavar="EVENT",
        help="lines of this event kind only (a shell pattern, e.g. 'incident.*'); repeatable",
    )
    tail.add_argument("--json", action="store_true")
    tail.set_defaults(func=tailing.cmd_tail)

    maintail = command("maintail", help="the end of the daemon's own log, readable")
    maintail.add_argument("-n", "--lines", type=int, default=20, help="how many (default 20)")
    maintail.add_argument("-f", "--follow", action="store_true")
    maintail.add_argument("--json", action="store_true")
    maintail.set_defaults(func=tailing.cmd_maintail)

    metrics = command("metrics", help="Prometheus text exposition")
    metrics.add_argument("--json", action="store_true")
    metrics.set_defaults(func=cmd_metrics)

    shutdown = command("shutdown", help="preempt every worker and stop the daemon")
    shutdown.add_argument("--json", action="store_true")
    shutdown.set_defaults(func=cmd_shutdown)

    verify = command(
        "verify",
        help="prove a resumed run continued the reference: JOB REFERENCE_JOB through the "
        "daemon, or REFERENCE CANDIDATE paths (events files or run folders)",
    )
    verify.add_argument("first", metavar="JOB|REFERENCE")
    verify.add_argument("second", metavar="REFERENCE_JOB|CANDIDATE")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.set_defaults(func=cmd_verify)

    inspect = command(
        "inspect",
        help="a checkpoint's identity and verdict: JOB [STEP] through the daemon (newest "
        "committed unless STEP), or a FILE",
    )
    inspect.add_argument("target", metavar="JOB|FILE")
    inspect.add_argument("step", nargs="?", type=int, help="the checkpoint's step (with JOB)")
    inspect.add_argument("--json", action="store_true", help="print as JSON")
    inspect.add_argument("--values", action="store_true", help="include the arrays of small states")
    inspect.set_defaults(func=cmd_inspect)

    dashboard = command(
        "dashboard",
        help="serve a read-only web dashboard on loopback; prints its URL with a token",
    )
    dashboard.add_argument(
        "--listen",
        default="127.0.0.1:8765",
        metavar="HOST:PORT",
        help="a loopback address and port (port 0: any free one)",
    )
    dashboard.add_argument(
        "--drills",
        action="append",
        metavar="OUT",
        help="a drill evidence folder (wardenctl drill --out OUT) to show; may be repeated",
    )
    dashboard.set_defaults(func=_dashboard)

    version = command("version", help="print the version")
    version.add_argument("--json", action="store_true")
    version.set_defaults(func=cmd_version)

    ready = command(
        "wait-ready",
        help="wait until the daemon answers, its spool and socket up (exit 1 if not in time)",
    )
    ready.add_argument("--within", type=float, default=60.0, help="seconds to wait at most")
    ready.add_argument("-q", "--quiet", action="store_true", help="print nothing when ready")
    ready.add_argument("--json", action="store_true", help="print as JSON")
    ready.set_defaults(func=cmd_wait_ready)
    return parser


def show_help(
    parser: argparse.ArgumentParser, commands: argparse._SubParsersAction[Any], topic: str | None
) -> int:
    """``wardenctl help [COMMAND]``: the same text as ``--help``."""
    if topic is None:
        parser.print_help()
        return 0
    chosen = commands.choices.get(topic)
    if chosen is None:
        sys.stderr.write(f"wardenctl: no command {topic!r}; `wardenctl help` lists them\n")
        return EXIT_USAGE
    chosen.print_help()
    return 0


def _drill(args: argparse.Namespace) -> int:
    """``wardenctl drill``, its ``--launcher`` handed to the private daemon (drill/daemon.py
    reads it from ``JOBWARDEN_DRILL_LAUNCHER``: the drills are imported only once they run)."""
    if args.launcher is not None:
        os.environ["JOBWARDEN_DRILL_LAUNCHER"] = args.launcher
    return cmd_drill(args)


def _dashboard(args: argparse.Namespace) -> int:
    """``wardenctl dashboard``: the web pages live in their own room, an optional extra."""
    try:
        from jobwarden.dashboard.command import cmd_dashboard
    except ImportError as error:
        sys.stderr.write(
            f"wardenctl: the dashboard needs the 'dashboard' extra "
            f"(pip install 'jobwarden[dashboard]'): {error}\n"
        )
        return EXIT_REFUSED
    return cmd_dashboard(args)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``wardenctl``."""
    from jobwarden.control.client import DaemonBusy, DaemonUnreachable

    args = build_parser().parse_args(argv)
    try:
        status: int = args.func(args)
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return EXIT_INTERRUPTED
    except DaemonBusy as error:
        sys.stderr.write(f"wardenctl: daemon busy: {error.message}\n")
        return EXIT_BUSY
    except DaemonUnreachable as error:
        sys.stderr.write(f"wardenctl: {error.message}\n")
        return EXIT_REFUSED
    except ControlError as error:
        sys.stderr.write(f"wardenctl: {error.code}: {error.message}\n")
        return EXIT_NO_SUCH if error.code.startswith("control.no_such") else EXIT_REFUSED
    except OSError as error:  # a file this user may not read, a path that is not a folder...
        where = f" {error.filename}" if error.filename else ""
        sys.stderr.write(f"wardenctl: cannot use{where}: {error.strerror or error}\n")
        return EXIT_REFUSED
    return status


if __name__ == "__main__":
    sys.exit(main())
