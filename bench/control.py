"""Control-socket latency: ``status`` round trips with 100 and then 1,000 jobs known.

Starts a real wardend on a temporary root with ``--max-concurrent 1``; the
first job stalls (holding the only slot, so nothing else runs), and the rest
are submitted and stay queued.  With 100 jobs known, then again with 1,000,
it times from a fresh connection each, as wardenctl does:

* ``status`` through the client library (the table as columns, the answer
  wardenctl reads), and the same with the rows built from it;
* ``status`` with ``rows: true``: the old answer shape, one object per job
  with every field, measured in the same run for comparison;
* ``status JOB``, which must not grow with the table;
* the ``wardenctl status`` command (and ``--json``) as a user runs it, beside
  ``wardenctl version`` (the same process start-up, a tiny answer);

and a bare Unix-socket echo round trip as the floor.  Prints a table and
writes ``bench/results/control.json``.

    make bench            or    .venv/bin/python bench/control.py [--samples N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from figures import Figure, at_most, context, records

from jobwarden.control import client, harness

TARGET_P99_MS = 5.0
CLI = "jobwarden.control.cli"


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def job_text(job_id: str, stall: bool) -> str:
    """A linreg job; the first one stalls for ten minutes."""
    if not stall:
        return harness.job_text(job_id)
    return harness.job_text(
        job_id,
        faults={"stall_at": 0, "stall_seconds": 600},
        supervision={"stall_timeout_s": 600, "startup_timeout_s": 600, "stop_grace_s": 1},
    )


def echo_round_trips(samples: int) -> list[float]:
    """A bare Unix-socket request/response (connect, send, receive) as the floor."""
    folder = Path(tempfile.mkdtemp())
    path = folder / "echo.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(64)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                data = conn.recv(65536)
                conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    times = []
    for _ in range(samples):
        began = time.perf_counter()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(str(path))
            conn.sendall(b'{"v": 2, "id": 1, "cmd": "status"}\n')
            conn.recv(65536)
        times.append(time.perf_counter() - began)
    server.close()
    shutil.rmtree(folder)
    return times


def submit(daemon: harness.Wardend, first: int, last: int) -> None:
    """Drop jobs ``first`` to ``last - 1`` into the spool (job000 stalls)."""
    for index in range(first, last):
        daemon.drop(f"job{index:04d}.toml", job_text(f"job{index:04d}", index == 0))


def timed(samples: int, call: Callable[[], object]) -> list[float]:
    """``samples`` sequential calls, each timed."""
    times = []
    for _ in range(samples):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return times


def answer_bytes(sock: Path, args: dict[str, Any]) -> int:
    """The size of one status answer line, as sent."""
    line = json.dumps({"v": 2, "id": 1, "cmd": "status", "args": args}).encode() + b"\n"
    data = b""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(sock))
        conn.sendall(line)
        while not data.endswith(b"\n"):
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            data += chunk
    return len(data)


def measure(sock: Path, jobs: int, samples: int, cli_samples: int) -> dict[str, dict[str, Any]]:
    """Every timed request with ``jobs`` known; name -> {samples, bytes, times}."""
    wardenctl = Path(sys.executable).parent / "wardenctl"
    command = [str(wardenctl)] if wardenctl.exists() else [sys.executable, "-m", CLI]
    command += ["--socket", str(sock)]

    def run(*args: str) -> Callable[[], object]:
        return lambda: subprocess.run(
            [*command, *args], capture_output=True, check=False, timeout=60
        )

    for _ in range(20):
        client.request(sock, "status")
    plan: list[tuple[str, dict[str, Any] | None, int, Callable[[], object]]] = [
        ("status", {}, samples, lambda: client.request(sock, "status")),
        ("status, rows built", {}, samples, lambda: client.request(sock, "status")["jobs"]),
        (
            "status rows=true (old shape)",
            {"rows": True},
            samples,
            lambda: client.request(sock, "status", rows=True),
        ),
        (
            "status JOB",
            None,
            samples,
            lambda: client.request(sock, "status", job=f"job{jobs // 2:04d}"),
        ),
        ("wardenctl status", {}, cli_samples, run("status")),
        ("wardenctl status --json", {}, cli_samples, run("status", "--json")),
        ("wardenctl version", None, cli_samples, run("version")),
    ]
    found = {}
    for name, args, n, call in plan:
        size = answer_bytes(sock, args) if args is not None else None
        found[name] = {"jobs": jobs, "bytes": size, "times": timed(n, call)}
    return found


def row(found: dict[str, Any]) -> dict[str, Any]:
    """Percentiles of one measurement, in milliseconds."""
    times = found["times"]
    return {
        "jobs": found["jobs"],
        "bytes": found["bytes"],
        "samples": len(times),
        "p50_ms": percentile(times, 50) * 1000,
        "p99_ms": percentile(times, 99) * 1000,
        "median_ms": statistics.median(times) * 1000,
    }


def target(name: str, found: dict[str, Any]) -> str:
    """The target a row answers to, and whether it held."""
    if name == "status" and found["jobs"] >= 1000:
        return f"p99 <= {TARGET_P99_MS:g} ms " + (
            "PASS" if found["p99_ms"] <= TARGET_P99_MS else "MISS"
        )
    return ""


def figures(rows: list[tuple[str, dict[str, Any]]]) -> list[Figure]:
    """The summary's rows: the table's p99 at its largest size, and a job's own status."""
    largest = max(found["jobs"] for _, found in rows)
    by = {(name, found["jobs"]): found for name, found in rows}
    out = []
    if ("status", largest) in by:
        p99 = by["status", largest]["p99_ms"]
        name = f"status, {largest} jobs known, p99"
        if largest >= 1000:  # the target's size
            out.append(at_most(name, p99, TARGET_P99_MS, ".2f", " ms"))
        else:
            out.append(context(name, p99, ".2f", " ms"))
    if ("status JOB", largest) in by:
        p99 = by["status JOB", largest]["p99_ms"]
        out.append(context(f"status JOB, {largest} jobs known, p99", p99, ".2f", " ms"))
    if ("wardenctl status", largest) in by:
        p50 = by["wardenctl status", largest]["p50_ms"]
        out.append(context(f"wardenctl status, {largest} jobs known, p50", p50, ".0f", " ms"))
    return out


