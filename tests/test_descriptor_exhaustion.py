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
from jobwarden.protocol import ControlError
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


def submit(daemon: Daemon, job_id: str, timeout: float = 10) -> dict[str, Any]:
    """A socket submit through the control client, which sends it again while the daemon
    answers busy (a drop that kept nothing, while the dropped job's worker launch holds the
    last descriptors of this test's low limit); its answer, or what it was refused with."""
    try:
        content = linreg_job(job_id)
        answer: dict[str, Any] = daemon.ask(
            "submit", timeout=timeout, name=f"{job_id}.toml", content=content
        )
    except DaemonBusy as error:
        return {"unanswered": str(error)}
    except ControlError as error:
        return {"refused": f"{error.code}: {error}"}
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
            answer = submit(daemon, "sent")
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


def lowest_free_fd(pid: int) -> int:
    """The descriptor number ``pid``'s next open would get."""
    held = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
    return next(fd for fd in range(len(held) + 1) if fd not in held)


def log_events(root: Path, name: str) -> list[dict[str, Any]]:
    """The daemon's log records of event ``name``."""
    lines = (root / "wardend.log").read_text().splitlines()
    return [record for line in lines if (record := json.loads(line)).get("event") == name]


def test_requests_met_by_emfile_are_answered_or_kept_never_lost(
    tmp_path: Path, compile_cache: Path
) -> None:
    """Out of descriptors: a socket submit is answered control.busy (nothing kept, so a
    client sends it again), a dropped file stays in the spool unrejected, logged once; both
    taken once fds return."""
    root = tmp_path / "root"
    with Daemon(root, compile_cache) as daemon:
        soft, _ = resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE)
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(10)
            conn.connect(str(daemon.socket))
            assert exchange(conn, "version")["ok"]
            resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE, (lowest_free_fd(daemon.pid), soft))
            try:
                refused = exchange(conn, "submit", name="sent.toml", content=linreg_job("sent"))
                daemon.drop("dropped.toml", linreg_job("dropped", run={"steps": 2}))
                time.sleep(3)  # three rescans at 1 s
                kept = os.listdir(root / "spool" / "incoming") + os.listdir(
                    root / "spool" / "claimed"
                )
                rejected = os.listdir(root / "spool" / "rejected")
            finally:
                resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE, (soft, soft))
        assert refused["error"]["code"] == "control.busy", refused  # clients send it again
        assert "nothing was kept: send it again" in refused["error"]["message"]
        assert [name.endswith("dropped.toml") for name in kept] == [True]
        assert rejected == []
        assert daemon.wait("dropped")["state"] == "completed"
        assert daemon.ask("submit", name="sent.toml", content=linreg_job("sent"))["accepted"]
        assert len(log_events(root, "spool.short_of_resources")) == 1
        assert log_events(root, "spool.resources_back")[0]["put_off"] >= 3
