"""sd_notify against a real datagram socket the test binds: READY, watchdog, STOPPING."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.control import client
from jobwarden.daemon.observe.notify import Notifier, child_environment
from jobwarden.protocol import PROTOCOL_VERSION
from jobwarden.testfaults import Fault, environment


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[socket.socket]:
    """A datagram socket standing in for systemd's notify socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.settimeout(15)
    yield sock
    sock.close()


def messages(sock: socket.socket, until: str, timeout: float = 15) -> list[tuple[float, str]]:
    """Datagrams with their arrival time, up to and including one containing ``until``."""
    got = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        data = sock.recv(4096).decode()
        got.append((time.monotonic(), data))
        if until in data:
            return got
    raise TimeoutError(f"no {until} within {timeout} s; got {got}")


def start(tmp_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """wardend on a fresh root with the given notify environment."""
    return subprocess.Popen(
        [sys.executable, "-m", "jobwarden.daemon", "--root", str(tmp_path / "root")],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_ready_comes_after_the_socket_accepts_and_stopping_on_sigterm(
    tmp_path: Path, manager: socket.socket
) -> None:
    """READY=1 arrives only once the control socket answers; SIGTERM sends STOPPING=1."""
    daemon = start(tmp_path, {"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
    try:
        ready = messages(manager, "READY=1")[-1][1]
        assert (
            client.request(tmp_path / "root" / "control.sock", "version")["protocol"]
            == PROTOCOL_VERSION
        )
        assert "STATUS=no jobs" in ready
        assert f"MAINPID={daemon.pid}" in ready
        daemon.send_signal(signal.SIGTERM)
        assert "STOPPING=1" in messages(manager, "STOPPING=1")[-1][1]
        assert daemon.wait(30) == 0
    finally:
        daemon.kill()
        daemon.wait()


def test_watchdog_pings_at_half_the_interval_and_stop_when_the_loop_blocks(
    tmp_path: Path, manager: socket.socket
) -> None:
    """WATCHDOG_USEC=1 s gives pings about every 0.5 s, none while the loop is blocked."""
    daemon = start(
        tmp_path,
        {
            "NOTIFY_SOCKET": str(tmp_path / "notify.sock"),
            "WATCHDOG_USEC": "1000000",
            **environment(Fault.BLOCK_LOOP_ON_SIGUSR2),
        },
    )
    try:
        messages(manager, "READY=1")
        pings = [t for t, m in messages(manager, "WATCHDOG=1") if "WATCHDOG=1" in m]
        while len(pings) < 6:
            pings += [t for t, m in messages(manager, "WATCHDOG=1") if "WATCHDOG=1" in m]
        gaps = [b - a for a, b in itertools.pairwise(pings[1:])]
        assert all(0.35 <= gap <= 0.8 for gap in gaps), gaps
        daemon.send_signal(signal.SIGUSR2)
        blocked_at = time.monotonic()
        after = [t for t, m in messages(manager, "WATCHDOG=1") if "WATCHDOG=1" in m]
        while after[-1] < blocked_at + 0.1:
            after += [t for t, m in messages(manager, "WATCHDOG=1") if "WATCHDOG=1" in m]
        assert after[-1] - blocked_at >= 1.8
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)


def test_abstract_addresses_and_watchdog_pid_are_honoured() -> None:
    """An @name address is the abstract namespace; WATCHDOG_PID of another process disables."""
    name = f"jobwarden-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        notifier = Notifier({"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "4000000"})
        assert notifier.watchdog_interval_s == 2.0
        assert notifier.status("hello")
        assert sock.recv(100) == b"STATUS=hello"
    other = Notifier({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"})
    assert other.watchdog_interval_s is None
    assert Notifier({}).send("READY=1") is False
    assert "NOTIFY_SOCKET" not in child_environment({"NOTIFY_SOCKET": "x", "PATH": "/bin"})
