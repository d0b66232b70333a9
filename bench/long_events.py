"""The loop while a long job's events file is read: ``status JOB`` and the first ``/metrics``.

A short linreg job runs to completion under a real wardend; then its one attempt's
``events.jsonl`` is replaced by a generated file of ``--megabytes`` (default 250, about
what a 660k-update job leaves at ``hash_every = 1``: ``ready``, one ``progress`` event
per update with its state hash, a commit every 100 updates, ``completed``), and wardend
starts on the root three times: plain, timing ``status JOB``; with ``--metrics-listen``
(the summary a fix saves removed first, so the file is read again), timing the first
``/metrics`` answer counting the job; plain again, timing how soon the goodput is known
from a saved summary.  Through each, the loop's longest block is the slowest of
``version`` requests sent every 20 ms from a thread from the launch on, until the job's
goodput is known (its status names no attempt still being read) and a second more.
Targets: ``status JOB`` and the loop's longest block within 1 s (the unit's
``WatchdogSec=30`` far off); the first ``/metrics`` counting the job is context (the
exporter renders once per ``--sample-interval``, its first rendering before the table
is loaded).

Run with ``.venv/bin/python bench/long_events.py`` (``--megabytes 25`` for a short look).
It prints a table and writes ``bench/results/long_events.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

# Run as a script, import through the repository, as bench/reliability.py does.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.figures import at_most, context, records
from jobwarden.control import harness
from jobwarden.control.client import DaemonBusy, DaemonUnreachable
from jobwarden.events import encode
from jobwarden.jobfolder import EVENTS_FILE

RESULTS = Path(__file__).parent / "results" / "long_events.json"
BLOCK_TARGET_S = 1.0
HASH = "ab" * 32
LINE_BYTES = 200
"""About the bytes of one update's events here (its progress line, a tenth of a commit's)."""


class PatientDaemon(harness.Wardend):
    """A wardend given time to start: the daemon before the fix rendered its metrics (the
    whole file parsed) before it opened its socket."""

    start_timeout_s = 300.0
    poll_s = 0.05


def free_port() -> int:
    """A loopback port no one listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def write_events(path: Path, megabytes: float, start: float, every: float) -> int:
    """Replace ``path`` with a long attempt's events from ``start`` on, an update every
    ``every`` s; returns the number of updates."""
    limit, step, at = megabytes * 1e6, 0, start
    ready = {"step": 0, "warmup_s": 0.5, "state_hash": HASH, "components": {}}
    with path.open("w") as out:
        out.write(encode("ready", ready, at))
        size = 0
        while size < limit:
            chunk = []
            for _ in range(1000):
                step, at = step + 1, at + every
                fields = {
                    "step": step,
                    "loss": 0.25,
                    "examples": 64 * step,
                    "update_s": 0.01,
                    "state_hash": HASH,
                }
                chunk.append(encode("progress", fields, at))
                if step % 100 == 0:
                    commit = {"step": step, "file": f"ckpt-{step}", "bytes": 4096}
                    commit |= {"seconds": 0.002, "state_hash": HASH, "blocked_s": 0.001}
                    chunk.append(encode("checkpoint", commit, at))
            text = "".join(chunk)
            out.write(text)
            size += len(text)
        out.write(encode("completed", {"step": step, "state_hash": HASH}, at + 0.01))
    return step


class Prober(threading.Thread):
    """Sends ``version`` every 20 ms from the daemon's launch on, and keeps the slowest
    answer's time (a request sent while the loop is held waits for it: the socket is
    listening, so it connects)."""

    def __init__(self, daemon: harness.Wardend) -> None:
        super().__init__(daemon=True)
        self.target, self.slowest, self.count = daemon, 0.0, 0
        self.done = threading.Event()

    def run(self) -> None:
        """Until told to stop."""
        while not self.done.is_set():
            began = time.monotonic()
            try:
                self.target.ask("version", timeout=300)
            except (DaemonBusy, DaemonUnreachable, OSError):
                pass
            else:
                self.slowest = max(self.slowest, time.monotonic() - began)
                self.count += 1
            time.sleep(0.02)


def first_metrics(port: int, began: float, limit_s: float) -> float:
    """Seconds from ``began`` until ``/metrics`` first answered counting the job (it names
    no job: its series by job are in ``wardenctl metrics`` alone)."""
    name = 'jobwarden_jobs{state="completed"} 1.0'
    while time.monotonic() - began < limit_s:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=300) as got:
                text = got.read().decode()
            if name in text:
                return time.monotonic() - began
        except OSError:
            pass
        time.sleep(0.02)
    raise TimeoutError(f"/metrics not counting the job within {limit_s:g} s")


