"""Section metrics_slowloris: slow idle clients hold ``--metrics-listen`` while the daemon's
descriptors are limited as systemd's default soft limit (1,024) limits them; ``status``
latency, the daemon's descriptors, and whether requests made meanwhile are answered."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from jobwarden.control import client
from jobwarden.control.client import DaemonBusy, DaemonUnreachable
from jobwarden.control.harness import job_text
from jobwarden.protocol import ControlError

from .common import Section, ms, percentile
from .wardend import Wardend, running, timed_status, wait_settled_or

HEAD = b"GET /metrics HTTP/1.1\r\nHost: wardend\r\n"
STATUS_TIMEOUT_S = 5.0
"""A ``status`` not answered in this long counts as this long (and as failed)."""


class Slowloris:
    """``clients`` connections to the metrics port, each dripping a header line every
    ``pace_s`` and never ending its request; each reconnects when the daemon closes it."""

    def __init__(self, port: int, clients: int, pace_s: float = 1.0) -> None:
        self.port = port
        self.clients = clients
        self.pace_s = pace_s
        self.open = 0
        self.outcomes: Counter[str] = Counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()))

    def __enter__(self) -> Slowloris:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)

    async def _main(self) -> None:
        await asyncio.gather(*(self._client(i) for i in range(self.clients)))

    async def _client(self, index: int) -> None:
        await asyncio.sleep(index * 0.002)  # a ramp of about 2 s per thousand
        while not self.stop.is_set():
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", self.port), 2
                )
            except (OSError, TimeoutError) as error:
                self.outcomes[f"connect {type(error).__name__}"] += 1
                await asyncio.sleep(0.5)
                continue
            self.open += 1
            try:
                self.outcomes[await self._drip(reader, writer)] += 1
            finally:
                self.open -= 1
                writer.transport.abort()
            await asyncio.sleep(0.2)

    async def _drip(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
        """How the connection ended: refused (503), cut off (closed unanswered), held."""
        writer.write(HEAD)
        while not self.stop.is_set():
            try:
                got = await asyncio.wait_for(reader.read(64), self.pace_s)
            except TimeoutError:
                got = None
            except OSError:
                return "cut off"
            if got is not None:
                return "refused 503" if got.startswith(b"HTTP/1.1 503") else "cut off"
            try:
                writer.write(b"X-Drip: 1\r\n")
                await writer.drain()
            except OSError:
                return "cut off"
        return "held to the end"


def listening_port(root: Path, timeout: float = 30) -> int:
    """The port of the daemon's ``metrics.listening`` log record."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = root / "wardend.log"
        for line in log.read_text().splitlines() if log.exists() else []:
            record = json.loads(line)
            if record.get("event") == "metrics.listening":
                return int(record["port"])
        time.sleep(0.05)
    raise TimeoutError("no metrics.listening record")


def logged(root: Path, event: str) -> list[dict[str, Any]]:
    """The daemon's log records of ``event``."""
    lines = (root / "wardend.log").read_text().splitlines()
    return [record for line in lines if (record := json.loads(line)).get("event") == event]


def censored_status(sock: Path, failed: list[str]) -> float:
    """One ``status``'s seconds; one not answered in `STATUS_TIMEOUT_S` counts that long."""
    try:
        return timed_status(sock, timeout=STATUS_TIMEOUT_S)
    except (DaemonBusy, DaemonUnreachable, ControlError) as error:
        failed.append(repr(error)[:200])
        return STATUS_TIMEOUT_S


def submit_during(daemon: Wardend, answer: dict[str, Any]) -> None:
    """A socket ``submit`` of job ``sent``; its answer, or what kept it from one, and time."""
    began = time.monotonic()
    try:
        answer["reply"] = client.request(
            daemon.socket,
            "submit",
            timeout=30,
            name="sent.toml",
            content=job_text("sent", run={"steps": 4}),
        )
    except (DaemonBusy, DaemonUnreachable, ControlError) as error:
        answer["error"] = repr(error)[:200]
    answer["at"] = time.monotonic()
    answer["seconds"] = answer["at"] - began


