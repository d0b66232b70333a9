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
import importlib
import sys
from pathlib import Path
from typing import Any

from jobwarden.control.commands.output import (
    EXIT_BUSY,
    EXIT_NO_SUCH,
    EXIT_REFUSED,
    show_help,
)

DEFAULT_TIMEOUT_S = 10.0
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it


class Command:
    """A command's function, imported only when it runs: a command's start pays for its own
    module alone, not for every command's (``python -X importtime`` shows what costs)."""

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name

    def __call__(self, args: argparse.Namespace) -> int:
        """Import the command's module and run the command."""
        func = getattr(
            importlib.import_module(f"jobwarden.control.commands.{self.module}"), self.name
        )
        status: int = func(args)
        return status

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Command) and (self.module, self.name) == (
            other.module,
            other.name,
        )

    def __hash__(self) -> int:
        return hash((self.module, self.name))


LIFECYCLE = "lifecycle"
DAEMON = "daemon"
COMMANDS = frozenset(
    {
        "status", "incidents", "runbook", "drill", "submit", "stop", "cancel", "restart",
        "remove", "archive", "signal", "rejected", "resume", "checkpoints", "tail", "maintail",
        "metrics", "shutdown", "verify", "inspect", "version", "wait-ready", "dashboard",
    }
)  # fmt: skip
"""Every command but ``help`` (which shows them all): `chosen_command` recognises these."""
GLOBAL_OPTIONS = frozenset({"--root", "--socket", "--timeout"})
"""The options before a command, each followed by its value."""


