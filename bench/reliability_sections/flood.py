"""Section stdout_flood: a command job left at ``sdk = true`` floods its stdout with short
lines that are no events; ``status`` latency during the flood, and what the daemon's log
and the attempt's events file grew by.

The program writes ``megabytes`` of 10-byte lines as fast as a pipe takes them, then
waits ``hold_s`` and exits 1 (no restart), so the whole flood lands in one attempt.  A
client asks ``status`` back to back from the flood's start to its end (and for at least
``min_status_s``); a request unanswered within ``answer_within_s`` counts as unanswered.
With ``stderr_kbps`` the daemon's stderr is a FIFO read at that many KiB a second (a
journald under load): a log written on the loop then holds the loop; unset, stderr is a
file.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from jobwarden.control.client import DaemonBusy, DaemonUnreachable
from jobwarden.protocol import ControlError

from .common import Section, mb, ms, percentile
from .wardend import running, timed_status, wait_settled_or

PROGRAM = """
import sys, time
line = b"noise 123\\n"
block = line * 6554
total = int(float(sys.argv[1]) * 2**20)
out = sys.stdout.buffer
open(sys.argv[2], "w").close()
written = 0
while written < total:
    out.write(block)
    written += len(block)
out.flush()
open(sys.argv[3], "w").close()
time.sleep(float(sys.argv[4]))
sys.exit(1)
"""


def flood_job(job: str, megabytes: float, began: Path, ended: Path, hold_s: float) -> str:
    """A command job (``sdk = true``, the default) whose program floods stdout, then fails."""
    command = [sys.executable, "-c", PROGRAM, str(megabytes), str(began), str(ended), str(hold_s)]
    return "\n".join(
        [
            f'id = "{job}"',
            f"command = {json.dumps(command)}",
            "[supervision]",
            "max_restarts = 0",
            "startup_timeout_s = 600",
            "stall_timeout_s = 600",
            "",
        ]
    )


def stdout_flood(
    folder: Path,
    cache: Path | None = None,
    *,
    megabytes: float = 0.5,
    hold_s: float = 2.0,
    min_status_s: float = 3.0,
    answer_within_s: float = 10.0,
    stderr_kbps: float | None = None,
) -> Section:
    """Flood one attempt's stdout; time ``status`` throughout; measure the log's growth."""
    section = Section(
        "stdout_flood",
        sizes={"megabytes": megabytes, "hold_s": hold_s, "stderr_kbps": stderr_kbps},
    )
    root = folder / "root"
    began, ended = folder / "flood.began", folder / "flood.ended"
    latencies: list[float] = []
    unanswered = 0
    with (
        slow_reader(folder / "stderr.fifo", stderr_kbps) as stderr,
        running(root, cache, stderr=stderr) as daemon,
    ):
        log_before = daemon.root.joinpath("wardend.log").stat().st_size
        for _ in range(20):  # the idle figure, for the ratio
            latencies.append(_timed(daemon.socket, answer_within_s) or answer_within_s)
        idle = latencies[:]
        latencies.clear()
        daemon.drop("flood.toml", flood_job("flood", megabytes, began, ended, hold_s))
        deadline = time.monotonic() + 120
        while not began.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        start = time.monotonic()
        while not ended.exists() or time.monotonic() - start < min_status_s:
            if time.monotonic() > deadline + 300:
                break
            took = _timed(daemon.socket, answer_within_s)
            if took is None:
                unanswered += 1
            else:
                latencies.append(took)
        flood_s = time.monotonic() - start
        final = wait_settled_or(daemon, "flood", 120)
        log_growth = daemon.root.joinpath("wardend.log").stat().st_size - log_before
        events = sum(p.stat().st_size for p in daemon.job_folder("flood").rglob("events*.jsonl"))
    f = section.figures
    f.update(
        flood_bytes=int(megabytes * 2**20),
        flood_s=round(flood_s, 2),
        status_requests=len(latencies) + unanswered,
        unanswered=unanswered,
        status_idle_p50_s=percentile(idle, 50),
        status_p50_s=percentile(latencies, 50),
        status_p99_s=percentile(latencies, 99),
        status_max_s=max(latencies, default=None),
        log_growth_bytes=log_growth,
        events_file_bytes=events,
        final_state=None if final is None else final["state"],
    )
    reading = "a file" if stderr_kbps is None else f"a pipe read at {stderr_kbps:g} KiB/s"
    section.row("the daemon's stderr", reading)
    section.row("stdout flooded", f"{mb(f['flood_bytes'])} of 10-byte lines in {flood_s:.1f} s")
    section.row("status while idle, p50", ms(f["status_idle_p50_s"]))
    section.row("status during the flood, p50", ms(f["status_p50_s"]))
    section.row("status during the flood, p99", ms(f["status_p99_s"]), "<= 100 ms")
    section.row(
        f"status unanswered within {answer_within_s:g} s", f"{unanswered} of {f['status_requests']}"
    )
    section.row("wardend.log grew by", mb(log_growth), "<= 1 MB")
    section.row("events file kept (every line verbatim)", mb(events))
    section.check("status p99 <= 100 ms", (f["status_p99_s"] or 1e9) <= 0.1)
    section.check("no status unanswered", unanswered == 0)
    section.check("log growth <= 1 MB", log_growth <= 2**20)
    section.check("the flood's lines are kept", events >= f["flood_bytes"])
    section.check("the job settled", final is not None and final["state"] == "failed")
    return section


@contextlib.contextmanager
def slow_reader(fifo: Path, kbps: float | None) -> Iterator[Path | None]:
    """A FIFO read at ``kbps`` KiB a second by a thread, as the daemon's stderr (or None,
    for the harness's file, when ``kbps`` is None)."""
    if kbps is None:
        yield None
        return
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            with contextlib.suppress(BlockingIOError):
                os.read(fd, 4096)
            time.sleep(4.0 / kbps)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        yield fifo
    finally:
        done.set()
        thread.join()
        os.close(fd)


def _timed(sock: Path, within: float) -> float | None:
    """Seconds one ``status`` takes, or None when it is not answered within ``within``."""
    try:
        return timed_status(sock, timeout=within)
    except (DaemonBusy, DaemonUnreachable, ControlError, TimeoutError, OSError):
        return None
