"""wardend's settings, typed: what the command line (or a harness) decides before the loop runs.

Everything the daemon and its parts are configured with lives here as frozen
data, so that each part is handed its settings instead of reading them from
the environment or from a module of another part: `Options` for the loop,
`NotifySettings` for hooks, `MetricsSettings` for the exporter, and
`LaunchSettings` (with `SlurmOptions`) for the launcher.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class NotifySettings:
    """``--notify-*``: the sinks and how each event is tried; no sink by default."""

    exec: str | None = None
    """The hook program's absolute path (`hooks.check_program`)."""
    webhook: str | None = None
    """An http or https URL (`hooks.check_webhook`)."""
    timeout_s: float = 10.0
    """Seconds one try may take in all: the hook's run to its exit, or the webhook's exchange."""
    tries: int = 3
    """Tries of one event before it is dropped (`hooks.check_retries`)."""
    backoff_s: float = 0.5
    """The wait after a first failed try; doubled after each further one."""


@dataclass(frozen=True)
class MetricsSettings:
    """``--metrics-listen`` and ``--metrics-textfile``; both off by default."""

    listen: str | None = None
    """``HOST:PORT`` (`exporter.parse_address`); a bare port binds loopback."""
    textfile: Path | None = None
    """A ``*.prom`` file in node_exporter's textfile folder."""


@dataclass(frozen=True)
class SlurmOptions:
    """``--slurm-*``: the sbatch options every attempt gets (a job's ``[slurm]`` section wins
    for partition, time limit and nodes)."""

    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None
    signal_lead_s: int = 60
    """Seconds before the time limit at which Slurm sends SIGTERM (``--signal=B:TERM@N``)."""
    extra: tuple[str, ...] = ()
    """More sbatch options, already split as a shell splits them."""


@dataclass(frozen=True)
class LaunchSettings:
    """How attempts are started: the launcher's name and what it is configured with."""

    name: str = "local"
    """A ``jobwarden.launchers`` entry point, or ``module:attribute``."""
    warm_spares: bool = True
    """One pre-started worker per task and configuration, and one per SDK command job
    (launchers that have spares)."""
    spare_memory_mb: float | None = None
    """The memory all spares of SDK programs may hold together; None: no cap."""
    slurm: SlurmOptions = field(default_factory=SlurmOptions)


@dataclass(frozen=True)
class Options:
    """Daemon settings from the command line."""

    max_concurrent: int = max(1, os.cpu_count() or 1)
    socket: Path | None = None
    group: str | None = None
    rescan_interval_s: float = 5.0
    sample_interval_s: float = 1.0
    compile_cache: Path | None = None
    control_timeout_s: float = 5.0
    signing_key: Path | None = None
    launch: LaunchSettings = field(default_factory=LaunchSettings)
    notify: NotifySettings = field(default_factory=NotifySettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    keep_finished: int | None = None
    """``--keep-finished N``: settled completed or cancelled jobs kept in the table."""
    keep_finished_days: float | None = None
    """``--keep-finished-days D``: such jobs settled longer ago are archived."""
