"""``wardend --root DIR``: run the supervisor daemon in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

from jobwarden.checkpoint.signing import load_key
from jobwarden.daemon import sandbox
from jobwarden.daemon.config import (
    LaunchSettings,
    MetricsSettings,
    NotifySettings,
    Options,
    SlurmOptions,
)
from jobwarden.daemon.launch import registry
from jobwarden.daemon.launch.base import LauncherError
from jobwarden.daemon.observe import exporter, hooks
from jobwarden.daemon.store import logs
from jobwarden.daemon.store.layout import Root
from jobwarden.daemon.wardend import Wardend
from jobwarden.errors import JobwardenError


def parser() -> argparse.ArgumentParser:
    """wardend's options; every default comes from `Options`."""
    default = Options()
    ap = argparse.ArgumentParser(
        prog="wardend", description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    root = os.environ.get("JOBWARDEN_ROOT")
    ap.add_argument(
        "--root",
        type=Path,
        default=Path(root) if root else None,
        required=not root,
        help="the daemon's root folder (default $JOBWARDEN_ROOT)",
    )
    socket = os.environ.get("JOBWARDEN_SOCKET")
    ap.add_argument(
        "--socket",
        type=Path,
        default=Path(socket) if socket else None,
        help="control socket (default $JOBWARDEN_SOCKET, else ROOT/control.sock)",
    )
    ap.add_argument("--group", help="a group whose members may use the control socket")
    ap.add_argument(
        "--max-concurrent",
        type=int,
        default=default.max_concurrent,
        help="jobs run at once (the number of CPUs unless given)",
    )
    ap.add_argument(
        "--rescan-interval",
        type=float,
        default=default.rescan_interval_s,
        help="seconds between safety-net rescans of the spool",
    )
    ap.add_argument(
        "--control-timeout",
        type=float,
        default=default.control_timeout_s,
        help="seconds a control client has to send a complete request",
    )
    ap.add_argument(
        "--compile-cache",
        type=Path,
        help="the workers' JAX compilation cache (default ROOT/cache/jax)",
    )
    ap.add_argument(
        "--sample-interval",
        type=float,
        default=default.sample_interval_s,
        help="seconds between psutil samples of each worker",
    )
    ap.add_argument(
        "--launcher",
        default=default.launch.name,
        help="how attempts are started: a name from the jobwarden.launchers entry points, "
        "or module:attribute",
    )
    for name, what in (
        ("partition", "the partition of every attempt (a job's [slurm] partition wins)"),
        ("account", "the account every attempt is charged to"),
        ("time", "the time limit of every attempt, as sbatch --time takes it (a job's wins)"),
        ("extra", "more sbatch options for every attempt, split as a shell splits them"),
    ):
        ap.add_argument(f"--slurm-{name}", help=f"with --launcher slurm: {what}")
    ap.add_argument(
        "--slurm-signal-lead",
        type=int,
        default=default.launch.slurm.signal_lead_s,
        metavar="SECONDS",
        help="with --launcher slurm: how long before the time limit Slurm sends SIGTERM",
    )
    ap.add_argument(
        "--signing-key",
        type=Path,
        help="a private key file (0600): workers sign every checkpoint with HMAC-SHA256 and "
        "refuse one whose signature is missing or wrong",
    )
    ap.add_argument(
        "--notify-exec",
        metavar="PROGRAM",
        help="run PROGRAM (no shell, no arguments) on each job state change and incident, "
        "the event as JSON on stdin and in JOBWARDEN_EVENT_* variables",
    )
    ap.add_argument(
        "--notify-webhook",
        metavar="URL",
        help="POST each job state change and incident as JSON to this http(s) URL",
    )
    ap.add_argument(
        "--notify-timeout",
        type=float,
        default=default.notify.timeout_s,
        help="seconds one try of the hook or webhook may take in all (the hook is then killed "
        "with its process group, the webhook's connection cut)",
    )
    ap.add_argument(
        "--notify-tries",
        type=int,
        default=default.notify.tries,
        metavar="N",
        help="tries of each event before it is dropped (1 to 10); later events wait behind them",
    )
    ap.add_argument(
        "--notify-backoff",
        type=float,
        default=default.notify.backoff_s,
        metavar="SECONDS",
        help="the wait after a first failed try, doubled after each further one (0 to 60)",
    )
    ap.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus /metrics here (off by default; a bare PORT binds 127.0.0.1)",
    )
    ap.add_argument(
        "--metrics-textfile",
        type=Path,
        metavar="PATH",
        help="rewrite this file atomically with the metrics every sampling turn "
        "(for node_exporter's textfile collector: name it *.prom)",
    )
    ap.add_argument(
        "--no-warm-spare",
        action="store_true",
        help="start every attempt cold: no pre-started worker per task (local launcher; "
        "default: one warm spare per task and configuration, docs/daemon.md)",
    )
    ap.add_argument(
        "--spare-memory-mb",
        type=float,
        metavar="MB",
        help="the memory the spares of SDK programs may hold together (0: no such spares; "
        "default: no cap; a spare of a large model doubles its host memory while it waits)",
    )
    ap.add_argument(
        "--keep-finished",
        type=int,
        metavar="N",
        help="keep the N most recently settled completed or cancelled jobs in the table and "
        "move older ones whole to ROOT/archive/ (never deleted; failed and escalated jobs "
        "wait for a person); default: keep every job",
    )
    ap.add_argument(
        "--keep-finished-days",
        type=float,
        metavar="DAYS",
        help="also move completed or cancelled jobs settled more than DAYS ago to "
        "ROOT/archive/ (judged by the time they came to rest); default: by age never",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, take the root lock, run the loop."""
    args = parser().parse_args(argv)
    if (refused := retired_environment(os.environ)) is not None:
        sys.stderr.write(f"wardend: {refused}\n")
        return 2
    try:
        launch = LaunchSettings(
            name=args.launcher,
            warm_spares=not args.no_warm_spare,
            spare_memory_mb=args.spare_memory_mb,
            slurm=slurm_options(args),
        )
        chosen = registry.load(args.launcher, launch)
        if args.signing_key is not None:
            load_key(args.signing_key.absolute())
        hooks.check_retries(args.notify_timeout, args.notify_tries, args.notify_backoff)
        notify = NotifySettings(
            exec=hooks.check_program(args.notify_exec) if args.notify_exec else None,
            webhook=hooks.check_webhook(args.notify_webhook) if args.notify_webhook else None,
            timeout_s=args.notify_timeout,
            tries=args.notify_tries,
            backoff_s=args.notify_backoff,
        )
        permits = sandbox.probe()
        refuse_what_is_blocked(args, chosen.name, permits)
    except JobwardenError as error:
        sys.stderr.write(f"wardend: {error.message}\n")
        return error.exit_status
    if args.keep_finished is not None and args.keep_finished < 0:
        sys.stderr.write("wardend: --keep-finished must be 0 or more\n")
        return 2
    days = args.keep_finished_days
    if days is not None and not 0 < days < 100_000:
        sys.stderr.write(f"wardend: --keep-finished-days must be above 0, not {days:g}\n")
        return 2
    # Whatever the root's mode, everything the daemon creates is private to its user.
    os.umask(0o077)
    root = Root(args.root.absolute())
    try:
        root.create()
        lock = root.lock()
    except JobwardenError as error:  # RootUnsafeError, RootLockedError
        sys.stderr.write(f"wardend: {error.message}\n")
        return error.exit_status
    daemon_log = logs.configure(root.log)
    options = Options(
        max_concurrent=args.max_concurrent,
        socket=args.socket,
        group=args.group,
        rescan_interval_s=args.rescan_interval,
        sample_interval_s=args.sample_interval,
        compile_cache=args.compile_cache.absolute() if args.compile_cache else None,
        control_timeout_s=args.control_timeout,
        launch=launch,
        signing_key=args.signing_key.absolute() if args.signing_key else None,
        notify=notify,
        metrics=MetricsSettings(
            args.metrics_listen,
            args.metrics_textfile.absolute() if args.metrics_textfile else None,
        ),
        keep_finished=args.keep_finished,
        keep_finished_days=days,
    )
    try:
        daemon = Wardend(root, options, chosen, permits)
        return asyncio.run(daemon.run())
    except exporter.MetricsListenError as error:
        sys.stderr.write(f"wardend: {error.message}\n")
        return error.exit_status
    finally:
        daemon_log.close()
        os.close(lock)


def refuse_what_is_blocked(
    args: argparse.Namespace, launcher: str, permits: sandbox.Permits
) -> None:
    """Refuse at start an option the sandbox would defeat at run time: the launcher's
    cluster tools, ``--metrics-listen`` or ``--notify-webhook`` needing a network it
    blocks.  Raises `LauncherError`, `MetricsListenError` or `NotifySettingError`, whose
    message names the unit's setting (`jobwarden.daemon.sandbox`)."""
    if (refused := sandbox.launcher_refusal(launcher, permits)) is not None:
        raise LauncherError(refused)
    if args.metrics_listen is not None:
        host, _ = exporter.parse_address(args.metrics_listen)
        if (refused := sandbox.reach_refusal(host, permits, "the listener")) is not None:
            raise exporter.MetricsListenError(args.metrics_listen, refused)
    if args.notify_webhook is not None:
        host = urllib.parse.urlsplit(args.notify_webhook).hostname or ""
        if (refused := sandbox.reach_refusal(host, permits, "the webhook")) is not None:
            raise hooks.NotifySettingError("--notify-webhook", args.notify_webhook, refused)


RETIRED_PREFIX = "JOBWARDEN_SLURM_"
"""Variables an earlier wardend read for the Slurm launcher; the ``--slurm-*`` options now."""


def retired_environment(env: Mapping[str, str]) -> str | None:
    """Why wardend refuses to start when a retired ``JOBWARDEN_SLURM_*`` variable is set
    (it would be ignored silently otherwise), or None."""
    found = sorted(name for name in env if name.startswith(RETIRED_PREFIX))
    if not found:
        return None
    flags = {"TIME": "time", "SIGNAL_S": "signal-lead"}
    named = []
    for name in found:
        setting = name.removeprefix(RETIRED_PREFIX)
        named.append(f"{name} (use --slurm-{flags.get(setting, setting.lower())})")
    named_text = ", ".join(named)
    return f"launcher settings are options now, not environment variables: unset {named_text}"


def slurm_options(args: argparse.Namespace) -> SlurmOptions:
    """The ``--slurm-*`` options as typed settings; raises `LauncherError` on a bad one."""
    try:
        extra = tuple(shlex.split(args.slurm_extra or ""))
    except ValueError as error:
        raise LauncherError(f"--slurm-extra {args.slurm_extra!r}: {error}") from error
    if args.slurm_signal_lead < 0:
        lead = args.slurm_signal_lead
        raise LauncherError(f"--slurm-signal-lead must be 0 or more, not {lead}")
    return SlurmOptions(
        partition=args.slurm_partition or None,
        account=args.slurm_account or None,
        time_limit=args.slurm_time or None,
        signal_lead_s=args.slurm_signal_lead,
        extra=extra,
    )


if __name__ == "__main__":
    sys.exit(main())