def main() -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--cli-samples", type=int, default=40)
    parser.add_argument("--jobs", type=int, nargs="+", default=[100, 1000])
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "control.json"
    )
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="jobwarden-bench-control-"))
    daemon = harness.Wardend(base / "root", None, "--max-concurrent", "1", rescan_interval=None)
    sock = daemon.socket
    rows: list[tuple[str, dict[str, Any]]] = []
    try:
        daemon.start(timeout=30)
        known = 0
        for jobs in sorted(args.jobs):
            submit(daemon, known, jobs)
            known = jobs
            while daemon.ask("status")["totals"]["jobs"] < jobs:
                time.sleep(0.05)
            daemon.wait("job0000", states=("running",))
            for name, found in measure(sock, jobs, args.samples, args.cli_samples).items():
                rows.append((name, row(found)))
        echo = echo_round_trips(args.samples)
        rows.append(("bare Unix-socket round trip", row({"jobs": 0, "bytes": None, "times": echo})))
    finally:
        daemon.stop(timeout=60)
        shutil.rmtree(base, ignore_errors=True)
    print(
        f"control socket round trips, {args.samples} samples each ({args.cli_samples} for "
        "wardenctl), a fresh connection per request, the stalled job running"
    )
    print(f"{'request':<30}{'jobs':>6}{'answer B':>10}{'p50 ms':>10}{'p99 ms':>10}  target")
    for name, found in rows:
        size = "-" if found["bytes"] is None else str(found["bytes"])
        print(
            f"{name:<30}{found['jobs']:>6}{size:>10}{found['p50_ms']:>10.3f}"
            f"{found['p99_ms']:>10.3f}  {target(name, found)}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "jobs": args.jobs,
        "rows": [{"request": name, **found} for name, found in rows],
        "figures": records(figures(rows)),
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
