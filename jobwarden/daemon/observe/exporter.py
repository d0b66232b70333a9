"""Prometheus scraping: ``/metrics`` over HTTP, and a textfile for node_exporter.

The collector (`metrics.render`) reads the daemon's job table, which only the
loop may touch, so the loop renders the exposition every sampling turn and
keeps the bytes; the HTTP listener (`listener.Listener`, its own thread, at
most 16 connections of at most 5 s each) serves the last rendering and never
reads the table.  ``--metrics-textfile`` writes the same text each turn, off
the loop, by a pending sibling, fsync and rename (`files.write_text_atomic`),
so node_exporter's textfile collector (which reads only ``*.prom``) never
sees half a file.  Both are off by default; the listener binds loopback
unless a host is given.  Any local user can read either, so the daemon hands
its exporter a rendering without the series named by job (`metrics.render`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import structlog

from jobwarden.daemon.background import off_loop
from jobwarden.daemon.config import MetricsSettings
from jobwarden.daemon.observe.listener import Listener
from jobwarden.daemon.store.evidence import describe
from jobwarden.errors import JobwardenError
from jobwarden.files import PENDING_SUFFIX, Directory, write_all

log = structlog.get_logger("wardend.metrics")

LOOPBACK = "127.0.0.1"
TEXTFILE_MODE = 0o644
"""node_exporter runs as its own user: the textfile is readable by others, so it names no job."""


class MetricsListenError(JobwardenError):
    """Raised at start when ``--metrics-listen`` is malformed or its address cannot be bound."""

    code = "metrics.listen"
    exit_status = 2

    def __init__(self, address: str, problem: str) -> None:
        super().__init__(f"--metrics-listen {address!r}: {problem}", address=address)


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPV6]:PORT``, ``:PORT`` or ``PORT`` as (host, port); loopback by default.

    Raises `MetricsListenError` naming what was wrong.
    """
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise MetricsListenError(text, "expected HOST:PORT with a port from 0 to 65535")
    return host or LOOPBACK, int(port)


def write_textfile(path: Path, text: str) -> None:
    """Durably replace ``path`` with ``text``, mode 0644 whatever the umask.

    ``<name>.pending`` is written, fsynced and renamed over ``path`` in the
    same folder (opened without following a link), then the folder is fsynced.
    """
    with Directory.open(path.parent) as folder:
        pending = path.name + PENDING_SUFFIX
        fd = folder.create_exclusive(pending, TEXTFILE_MODE)
        try:
            os.fchmod(fd, TEXTFILE_MODE)
            write_all(fd, [memoryview(text.encode())])
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            folder.unlink(pending, missing_ok=True)
            raise
        os.close(fd)
        os.replace(pending, path.name, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
        folder.fsync()


class Exporter:
    """Renders the daemon's metrics on the loop and hands them to the listener and textfile."""

    def __init__(
        self, render: Callable[[], str], settings: MetricsSettings, interval_s: float
    ) -> None:
        self.render = render
        """The exposition of the daemon's state now (`metrics.render` of its view)."""
        self.listen = settings.listen
        self.textfile = settings.textfile
        self.interval_s = interval_s
        self.server: Listener | None = None
        self.textfile_error: str | None = None
        self.renderings = 0

    def start(self, spawn: Callable[[Coroutine[Any, Any, Any]], object]) -> None:
        """Bind the listener (raises `MetricsListenError`) and start the rendering task."""
        if self.listen is not None:
            host, port = parse_address(self.listen)
            try:
                self.server = Listener(host, port)
            except OSError as error:
                raise MetricsListenError(self.listen, describe(error)) from error
            self.refresh()
            self.server.start()
            bound = self.server.address
            log.info("metrics.listening", host=bound[0], port=bound[1], path="/metrics")
        if self.server is not None or self.textfile is not None:
            spawn(self.run())

    def refresh(self) -> str:
        """Render now (on the loop) and hand the bytes to the listener."""
        text = self.render()
        if self.server is not None:
            self.server.exposition = text.encode()
        self.renderings += 1
        return text

    async def run(self) -> None:
        """Render, serve and write the textfile every interval, until cancelled."""
        while True:
            text = self.refresh()
            if self.textfile is not None:
                await off_loop(self.write_textfile, text)
            await asyncio.sleep(self.interval_s)

    def write_textfile(self, text: str) -> None:
        """Replace the textfile atomically; a failure is logged once, and retried next turn."""
        assert self.textfile is not None
        try:
            write_textfile(self.textfile, text)
        except (OSError, JobwardenError) as error:
            problem = error.message if isinstance(error, JobwardenError) else describe(error)
            if problem != self.textfile_error:
                log.error("metrics.textfile_failed", path=str(self.textfile), error=problem)
            self.textfile_error = problem
        else:
            if self.textfile_error is not None:
                log.info("metrics.textfile_written", path=str(self.textfile))
            self.textfile_error = None

    def close(self) -> None:
        """Stop the listener and its thread."""
        if self.server is not None:
            self.server.close()
