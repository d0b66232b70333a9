"""What a job's supervisor, and the modules that record its outcomes, use of their daemon.

Its own module so that `supervisor`, `outcomes` and `adoption` all depend on
it and on nothing of each other's: the daemon (`Wardend`) builds one
`Services` and hands it to every `JobSupervisor` it makes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from jobwarden.daemon.incidents.records import IncidentLog
from jobwarden.daemon.launch.base import Launcher
from jobwarden.daemon.stats import Stats
from jobwarden.daemon.store.jobs import JobRecord, JobTable
from jobwarden.daemon.store.layout import Root
from jobwarden.daemon.supervise.stall import Clock


class Supervising(Protocol):
    """A supervisor, as the daemon is told that it settled: by the job it holds."""

    @property
    def record(self) -> JobRecord:
        """The job's record."""


@dataclass
class Services:
    """What a supervisor uses of its daemon."""

    root: Root
    table: JobTable
    incidents: IncidentLog
    launcher: Launcher
    stats: Stats
    clock: Clock
    compile_cache: Path
    signing_key: Path | None
    environment: dict[str, str]
    spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]]
    owner_of: Callable[[JobRecord], JobRecord | None]
    on_settled: Callable[[Supervising], None]
