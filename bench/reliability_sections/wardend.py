"""The reliability sections' daemon: the package's harness, with their patience.

They run on a loaded machine and restart daemons mid-write, so they wait longer for a job
(300 s) and for a stop (90 s) than the tests do, and poll at 50 ms.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from jobwarden.control import client, harness
from jobwarden.control.client import DaemonBusy, DaemonUnreachable
from jobwarden.protocol import ControlError

from .common import SETTLED_STATES, Record


class Wardend(harness.Wardend):
    """One wardend process on its own root; requests over its socket, files into its spool."""

    wait_timeout_s = 300.0
    stop_timeout_s = 90.0
    poll_s = 0.05

    def process(self) -> psutil.Process:
        """The daemon as psutil sees it, for its rss and descriptors."""
        return psutil.Process(self.pid)


@contextlib.contextmanager
def running(
    root: Path, cache: Path | None, *extra: str, stderr: Path | None = None
) -> Iterator[Wardend]:
    """A started daemon (its stderr to ``stderr``, or the harness's file), stopped (SIGTERM)
    on the way out."""
    daemon = Wardend(root, cache, *extra, stderr=stderr)
    try:
        yield daemon.start()
    finally:
        daemon.stop()


def timed_status(sock: Path, job: str | None = None, timeout: float = 30) -> float:
    """Seconds one ``status`` (or ``status JOB``) takes, retries on a busy daemon included."""
    began = time.perf_counter()
    if job is None:
        client.request(sock, "status", timeout=timeout)
    else:
        client.request(sock, "status", timeout=timeout, job=job)
    return time.perf_counter() - began


def status_latencies(sock: Path, n: int, job: str | None = None) -> list[float]:
    """``n`` sequential status requests, each timed."""
    return [timed_status(sock, job) for _ in range(n)]


def wait_settled_or(daemon: Wardend, job: str, timeout: float) -> Record | None:
    """The job's status once settled (or None if the daemon died or time ran out)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline and daemon.alive():
        with contextlib.suppress(DaemonBusy, DaemonUnreachable, ControlError):
            last = daemon.status(job)
            if last is not None and last["state"] in SETTLED_STATES:
                return last
        time.sleep(0.1)
    return last
