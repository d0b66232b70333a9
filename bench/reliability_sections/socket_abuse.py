"""Section 4, socket_abuse: many hostile AF_UNIX clients at once; the daemon's memory and
descriptors before and after, ``status`` latency during."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import threading
import time
from collections import Counter
from pathlib import Path

from jobwarden.control.client import DaemonBusy, DaemonUnreachable
from jobwarden.protocol import ControlError

from .common import Section, mb, ms, percentile
from .wardend import running, status_latencies, timed_status

ABUSE_KINDS = ("idle", "non_reader", "slowloris", "oversized", "nested", "bad_utf8")


STATUS_LINE = b'{"v": 2, "id": 1, "cmd": "status", "args": {}}\n'


NESTED_LINE = b'{"v": 1, "id": 2, "cmd": "status", "args": {"x": ' + b"[" * 200_000


NESTED_LINE += b"]" * 200_000 + b"}}\n"


BAD_UTF8_LINE = b'{"v": 1, "id": "\xff\xfe\xc0", "cmd": "status", "args": {}}\n'


def settled_root(root: Path, count: int) -> None:
    """A root holding ``count`` completed jobs, their folders written directly."""
    from jobwarden.daemon.store.jobs import new_record, state_text
    from jobwarden.daemon.store.layout import Root
    from jobwarden.jobfile import job_from_mapping
    from jobwarden.states import JobState

    layout = Root(root)
    layout.create()
    for index in range(count):
        job = job_from_mapping({"id": f"done-{index:04d}", "task": "linreg"})
        folder = layout.job(job.id)
        folder.mkdir(mode=0o700)
        (folder / "job.json").write_text(json.dumps(job.to_record()))
        record = new_record(job)
        record.state, record.attempt = JobState.COMPLETED, 1
        (folder / "state.json").write_text(state_text(record))


class Attack:
    """Abusive clients on one loop in a thread, each reconnecting until told to stop.


    Raw non-blocking sockets, as wardenctl uses blocking ones: a failed write (the
    daemon answered and hung up first) never hides an answer already received.
    """

    def __init__(self, sock: Path, clients: int, seed: int = 0) -> None:
        self.sock = sock
        self.clients = clients
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.answers: Counter[str] = Counter()
        self.connections: Counter[str] = Counter()
        self.unanswered: Counter[str] = Counter()
        self.connect_errors: Counter[str] = Counter()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()))

    def __enter__(self) -> Attack:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(120)

    async def _main(self) -> None:
        await asyncio.gather(*(self._client(i) for i in range(self.clients)))

    async def _client(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        kind = ABUSE_KINDS[index % len(ABUSE_KINDS)]
        await asyncio.sleep(self.rng.uniform(0, 0.5))
        while not self.stop.is_set():
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.setblocking(False)
            try:
                await asyncio.wait_for(loop.sock_connect(conn, str(self.sock)), 10)
            except (OSError, TimeoutError) as error:
                conn.close()
                self.connect_errors[type(error).__name__] += 1
                await asyncio.sleep(self.rng.uniform(0.2, 0.5))
                continue
            self.connections[kind] += 1
            try:
                code = await self._behave(kind, conn)
            except (OSError, TimeoutError):
                code = "connection reset"
            finally:
                conn.close()
            if code is None:
                self.unanswered[kind] += 1
            else:
                self.answers[f"{kind}: {code}"] += 1
            await asyncio.sleep(self.rng.uniform(0.2, 0.5))

    async def _answer(self, conn: socket.socket) -> str | None:
        loop = asyncio.get_running_loop()
        data = b""
        deadline = time.monotonic() + 60
        while not data.endswith(b"\n"):
            chunk = await asyncio.wait_for(
                loop.sock_recv(conn, 1 << 16), max(0.01, deadline - time.monotonic())
            )
            if not chunk:
                break
            data += chunk
        if not data:
            return None
        try:
            reply = json.loads(data.split(b"\n")[0])
        except ValueError:
            return "answer not JSON"
        if reply.get("ok"):
            return "ok"
        return str((reply.get("error") or {}).get("code"))

    async def _behave(self, kind: str, conn: socket.socket) -> str | None:
        loop = asyncio.get_running_loop()
        if kind == "idle":
            return await self._answer(conn)
        if kind == "non_reader":
            with contextlib.suppress(OSError):
                await asyncio.wait_for(loop.sock_sendall(conn, STATUS_LINE * 20), 5)
            for _ in range(50):
                if self.stop.is_set():
                    break
                await asyncio.sleep(0.1)
            return "never read"
        if kind == "slowloris":
            payload, pace = b'{"v": 2, "id": 3, "cmd": "status", "args": {}' * 50, 0.25
        elif kind == "oversized":
            payload, pace = b"a" * (2 << 20), 0.0
        else:
            payload, pace = (NESTED_LINE if kind == "nested" else BAD_UTF8_LINE), 0.0

        async def send() -> None:
            step = 1 if pace else 65536
            for at in range(0, len(payload), step):
                await loop.sock_sendall(conn, payload[at : at + step])
                if pace:
                    await asyncio.sleep(pace)

        # The answer is awaited while the line is still being written: the daemon may
        # answer (busy, too large, timeout) and hang up before the client is done.
        sender = asyncio.create_task(send())
        try:
            return await self._answer(conn)
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await sender


def socket_abuse(
    base: Path,
    cache: Path,
    *,
    clients: int = 1000,
    attack_s: float = 15.0,
    jobs: int = 300,
    p99_bound_s: float = 0.050,
    rss_growth_bound: int = 20 << 20,
) -> Section:
    """Many abusive clients at once; rss and fds before and after, ``status`` during."""
    section = Section("socket_abuse")
    section.sizes = {"clients": clients, "attack": f"{attack_s:g} s", "jobs known": jobs}
    root = base / "root"
    settled_root(root, jobs)
    samples: list[tuple[int, int]] = []
    during: list[float] = []
    during_job: list[float] = []
    failed: list[str] = []
    with running(root, cache) as daemon:
        process = daemon.process()
        before = status_latencies(daemon.socket, 100)
        rss_before, fds_before = process.memory_info().rss, process.num_fds()
        with Attack(daemon.socket, clients) as attack:
            end = time.monotonic() + attack_s
            while time.monotonic() < end:
                samples.append((process.memory_info().rss, process.num_fds()))
                try:
                    during.append(timed_status(daemon.socket))
                    during_job.append(timed_status(daemon.socket, "done-0000"))
                except (DaemonBusy, DaemonUnreachable, ControlError) as error:
                    failed.append(repr(error)[:200])
                time.sleep(0.02)
        deadline = time.monotonic() + 60
        while process.num_fds() > fds_before + 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
        rss_after, fds_after = process.memory_info().rss, process.num_fds()
        after = status_latencies(daemon.socket, 100)
        alive = daemon.alive() and daemon.ask("version")["pid"] == daemon.pid
    peak_rss = max((r for r, _ in samples), default=rss_before)
    peak_fds = max((n for _, n in samples), default=fds_before)
    f = section.figures
    f.update(
        {
            "connections": dict(attack.connections),
            "answers": dict(attack.answers),
            "hung_up_without_answer": dict(attack.unanswered),
            "connect_errors": dict(attack.connect_errors),
            "status_before_p50_s": percentile(before, 50),
            "status_before_p99_s": percentile(before, 99),
            "status_during_n": len(during),
            "status_during_p50_s": percentile(during, 50),
            "status_during_p99_s": percentile(during, 99),
            "status_during_max_s": max(during, default=None),
            "status_job_during_p99_s": percentile(during_job, 99),
            "status_failed_during": failed,
            "status_after_p99_s": percentile(after, 99),
            "rss_before": rss_before,
            "rss_peak": peak_rss,
            "rss_after": rss_after,
            "fds_before": fds_before,
            "fds_peak": peak_fds,
            "fds_after": fds_after,
            "daemon_alive": alive,
        }
    )
    hostile = {k: v for k, v in attack.answers.items() if k.split(":")[0] in ABUSE_KINDS[3:]}
    section.row("connections made", sum(attack.connections.values()))
    section.row(
        "  answers",
        ", ".join(f"{k} {v}" for k, v in sorted(attack.answers.items())),
    )
    section.row(
        "  hung up without an answer",
        ", ".join(f"{k} {v}" for k, v in sorted(attack.unanswered.items())) or "0",
    )
    section.row(
        "status p50 / p99 / max during the attack",
        f"{ms(f['status_during_p50_s'])} / {ms(f['status_during_p99_s'])} / "
        f"{ms(f['status_during_max_s'])} (n {len(during)}, {len(failed)} failed)",
        f"p99 <= {ms(p99_bound_s)}",
    )
    section.row("status JOB p99 during", ms(f["status_job_during_p99_s"]))
    section.row(
        "status p99 before / after",
        f"{ms(f['status_before_p99_s'])} / {ms(f['status_after_p99_s'])}",
    )
    section.row(
        "daemon rss before / peak / after",
        f"{mb(rss_before)} / {mb(peak_rss)} / {mb(rss_after)}",
        f"after - before <= {mb(rss_growth_bound)}",
    )
    section.row("daemon fds before / peak / after", f"{fds_before} / {peak_fds} / {fds_after}")
    section.check("daemon alive", alive)
    section.check("status answered throughout", not failed and bool(during))
    section.check("status p99 during attack", (f["status_during_p99_s"] or 1e9) <= p99_bound_s)
    section.check("memory released", rss_after - rss_before <= rss_growth_bound)
    section.check("descriptors released", fds_after <= fds_before + 2)
    section.check(
        "every hostile line answered",
        bool(hostile)
        and not any(attack.unanswered[k] for k in ABUSE_KINDS[3:])
        and not any(k.endswith(("ok", "answer not JSON", "connection reset")) for k in hostile),
    )
    return section
