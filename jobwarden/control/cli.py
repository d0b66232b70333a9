"""``wardenctl``: the operator's command line.

Commands that ask the daemon go over its control socket (``--root`` or
``$JOBWARDEN_ROOT`` selects it, ``--socket`` names it).  ``verify`` and
``inspect`` work on files and need no daemon.

Exit statuses follow supervisorctl's LSB convention where one applies:
0 ok, 1 the daemon is not reachable or refused the request, 2 usage error,
3 ``status``: some job needs attention (failed or escalated), 4 no such job.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobwarden import __version__
from jobwarden.control.protocol import ControlError
from jobwarden.states import NEEDS_ATTENTION, SETTLED, JobState

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_ATTENTION = 3
EXIT_NO_SUCH = 4

# `status` exits EXIT_ATTENTION when a job is in one of these.
ATTENTION_STATES = frozenset(state.value for state in NEEDS_ATTENTION)
# `tail -f` stops once a job rests here: settled, or preempted until someone resumes it.
RESTING_STATES = frozenset(state.value for state in SETTLED | {JobState.PREEMPTED})


def _print(data: Any, as_json: bool, text: Callable[[Any], str]) -> None:
    sys.stdout.write((json.dumps(data, indent=2, default=str) if as_json else text(data)) + "\n")


def cmd_verify(args: argparse.Namespace) -> int:
    """Prove (or refuse) that CANDIDATE continues REFERENCE exactly."""
    from jobwarden.control import verify

    try:
        report = verify.verify(verify.load_run(args.reference), verify.load_run(args.candidate))
    except verify.VerifyInputError as error:
        sys.stderr.write(f"wardenctl verify: {error}\n")
        return EXIT_USAGE
    if args.json:
        _print(report.as_record(), True, str)
    else:
        sys.stdout.write(verify.render(report) + "\n")
    return EXIT_OK if report.proven else EXIT_REFUSED


def cmd_inspect(args: argparse.Namespace) -> int:
    """Describe a checkpoint file and its verdict."""
    from jobwarden.control import inspect

    record = inspect.describe(args.file, values=args.values)
    _print(record, args.json, inspect.render)
    return EXIT_OK if record["verdict"]["ok"] else EXIT_REFUSED


def _ask(args: argparse.Namespace, cmd: str, **fields: Any) -> Any:
    from jobwarden.control import client

    return client.request(client.socket_for(args.root, args.socket), cmd, **fields)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.0f}m"


def render_status(data: dict[str, Any]) -> str:
    """Status rows as a table."""
    header = ("JOB", "STATE", "ATTEMPT", "STEP", "LAST", "CKPT", "PID", "RSS", "UPTIME")
    rows = [header] + [
        (
            r["id"],
            r["state"],
            str(r["attempt"]),
            f"{r['step']}/{r['steps']}",
            _age(r["last_progress_age_s"]),
            "-" if r["newest_checkpoint_step"] is None else str(r["newest_checkpoint_step"]),
            str(r["pid"] or "-"),
            "-" if r["rss_mb"] is None else f"{r['rss_mb']:.0f}M",
            _age(r["uptime_s"]),
        )
        for r in data["jobs"]
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def render_job(data: dict[str, Any]) -> str:
    """One job's detail view."""
    lines = [
        f"{k}: {data[k]}"
        for k in (
            "id",
            "state",
            "reason",
            "task",
            "checkpoint",
            "attempt",
            "restarts",
            "step",
            "steps",
            "newest_checkpoint_step",
            "pid",
            "rss_mb",
            "cpu_percent",
            "process_status",
            "threads",
            "replayed_updates",
            "time_lost_s",
            "incidents",
        )
    ]
    lines.append("history:")
    lines += [f"  {h.get('from', '-')} -> {h['to']}: {h['reason']}" for h in data["history"]]
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    """One row per job, or one job in detail."""

    try:
        data = _ask(args, "status", job=args.job)
    except ControlError as error:
        sys.stderr.write(f"wardenctl: {error.message}\n")
        return EXIT_NO_SUCH if error.code == "control.no_such_job" else EXIT_REFUSED
    _print(data, args.json, render_job if args.job else render_status)
    states = [data["state"]] if args.job else [r["state"] for r in data["jobs"]]
    return EXIT_ATTENTION if ATTENTION_STATES.intersection(states) else EXIT_OK


