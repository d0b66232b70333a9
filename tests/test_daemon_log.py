"""The daemon's log never holds its loop: a stderr that nobody reads does not stop it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from jobwarden.control.harness import Wardend

REQUESTS = 300
"""Rejected requests: each logs a record, together far more than a pipe's 64 KiB."""


def test_a_stderr_nobody_reads_leaves_the_daemon_answering(tmp_path: Path) -> None:
    """wardend's stderr is a FIFO whose reader never reads.  300 bad requests are each
    rejected with its error file, ``status`` answers all the while, and wardend.log
    holds every rejection.  Before the log was written off the loop, the daemon stopped
    answering once the pipe's buffer filled."""
    fifo = tmp_path / "stderr.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # held open, never read
    daemon = Wardend(tmp_path / "root", None, stderr=fifo)
    try:
        daemon.start()
        for n in range(REQUESTS):
            daemon.drop(f"bad-{n:03d}.toml", f'id = "bad-{n:03d}"\ntask = "no-such-task"\n')
        deadline = time.monotonic() + 60
        rejected: list[str] = []
        slowest = 0.0
        while time.monotonic() < deadline:
            began = time.monotonic()
            daemon.ask("status", timeout=5)
            slowest = max(slowest, time.monotonic() - began)
            rejected = [n for n in os.listdir(daemon.root / "spool" / "rejected") if "error" in n]
            if len(rejected) == REQUESTS:
                break
            time.sleep(0.05)
        assert len(rejected) == REQUESTS, f"{len(rejected)} of {REQUESTS} rejected in 60 s"
        assert slowest < 2.0, f"a status took {slowest:.2f} s"
        # a status answered after the last rejection: the loop is not stuck behind stderr
        assert daemon.ask("version", timeout=5)["pid"] == daemon.pid
        logged = (daemon.root / "wardend.log").read_text().splitlines()
        events = [json.loads(line)["event"] for line in logged]
        assert events.count("spool.rejected") == REQUESTS, sorted(set(events))
    finally:
        daemon.stop(timeout=30)
        os.close(reader)
