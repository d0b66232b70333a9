"""The dashboard's jobs page with 1,000 jobs known: server-side render time.

Starts a real wardend on a temporary root with ``--max-concurrent 1``; the first job
stalls (holding the only slot) and the rest stay queued.  With 1,000 jobs known it
times, each over repeated runs:

* the ``status`` request the dashboard's shared poller makes (``rows: true``) and its
  conversion into the page's rows;
* the jobs page's template rendered from that table (the server-side render);
* a whole ``GET /`` through the dashboard's HTTP server, cookie included, as a
  browser asks it (the table taken from the shared poll);
* one ``/live.json`` answer, what each open page asks once a second.

Prints a table and writes ``bench/results/dashboard.json``.

    make bench            or    .venv/bin/python bench/dashboard.py [--samples N]
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from figures import at_most, context, records

from jobwarden.control import harness
from jobwarden.dashboard.server import STATES, Dashboard, live_message
from jobwarden.dashboard.source import Source

TARGET_MS = 200.0


def job_text(job_id: str, stall: bool) -> str:
    """A linreg job; the first one stalls for ten minutes."""
    if not stall:
        return harness.job_text(job_id)
    return harness.job_text(
        job_id,
        faults={"stall_at": 0, "stall_seconds": 600},
        supervision={"stall_timeout_s": 600, "startup_timeout_s": 600, "stop_grace_s": 1},
    )


def timed(samples: int, call: Callable[[], object]) -> list[float]:
    """``samples`` sequential calls, each timed, in milliseconds."""
    times = []
    for _ in range(samples):
        began = time.perf_counter()
        call()
        times.append((time.perf_counter() - began) * 1000)
    return times


def get(server: Dashboard, path: str) -> int:
    """One GET with the dashboard's cookie; the bytes of the answer."""
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(str(host), int(port), timeout=30)
    try:
        conn.request("GET", path, headers={"Cookie": f"{server.cookie}={server.token}"})
        answer = conn.getresponse()
        body = answer.read()
        assert answer.status == 200, (answer.status, body[:200])
        return len(body)
    finally:
        conn.close()


def main() -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "dashboard.json"
    )
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="jobwarden-bench-dashboard-"))
    daemon = harness.Wardend(base / "root", None, "--max-concurrent", "1", rescan_interval=None)
    rows: list[dict[str, Any]] = []
    try:
        daemon.start(timeout=30)
        for index in range(args.jobs):
            daemon.drop(f"job{index:04d}.toml", job_text(f"job{index:04d}", index == 0))
        while daemon.ask("status")["totals"]["jobs"] < args.jobs:
            time.sleep(0.1)
        source = Source(daemon.socket)
        server = Dashboard(("127.0.0.1", 0), source)
        serving = threading.Thread(target=server.serve, daemon=True)
        serving.start()
        table = source.table()
        assert len(table.rows) == args.jobs

        def render() -> str:
            return server.pages.render(
                "jobs.html", rows=table.rows, health=table.health, states=STATES, chosen=""
            )

        size = len(render().encode())
        get(server, "/")  # the poller's first table
        measured = [
            ("status rows: true, as view rows", None, timed(args.samples, source.table)),
            ("jobs page template render", size, timed(args.samples, render)),
            (
                "GET / through the server",
                get(server, "/"),
                timed(args.samples, lambda: get(server, "/")),
            ),
            (
                "GET /live.json",
                len(live_message(table, "")),
                timed(args.samples, lambda: get(server, "/live.json")),
            ),
        ]
        server.shutdown()
        serving.join()
        server.server_close()
    finally:
        daemon.stop(timeout=60)
        shutil.rmtree(base, ignore_errors=True)
    print(f"dashboard jobs page, {args.jobs} jobs known, {args.samples} runs each (medians)")
    print(f"{'what':<36}{'bytes':>10}{'median ms':>12}{'max ms':>10}")
    for name, size_b, times in measured:
        median = statistics.median(times)
        rows.append(
            {
                "what": name,
                "bytes": size_b,
                "median_ms": round(median, 3),
                "max_ms": round(max(times), 3),
                "samples": len(times),
            }
        )
        shown = "-" if size_b is None else str(size_b)
        print(f"{name:<36}{shown:>10}{median:>12.2f}{max(times):>10.2f}")
    by = {row["what"]: row for row in rows}
    figures = [
        at_most(
            f"jobs page of {args.jobs} jobs, server-side render, median",
            by["jobs page template render"]["median_ms"],
            TARGET_MS,
            ".1f",
            " ms",
        ),
        context(
            f"GET / of {args.jobs} jobs through the server, median",
            by["GET / through the server"]["median_ms"],
            ".1f",
            " ms",
        ),
    ]
    for figure in figures:
        print(f"{figure.name}: {figure.measured} (target {figure.target}) {figure.result}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"jobs": args.jobs, "rows": rows, "figures": records(figures)}
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