def render_incidents(data: list[dict[str, Any]]) -> str:
    """Incidents, one line each."""
    return (
        "\n".join(f"{i['id']}  {i['kind']:<22} {i['status']:<10} {i['outcome']}" for i in data)
        or "no incidents"
    )


def cmd_incidents(args: argparse.Namespace) -> int:
    """Every incident, or one job's."""
    _print(_ask(args, "incidents", job=args.job), args.json, render_incidents)
    return EXIT_OK


def cmd_runbook(args: argparse.Namespace) -> int:
    """Print an incident's rendered runbook."""
    data = _ask(args, "runbook", incident=args.incident)
    _print(data, args.json, lambda d: d["text"].rstrip() + f"\n\n(runbook file: {d['path']})")
    return EXIT_OK


def cmd_submit(args: argparse.Namespace) -> int:
    """Validate FILE here, hand it to the daemon's spool, and print the job id."""
    from jobwarden.errors import JobFileError
    from jobwarden.jobfile import load_job

    source = Path(args.file)
    try:
        load_job(source)
    except JobFileError as error:
        sys.stderr.write(f"wardenctl submit: {source} is invalid, not submitted:\n")
        sys.stderr.write("".join(f"  {problem}\n" for problem in error.problems))
        return EXIT_USAGE
    suffix = ".json" if source.suffix == ".json" else ".toml"
    result = _ask(args, "submit", name=source.stem + suffix, content=source.read_text())
    if result["accepted"]:
        _print(result, args.json, lambda d: d["job"])
        return EXIT_OK
    _print(
        result,
        args.json,
        lambda d: "rejected: " + "; ".join(d["problems"]) + f" (kept at {d['kept_at']})",
    )
    return EXIT_REFUSED


def cmd_stop(args: argparse.Namespace) -> int:
    """Preempt a job: its worker commits its current step and exits."""
    _print(
        _ask(args, "stop", job=args.job),
        args.json,
        lambda d: (
            f"{d['job']}: stopping (pid {d['pid']})"
            if d["stopping"]
            else f"{d['job']}: {d['state']}"
        ),
    )
    return EXIT_OK


def cmd_resume(args: argparse.Namespace) -> int:
    """Queue a preempted, failed or escalated job again."""
    _print(_ask(args, "resume", job=args.job), args.json, lambda d: f"{d['job']}: {d['state']}")
    return EXIT_OK


def render_event(event: dict[str, Any]) -> str:
    """One event as a readable line."""
    import time

    stamp = time.strftime("%H:%M:%S", time.localtime(event.get("time", 0)))
    kind = event.get("event", "?")
    skip = {"v", "event", "time", "attempt", "components", "runtime", "traceback"}
    fields = " ".join(f"{k}={_short(v)}" for k, v in event.items() if k not in skip)
    return f"#{event.get('attempt')} {stamp} {kind:<10} {fields}"


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value):
        return value[:12]
    text = json.dumps(value) if isinstance(value, list | dict) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def cmd_tail(args: argparse.Namespace) -> int:
    """Print a job's events; -f follows them until the job ends."""
    import time

    cursor: dict[str, Any] = {"attempt": 1, "offset": 0}
    while True:
        data = _ask(args, "events", job=args.job, **cursor)
        for event in data["events"]:
            sys.stdout.write((json.dumps(event) if args.json else render_event(event)) + "\n")
        sys.stdout.flush()
        cursor = data["cursor"]
        if not args.follow or (not data["events"] and data["state"] in RESTING_STATES):
            return EXIT_OK
        if not data["events"]:
            time.sleep(0.2)


def render_checkpoints(rows: list[dict[str, Any]]) -> str:
    """Checkpoint files with their verdicts."""
    lines = []
    for row in rows:
        verdict = row["verdict"]
        mark = "ok" if verdict["ok"] else verdict.get("code", "refused")
        lines.append(
            f"{row['where']:<11} step {row['step']!s:>6}  {row['bytes']!s:>10} B  "
            f"{mark:<22} {Path(row['file']).name}  {verdict.get('message', '')}"
        )
    return "\n".join(lines) or "no checkpoint files"


