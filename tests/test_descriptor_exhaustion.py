"""Running out of descriptors, through a real daemon whose RLIMIT_NOFILE is lowered: slow
clients of ``--metrics-listen`` cannot bring it there, and a request met by EMFILE is kept
and taken in later, never rejected or dropped."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobwarden.control.client import DaemonBusy
from tests.daemon import Daemon, linreg_job
from tests.helpers import wait_until
from tests.test_exporter import listening

HEADROOM = 40
"""Descriptors the daemon may open beyond those it holds once started."""


def open_fds(pid: int) -> int:
    """How many descriptors ``pid`` holds."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def limit_fds(pid: int, limit: int) -> None:
    """Set ``pid``'s soft and hard RLIMIT_NOFILE (the hard one only ever lowered)."""
    _, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, min(hard, max(limit, 4096))))


@contextlib.contextmanager
def slowloris(port: int, clients: int, pace_s: float = 0.5) -> Iterator[list[socket.socket]]:
    """``clients`` connections to ``port``, each sending a header line every ``pace_s`` s and
    never ending its request; closed on the way out."""
    conns: list[socket.socket] = []
    stop = threading.Event()

    def drip() -> None:
        tried, dripped = 0, time.monotonic()
        while not stop.is_set():
            if tried < clients:
                tried += 1
                conn = socket.socket()
                conn.settimeout(0.2)
                try:
                    conn.connect(("127.0.0.1", port))
                    conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                except OSError:
                    conn.close()
                else:
                    conns.append(conn)
            else:
                stop.wait(0.05)
            if time.monotonic() - dripped >= pace_s:
                dripped = time.monotonic()
                for conn in list(conns):
                    with contextlib.suppress(OSError):
                        conn.send(b"X-Slow: 1\r\n")

    thread = threading.Thread(target=drip)
    thread.start()
    try:
        yield conns
    finally:
        stop.set()
        thread.join(30)
        for conn in conns:
            conn.close()


def exchange(conn: socket.socket, cmd: str, **args: Any) -> dict[str, Any]:
    """One request line on an open control connection, and its answer."""
    line = {"v": 1, "id": 1, "cmd": cmd, "args": args}
    conn.sendall(json.dumps(line).encode() + b"\n")
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(1 << 16)
        assert chunk, f"the daemon hung up without answering {cmd}"
        data += chunk
    answer: dict[str, Any] = json.loads(data)
    return answer


def test_slow_metrics_clients_leave_descriptors_for_requests(
    tmp_path: Path, compile_cache: Path
) -> None:
    """200 slowloris clients of /metrics with 40 spare descriptors: fds stay below the limit,
    and a spool drop and a socket submit made during the attack are both taken in."""
    root = tmp_path / "root"
    with Daemon(root, compile_cache, "--metrics-listen", ":0") as daemon:
        port = wait_until(lambda: listening(root), timeout=10, what="metrics.listening")["port"]
        limit = open_fds(daemon.pid) + HEADROOM
        limit_fds(daemon.pid, limit)
        with slowloris(port, 200) as conns:
            wait_until(lambda: len(conns), lambda n: n >= 30, timeout=20, what="30 connected")
            time.sleep(2)
            peak = open_fds(daemon.pid)
            daemon.drop("dropped.toml", linreg_job("dropped", run={"steps": 2}))
            try:
                answer = daemon.ask(
                    "submit", timeout=10, name="sent.toml", content=linreg_job("sent")
                )
            except DaemonBusy as error:
                answer = {"unanswered": str(error)}
            taken = None
            deadline = time.monotonic() + 15
            while taken is None and time.monotonic() < deadline:
                with contextlib.suppress(DaemonBusy):
                    taken = daemon.status("dropped")
            fds_during = open_fds(daemon.pid)
        seen = f"peak {peak} of {limit} fds, submit {answer}, dropped job {taken}"
        assert peak < limit - 8, seen
        assert answer.get("accepted") is True, seen
        assert taken is not None, seen
        assert fds_during < limit - 8, seen
