"""Control-socket latency: ``status`` round trips with 100 jobs known to the daemon.

Starts a real wardend on a temporary root with ``--max-concurrent 1``; the
first job stalls (holding the only slot, so nothing else runs), and 99 more
are submitted and stay queued.  Then it times ``status`` (every job's row)
and ``status JOB`` round trips from a fresh connection each, as wardenctl
does, beside a bare Unix-socket echo round trip measured in the same run.
Prints a table and writes ``bench/results/control.json``.

    make bench            or    .venv/bin/python bench/control.py [--samples N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from jobwarden.control import client

TARGET_P99_MS = 5.0


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def job_text(job_id: str, stall: bool) -> str:
    """A linreg job; the first one stalls for ten minutes."""
    text = f'id = "{job_id}"\ntask = "linreg"\n'
    if stall:
        text += (
            "[faults]\nstall_at = 0\nstall_seconds = 600\n[supervision]\n"
            "stall_timeout_s = 600\nstartup_timeout_s = 600\nstop_grace_s = 1\n"
        )
    return text


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
            conn.sendall(b'{"v": 1, "id": 1, "cmd": "status"}\n')
            conn.recv(65536)
        times.append(time.perf_counter() - began)
    server.close()
    shutil.rmtree(folder)
    return times


def main() -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "control.json"
    )
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="jobwarden-bench-control-"))
    root = base / "root"
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobwarden.daemon", "--root", str(root), "--max-concurrent", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    sock = root / "control.sock"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client.request(sock, "version")
                break
            except client.DaemonUnreachable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        for index in range(args.jobs):
            name = f"job{index:03d}.toml"
            (root / "spool" / "tmp" / name).write_text(job_text(f"job{index:03d}", index == 0))
            os.rename(root / "spool" / "tmp" / name, root / "spool" / "incoming" / name)
        while len(client.request(sock, "status")["jobs"]) < args.jobs:
            time.sleep(0.05)
        while client.request(sock, "status", job="job000")["state"] != "running":
            time.sleep(0.05)
        for _ in range(50):
            client.request(sock, "status")
        results = {}
        for name, request in (("status (100 jobs)", {}), ("status JOB", {"job": "job050"})):
            times = []
            for _ in range(args.samples):
                began = time.perf_counter()
                client.request(sock, "status", **request)
                times.append(time.perf_counter() - began)
            results[name] = times
        results["bare Unix-socket round trip"] = echo_round_trips(args.samples)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        shutil.rmtree(base, ignore_errors=True)
    rows = {
        name: {
            "samples": len(times),
            "p50_ms": percentile(times, 50) * 1000,
            "p99_ms": percentile(times, 99) * 1000,
            "median_ms": statistics.median(times) * 1000,
        }
        for name, times in results.items()
    }
    print(
        f"control socket round trips, {args.jobs} jobs known to the daemon, "
        f"{args.samples} samples each, a fresh connection per request"
    )
    print(f"{'request':<30}{'p50 ms':>10}{'p99 ms':>10}  target")
    for name, row in rows.items():
        target = ""
        if name.startswith("status"):
            verdict = "PASS" if row["p99_ms"] <= TARGET_P99_MS else "MISS"
            target = f"p99 <= {TARGET_P99_MS:g} ms {verdict}"
        print(f"{name:<30}{row['p50_ms']:>10.3f}{row['p99_ms']:>10.3f}  {target}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"jobs": args.jobs, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