def chosen_command(argv: list[str]) -> str | None:
    """The command ``argv`` runs, if it is plainly one of `COMMANDS` after global options;
    None (build every command's parser) for anything else: no command, help, an option
    argparse would have to interpret (``-h``, an abbreviation), a typo."""
    index = 0
    while index < len(argv):
        word = argv[index]
        if word in GLOBAL_OPTIONS:
            index += 2
        elif word.partition("=")[0] in GLOBAL_OPTIONS and "=" in word:
            index += 1
        else:
            return word if word in COMMANDS else None
    return None


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that names each option's default, unless its text already does or it has none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default in (None, False, argparse.SUPPRESS):
            return text
        return f"{text} (default: {default})" if action.option_strings else text


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of every command, or of the ``only`` one (`chosen_command`): a
    command's start need not build two dozen parsers it will not use."""

    def wanted(name: str) -> bool:
        return only is None or name == only

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

    if wanted("help"):
        helper = command("help", help="this list, or one command's options and their defaults")
        helper.add_argument("topic", nargs="?", metavar="COMMAND")
        helper.set_defaults(func=lambda args: show_help(parser, commands, args.topic))

    if wanted("status"):
        status = command("status", help="jobs and their state")
        status.add_argument("job", nargs="?")
        status.add_argument("--json", action="store_true")
        status.add_argument(
            "--all", action="store_true", help="the archived jobs too, after the table (marked)"
        )
        status.set_defaults(func=Command(LIFECYCLE, "cmd_status"))

    if wanted("incidents"):
        incidents = command("incidents", help="incident records")
        incidents.add_argument("job", nargs="?")
        incidents.add_argument("--json", action="store_true")
        incidents.set_defaults(func=Command(DAEMON, "cmd_incidents"))

    if wanted("runbook"):
        runbook = command("runbook", help="an incident's runbook")
        runbook.add_argument("incident")
        runbook.add_argument("--json", action="store_true")
        runbook.set_defaults(func=Command(DAEMON, "cmd_runbook"))

    if wanted("drill"):
        drill = command("drill", help="rehearse a failure and verify the recovery")
        drill.add_argument(
            "drill",
            choices=["crash", "stall", "duplicate-writer", "corrupt", "incompatible", "all"],
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
            (
                "--checkpoint-every",
                int,
                "the default job's steps between checkpoints (not with --job)",
            ),
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
        drill.set_defaults(func=Command("drills", "cmd_drill"))

    if wanted("submit"):
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
        submit.set_defaults(func=Command(LIFECYCLE, "cmd_submit"))

    for name, func, text in (
        ("stop", Command(LIFECYCLE, "cmd_stop"), "preempt jobs (each checkpoints first)"),
        (
            "cancel",
            Command(LIFECYCLE, "cmd_cancel"),
            "cancel jobs: queued at once, running after a commit",
        ),
        (
            "restart",
            Command(LIFECYCLE, "cmd_restart"),
            "stop jobs (they checkpoint), then resume them",
        ),
        ("remove", Command(LIFECYCLE, "cmd_remove"), "move settled jobs whole to ROOT/archive/"),
        ("archive", Command(LIFECYCLE, "cmd_remove"), "the same as remove"),
    ):
        if not wanted(name):
            continue
        sub = command(name, help=text)
        sub.add_argument("jobs", nargs="+", metavar="JOB", help="job ids, or all")
        sub.add_argument("--json", action="store_true")
        sub.set_defaults(func=func)

    if wanted("signal"):
        signal = command("signal", help="send a signal to a job's worker (USR1: stack dump)")
        signal.add_argument("job")
        signal.add_argument("signal", help="HUP, INT, QUIT, USR1, USR2, TERM, CONT, STOP or WINCH")
        signal.add_argument("--json", action="store_true")
        signal.set_defaults(func=Command(LIFECYCLE, "cmd_signal"))

    if wanted("rejected"):
        rejected = command("rejected", help="rejected requests and their problems, newest last")
        rejected.add_argument("-n", "--lines", type=int, default=100, help="how many (default 100)")
        rejected.add_argument("--json", action="store_true")
        rejected.set_defaults(func=Command(LIFECYCLE, "cmd_rejected"))

    for name, func, text in (
        ("resume", Command(DAEMON, "cmd_resume"), "queue a stopped or escalated job again"),
        ("checkpoints", Command(DAEMON, "cmd_checkpoints"), "checkpoints and their verdicts"),
    ):
        if not wanted(name):
            continue
        sub = command(name, help=text)
        sub.add_argument("job")
        sub.add_argument("--json", action="store_true")
        sub.set_defaults(func=func)

    if wanted("tail"):
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
        tail.set_defaults(func=Command("tailing", "cmd_tail"))

    if wanted("maintail"):
        maintail = command("maintail", help="the end of the daemon's own log, readable")
        maintail.add_argument("-n", "--lines", type=int, default=20, help="how many (default 20)")
        maintail.add_argument("-f", "--follow", action="store_true")
        maintail.add_argument("--json", action="store_true")
        maintail.set_defaults(func=Command("tailing", "cmd_maintail"))

    if wanted("metrics"):
        metrics = command("metrics", help="Prometheus text exposition")
        metrics.add_argument("--json", action="store_true")
        metrics.set_defaults(func=Command(DAEMON, "cmd_metrics"))

    if wanted("shutdown"):
        shutdown = command("shutdown", help="preempt every worker and stop the daemon")
        shutdown.add_argument("--json", action="store_true")
        shutdown.set_defaults(func=Command(DAEMON, "cmd_shutdown"))

    if wanted("verify"):
        verify = command(
            "verify",
            help="prove a resumed run continued the reference: JOB REFERENCE_JOB through the "
            "daemon, or REFERENCE CANDIDATE paths (events files or run folders)",
        )
        verify.add_argument("first", metavar="JOB|REFERENCE")
        verify.add_argument("second", metavar="REFERENCE_JOB|CANDIDATE")
        verify.add_argument("--json", action="store_true", help="print the report as JSON")
        verify.set_defaults(func=Command("evidence", "cmd_verify"))

    if wanted("inspect"):
        inspect = command(
            "inspect",
            help="a checkpoint's identity and verdict: JOB [STEP] through the daemon (newest "
            "committed unless STEP), or a FILE",
        )
        inspect.add_argument("target", metavar="JOB|FILE")
        inspect.add_argument("step", nargs="?", type=int, help="the checkpoint's step (with JOB)")
        inspect.add_argument("--json", action="store_true", help="print as JSON")
        inspect.add_argument(
            "--values", action="store_true", help="include the arrays of small states"
        )
        inspect.set_defaults(func=Command("evidence", "cmd_inspect"))

    if wanted("dashboard"):
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
        dashboard.set_defaults(func=Command("web", "cmd_dashboard"))

    if wanted("version"):
        version = command("version", help="print the version")
        version.add_argument("--json", action="store_true")
        version.set_defaults(func=Command(DAEMON, "cmd_version"))

    if wanted("wait-ready"):
        ready = command(
            "wait-ready",
            help="wait until the daemon answers, its spool and socket up (exit 1 if not in time)",
        )
        ready.add_argument("--within", type=float, default=60.0, help="seconds to wait at most")
        ready.add_argument("-q", "--quiet", action="store_true", help="print nothing when ready")
        ready.add_argument("--json", action="store_true", help="print as JSON")
        ready.set_defaults(func=Command(DAEMON, "cmd_wait_ready"))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``wardenctl``."""
    from jobwarden.control.client import DaemonBusy, DaemonUnreachable
    from jobwarden.protocol import ControlError

    words = sys.argv[1:] if argv is None else argv
    args = build_parser(chosen_command(words)).parse_args(words)
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