def cmd_checkpoints(args: argparse.Namespace) -> int:
    """Every checkpoint file of a job with its validation verdict."""
    _print(_ask(args, "checkpoints", job=args.job), args.json, render_checkpoints)
    return EXIT_OK


def cmd_metrics(args: argparse.Namespace) -> int:
    """Prometheus text exposition."""
    data = _ask(args, "metrics")
    _print(data, args.json, lambda d: d["text"].rstrip())
    return EXIT_OK


def cmd_shutdown(args: argparse.Namespace) -> int:
    """Ask the daemon to preempt its workers and exit."""
    _print(_ask(args, "shutdown"), args.json, lambda d: f"wardend stopping; preempting {d['live']}")
    return EXIT_OK


def cmd_drill(args: argparse.Namespace) -> int:
    """Rehearse failures through a daemon; exit 0 only if every check of every drill held."""
    from jobwarden.control import drill

    # The options not given are absent from ``args`` (SUPPRESS): DrillParams' defaults hold.
    given = vars(args)
    params = dataclasses.replace(
        drill.DrillParams(),
        **{f.name: given[f.name] for f in dataclasses.fields(drill.DrillParams) if f.name in given},
    )
    names = list(drill.DRILLS) if args.drill == "all" else [args.drill]
    root = Path(args.root) if args.root else None
    results = drill.run_drills(names, root, Path(args.out), params)
    if args.json:
        records = [r.as_record() for r in results]
        _print(
            records[0]
            if len(records) == 1
            else {"ok": all(r.ok for r in results), "drills": records},
            True,
            str,
        )
    else:
        sys.stdout.write("\n\n".join(drill.render(r) for r in results) + "\n")
        if len(results) > 1:
            passed = sum(r.ok for r in results)
            sys.stdout.write(f"\n{passed}/{len(results)} drills passed\n")
    return EXIT_OK if all(r.ok for r in results) else EXIT_REFUSED


def cmd_version(args: argparse.Namespace) -> int:
    """Print the client's version, and the daemon's when one answers."""
    from jobwarden.control.client import DaemonUnreachable

    data: dict[str, Any] = {"wardenctl": __version__}
    try:
        data["wardend"] = _ask(args, "version")
    except DaemonUnreachable as error:
        data["wardend"] = None
        data["note"] = error.message
    _print(
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    parser = argparse.ArgumentParser(prog="wardenctl", description="Control and inspect jobwarden.")
    parser.add_argument("--root", help="the daemon's root (default $JOBWARDEN_ROOT)")
    parser.add_argument("--socket", help="the control socket (default ROOT/control.sock)")
    # The same options after the command (`wardenctl drill crash --root DIR`); SUPPRESS keeps
    # a value given before the command when none is given after it.
    selector = argparse.ArgumentParser(add_help=False)
    selector.add_argument("--root", default=argparse.SUPPRESS, help="the daemon's root")
    selector.add_argument("--socket", default=argparse.SUPPRESS, help="the control socket")
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
    drill.add_argument("--out", default="drill-evidence", help="evidence folder")
    drill.add_argument("--json", action="store_true")
    # No defaults here: cmd_drill starts from DrillParams() and applies only the options
    # given, since importing the drills to read their defaults would slow every command.
    for option, kind, text in (
        ("--seed", int, "the training seed of every drill job"),
        ("--steps", int, "training steps of every drill job"),
        ("--checkpoint-every", int, "steps between checkpoints"),
        ("--fail-after", int, "the update after which the crash drill fails"),
        ("--stall-at", int, "completed updates before the stall drill hangs"),
        ("--task", str, "the task every drill job trains"),
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
    from jobwarden.control.client import DaemonUnreachable

    args = build_parser().parse_args(argv)
    try:
        status: int = args.func(args)
    except DaemonUnreachable as error:
        sys.stderr.write(f"wardenctl: {error.message}\n")
        return EXIT_REFUSED
    except ControlError as error:
        sys.stderr.write(f"wardenctl: {error.code}: {error.message}\n")
        return EXIT_NO_SUCH if error.code.startswith("control.no_such") else EXIT_REFUSED
    return status


if __name__ == "__main__":
    sys.exit(main())