def metrics_slowloris(
    folder: Path,
    cache: Path,
    *,
    clients: int = 1100,
    attack_s: float = 15.0,
    fd_limit: int = 1024,
    p99_bound_s: float = 0.050,
) -> Section:
    """``clients`` slowloris connections to /metrics against a daemon limited to ``fd_limit``
    descriptors: status p50/p99 and fds during, a drop and a submit made during answered."""
    section = Section("metrics_slowloris")
    section.sizes = {"clients": clients, "attack": f"{attack_s:g} s", "fd limit": fd_limit}
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, clients + 1024)), hard))
    root = folder / "root"
    during: list[float] = []
    while_jobs: list[float] = []
    """Latencies once the jobs are in: their workers' start (JAX) shares the machine."""
    failed: list[str] = []
    fds: list[int] = []
    submitted: dict[str, Any] = {}
    listen = ("--metrics-listen", "127.0.0.1:0", "--no-warm-spare")  # a spare holds its pipes
    with running(root, cache, *listen) as daemon:
        port = listening_port(root)
        process = daemon.process()
        resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE, (fd_limit, fd_limit))
        before = [censored_status(daemon.socket, []) for _ in range(50)]
        fds_before = process.num_fds()
        with Slowloris(port, clients) as attack:
            began = time.monotonic()
            sender = threading.Thread(target=submit_during, args=(daemon, submitted))
            dropped_at = None
            taken_during = False
            while time.monotonic() - began < attack_s:
                fds.append(process.num_fds())
                latency = censored_status(daemon.socket, failed)
                (during if dropped_at is None else while_jobs).append(latency)
                if dropped_at is None and time.monotonic() - began > attack_s * 2 / 3:
                    dropped_at = time.monotonic()
                    daemon.drop("dropped.toml", job_text("dropped", run={"steps": 4}))
                    sender.start()
                if dropped_at is not None and not taken_during:
                    with contextlib.suppress(DaemonBusy, DaemonUnreachable, ControlError):
                        taken_during = daemon.status("dropped") is not None
                time.sleep(0.02)
            held_at_end, attack_end = attack.open, time.monotonic()
        sender.join(60)
        dropped = wait_settled_or(daemon, "dropped", 300)
        sent = wait_settled_or(daemon, "sent", 300) if "reply" in submitted else None
        deadline = time.monotonic() + 30
        while process.num_fds() > fds_before + 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        fds_after = process.num_fds()
        refused_logged = sum(r.get("refused", 0) for r in logged(root, "metrics.serving"))
        short_logged = len(logged(root, "spool.short_of_resources"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    peak = max(fds, default=fds_before)
    f = section.figures
    f.update(
        {
            "attack_outcomes": dict(attack.outcomes),
            "connections_open_at_end": held_at_end,
            "status_before_p99_s": percentile(before, 99),
            "status_during_n": len(during),
            "status_during_p50_s": percentile(during, 50),
            "status_during_p99_s": percentile(during, 99),
            "status_during_max_s": max(during, default=None),
            "status_with_jobs_p99_s": percentile(while_jobs, 99),
            "status_failed_during": len(failed),
            "status_failures": failed[:5],
            "fds_before": fds_before,
            "fds_peak": peak,
            "fds_after": fds_after,
            "fd_limit": fd_limit,
            "submit": submitted,
            "dropped_taken_during_attack": taken_during,
            "dropped_final": None if dropped is None else dropped["state"],
            "sent_final": None if sent is None else sent["state"],
            "refused_by_client": attack.outcomes["refused 503"],
            "refused_logged": refused_logged,
            "spool_short_of_resources_logged": short_logged,
        }
    )
    answered = "reply" in submitted and submitted["at"] <= attack_end
    section.row(
        "slowloris connections: outcomes",
        ", ".join(f"{k} {v}" for k, v in sorted(attack.outcomes.items())) or "-",
    )
    section.row(
        "status p50 / p99 / max during the attack, before the jobs",
        f"{ms(f['status_during_p50_s'])} / {ms(f['status_during_p99_s'])} / "
        f"{ms(f['status_during_max_s'])} (n {len(during)}, {len(failed)} not answered "
        f"in {STATUS_TIMEOUT_S:g} s)",
        f"p99 <= {ms(p99_bound_s)}",
    )
    section.row(
        "status p99 before / once two jobs start",
        f"{ms(f['status_before_p99_s'])} / {ms(f['status_with_jobs_p99_s'])}",
    )
    section.row(
        "daemon fds before / peak / after", f"{fds_before} / {peak} / {fds_after}", f"< {fd_limit}"
    )
    section.row(
        "submit during the attack",
        f"{submitted.get('reply') or submitted.get('error')}"
        f" in {submitted.get('seconds', 0):.2f} s",
    )
    section.row("dropped job taken in during the attack", taken_during)
    section.row("jobs dropped / submitted end", f"{f['dropped_final']} / {f['sent_final']}")
    section.row(
        "listener refusals (client's 503s / logged)", f"{f['refused_by_client']} / {refused_logged}"
    )
    section.check("status p99 during attack", (f["status_during_p99_s"] or 1e9) <= p99_bound_s)
    section.check("status answered throughout", not failed and bool(during))
    section.check("fds below cap", peak < fd_limit - 16)
    section.check("descriptors released", fds_after <= fds_before + 2)
    section.check("submit answered during attack", answered)
    section.check("dropped job taken in during attack", taken_during)
    section.check(
        "no request lost", f["dropped_final"] == "completed" and f["sent_final"] == "completed"
    )
    return section