def answered(daemon: harness.Wardend) -> None:
    """Return once the daemon answers on its socket."""
    while True:
        try:
            daemon.ask("version", timeout=300)
            return
        except (DaemonBusy, DaemonUnreachable, OSError):
            time.sleep(0.02)


def run(root: Path, cache: Path, port: int | None) -> dict[str, Any]:
    """One start of wardend on the root: ``status JOB`` (or, with ``port``, the first
    ``/metrics`` counting the job) timed from the launch, the longest block, and when the
    job's goodput was known."""
    extra = ("--metrics-listen", f"127.0.0.1:{port}") if port is not None else ()
    daemon = PatientDaemon(root, cache, *extra, rescan_interval=None)
    prober = Prober(daemon)
    began = time.monotonic()
    daemon.launch()
    prober.start()
    found: dict[str, Any] = {}
    try:
        if port is not None:
            found["first_metrics_s"] = first_metrics(port, began, 300)
        answered(daemon)
        asked = time.monotonic()
        detail = daemon.ask("status", timeout=300, job="long")
        found["status_job_s"] = time.monotonic() - asked
        while (detail.get("goodput") or {}).get("reading") and time.monotonic() - began < 300:
            time.sleep(0.2)
            detail = daemon.ask("status", timeout=300, job="long")
        found["goodput_known_s"] = time.monotonic() - began
        time.sleep(1.0)
    finally:
        prober.done.set()
        prober.join(310)
        daemon.stop(timeout=60)
    return {**found, "longest_block_s": prober.slowest, "probes": prober.count, **detail}


def measure(base: Path, megabytes: float) -> dict[str, Any]:
    """Run the job, grow its events file, start wardend on it three times."""
    root, cache = base / "root", base / "cache"
    with PatientDaemon(root, cache, rescan_interval=None) as daemon:
        daemon.drop("long.toml", harness.job_text("long", run={"steps": 4}))
        daemon.wait("long", timeout=240)
    events = daemon.attempt_folder("long", 1) / EVENTS_FILE
    exit_record = json.loads((events.parent / "exit.json").read_text())
    launched = float(exit_record["ended"]) - float(exit_record["duration_s"])
    summary = events.parent / "goodput.json"
    summary.unlink(missing_ok=True)
    room = float(exit_record["duration_s"]) - 1.2  # every event within the attempt's life
    every = max(0.0, room) / (megabytes * 1e6 / LINE_BYTES)
    updates = write_events(events, megabytes, launched + 1.0, every)
    size = os.stat(events).st_size
    status_run = run(root, cache, None)
    summary.unlink(missing_ok=True)  # the metrics run reads the whole file again
    metrics_run = run(root, cache, free_port())
    restart_run = run(root, cache, None)  # the summary the last run saved, if any
    keys = ("status_job_s", "first_metrics_s", "longest_block_s", "goodput_known_s", "probes")
    return {
        "megabytes": round(size / 1e6, 1),
        "updates": updates,
        "status": {k: v for k, v in status_run.items() if k in keys},
        "metrics": {k: v for k, v in metrics_run.items() if k in keys},
        "restart": {k: v for k, v in restart_run.items() if k in keys},
        "goodput": restart_run.get("goodput"),
    }


def main() -> None:
    """Measure, print, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=250.0, help="events file size")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jobwarden-bench-") as temp:
        found = measure(Path(temp), args.megabytes)
    name = f"{found['megabytes']:g} MB events file"
    status_run, metrics_run, restart_run = found["status"], found["metrics"], found["restart"]
    longest = max(status_run["longest_block_s"], metrics_run["longest_block_s"])
    figures = [
        at_most(f"{name}: status JOB", status_run["status_job_s"], BLOCK_TARGET_S, ".3f", " s"),
        context(
            f"{name}: first /metrics counting the job, from start",
            metrics_run["first_metrics_s"],
            ".3f",
            " s",
        ),
        at_most(f"{name}: the loop's longest block", longest, BLOCK_TARGET_S, ".3f", " s"),
        context(f"{name}: goodput known, from start", status_run["goodput_known_s"], ".1f", " s"),
        context(
            f"{name}: goodput known after a restart, from start",
            restart_run["goodput_known_s"],
            ".1f",
            " s",
        ),
    ]
    print(f"{found['updates']} updates; the longest block is the slowest version request")
    print(f"{'figure':<66}{'measured':>12}{'target':>12}  result")
    for figure in figures:
        print(f"{figure.name:<66}{figure.measured:>12}{figure.target:>12}  {figure.result}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({**found, "figures": records(figures)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
