"""``wardenctl``: the operator's command line.

Commands that ask the daemon go over its control socket (``--root`` or
``$JOBWARDEN_ROOT`` selects it, ``--socket`` names it).  ``verify`` and
``inspect`` work on files and need no daemon.  This module holds the argument parser and
the dispatch; the commands are in ``jobwarden.control.commands``.

Exit statuses follow supervisorctl's LSB convention where one applies:
0 ok, 1 the daemon is not reachable or refused the request, 2 usage error,
3 ``status``: some job needs attention (failed or escalated), 4 no such job,
5 the daemon is busy (it did not take or answer the request in time).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from jobwarden.control.commands.daemon import (
    cmd_checkpoints,
    cmd_incidents,
    cmd_metrics,
    cmd_resume,
    cmd_runbook,
    cmd_shutdown,
    cmd_status,
    cmd_stop,
    cmd_submit,
    cmd_tail,
    cmd_version,
)
from jobwarden.control.commands.drills import cmd_drill
from jobwarden.control.commands.files import cmd_inspect, cmd_verify
from jobwarden.control.commands.output import EXIT_BUSY, EXIT_NO_SUCH, EXIT_REFUSED
from jobwarden.control.protocol import ControlError

DEFAULT_TIMEOUT_S = 10.0


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
        return commands.add_parser(name, parents=[selector], **options)

    status = command("status", help="jobs and their state")
    status.add_argument("job", nargs="?")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)

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
    ):
        drill.add_argument(option, type=kind, default=argparse.SUPPRESS, help=text)
    drill.set_defaults(func=cmd_drill)

    submit = command("submit", help="hand a job file to the daemon's spool")
    submit.add_argument("file")
    submit.add_argument("--json", action="store_true")
    submit.set_defaults(func=cmd_submit)

    for name, func, text in (
        ("stop", cmd_stop, "preempt a job (it checkpoints first)"),
        ("resume", cmd_resume, "queue a stopped or escalated job again"),
        ("checkpoints", cmd_checkpoints, "checkpoints and their verdicts"),
    ):
        sub = command(name, help=text)
        sub.add_argument("job")
        sub.add_argument("--json", action="store_true")
        sub.set_defaults(func=func)

    tail = command("tail", help="a job's events")
    tail.add_argument("job")
    tail.add_argument("-f", "--follow", action="store_true")
    tail.add_argument("--json", action="store_true")
    tail.set_defaults(func=cmd_tail)

    metrics = command("metrics", help="Prometheus text exposition")
    metrics.add_argument("--json", action="store_true")
    metrics.set_defaults(func=cmd_metrics)

    shutdown = command("shutdown", help="preempt every worker and stop the daemon")
    shutdown.add_argument("--json", action="store_true")
    shutdown.set_defaults(func=cmd_shutdown)

    verify = command("verify", help="prove a resumed run continued the reference")
    verify.add_argument("reference", type=Path, help="events file or run folder of the reference")
    verify.add_argument("candidate", type=Path, help="events file or run folder of the resumed run")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.set_defaults(func=cmd_verify)

    inspect = command("inspect", help="show a checkpoint's identity and verdict")
    inspect.add_argument("file", type=Path)
    inspect.add_argument("--json", action="store_true", help="print as JSON")
    inspect.add_argument("--values", action="store_true", help="include the arrays of small states")
    inspect.set_defaults(func=cmd_inspect)

    version = command("version", help="print the version")
    version.add_argument("--json", action="store_true")
    version.set_defaults(func=cmd_version)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``wardenctl``."""
    from jobwarden.control.client import DaemonBusy, DaemonUnreachable

    args = build_parser().parse_args(argv)
    try:
        status: int = args.func(args)
    except DaemonBusy as error:
        sys.stderr.write(f"wardenctl: daemon busy: {error.message}\n")
        return EXIT_BUSY
    except DaemonUnreachable as error:
        sys.stderr.write(f"wardenctl: {error.message}\n")
        return EXIT_REFUSED
    except ControlError as error:
        sys.stderr.write(f"wardenctl: {error.code}: {error.message}\n")
        return EXIT_NO_SUCH if error.code.startswith("control.no_such") else EXIT_REFUSED
    return status


if __name__ == "__main__":
    sys.exit(main())
