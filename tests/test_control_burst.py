"""Honest clients all at once, an attacker of another uid, a daemon out of descriptors: every
client of the control socket gets its answer or an explicit ``control.busy``, and root is
answered promptly whatever the control group does.

Each test drives one real wardend over its real socket.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from bench.reliability_sections.burst import NOBODY, VERSION_LINE, attacker, burst_once, outcome
from jobwarden.control import client
from jobwarden.daemon.api import admission
from jobwarden.daemon.api.server import BACKLOG, waiting_room
from tests.daemon import Daemon

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="taking another uid needs root")


@pytest.fixture
def shared_socket() -> Iterator[Path]:
    """A socket path another uid may reach: a 0711 folder in the system's temporary folder
    (a test's own folder is private to its user)."""
    folder = Path(tempfile.mkdtemp(prefix="jobwarden-test-"))
    folder.chmod(0o711)
    try:
        yield folder / "control.sock"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def wardend(tmp_path: Path, shared_socket: Path) -> Iterator[Daemon]:
    """A daemon on an empty root whose control group is ``nogroup`` (nobody's)."""
    group = ("--group", "nogroup") if os.geteuid() == 0 else ()
    with Daemon(tmp_path / "root", None, "--socket", str(shared_socket), *group) as daemon:
        yield daemon


class TestBursts:
    """Many honest clients connecting at once, each asking as soon as it is connected."""

    def test_a_thousand_raw_clients_are_all_answered(self, wardend: Daemon) -> None:
        """1,000 connections sending ``version`` at once: 1,000 answers, none evicted, told
        busy or closed without an answer, no broken pipe."""
        burst = burst_once(wardend.socket, 1000, VERSION_LINE)
        assert (dict(burst.outcomes), burst.broken_pipes, dict(burst.connect_errors)) == (
            {"ok": 1000},
            0,
            {},
        )

    def test_a_daemon_stopped_again_and_again_still_answers_every_raw_client(
        self, wardend: Daemon
    ) -> None:
        """The same burst while the daemon is stopped for 0.2 s every 0.25 s (a loaded
        machine, taken to its extreme): a client whose request was in its socket when its
        slot was granted is read late, never closed to serve another; all 1,000 answered."""
        done = threading.Event()

        def stall() -> None:
            while not done.is_set():
                os.kill(wardend.pid, signal.SIGSTOP)
                time.sleep(0.2)
                os.kill(wardend.pid, signal.SIGCONT)
                time.sleep(0.05)

        staller = threading.Thread(target=stall)
        staller.start()
        try:
            burst = burst_once(wardend.socket, 1000, VERSION_LINE)
        finally:
            done.set()
            staller.join()
            os.kill(wardend.pid, signal.SIGCONT)
        assert (dict(burst.outcomes), burst.broken_pipes, dict(burst.connect_errors)) == (
            {"ok": 1000},
            0,
            {},
        )

    def test_a_thousand_threads_at_once_each_get_an_answer(self, wardend: Daemon) -> None:
        """1,000 threads released together, each a raw client and then a wardenctl one:
        each raw client answered or told busy (never closed without an answer, never a
        broken pipe), each wardenctl request answered."""
        raw: Counter[str] = Counter()
        ctl: Counter[str] = Counter()
        lock = threading.Lock()
        start = threading.Barrier(1000)

        def one() -> None:
            start.wait()
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(30)
                conn.connect(str(wardend.socket))
                try:
                    conn.sendall(VERSION_LINE)
                    seen = ""
                except BrokenPipeError:
                    seen = "broken pipe, then "
                data = b""
                while not data.endswith(b"\n"):
                    try:
                        chunk = conn.recv(65536)
                    except ConnectionResetError:
                        chunk = b""
                    if not chunk:
                        break
                    data += chunk
            seen += outcome(data)
            start.wait()
            try:
                client.request(wardend.socket, "version", timeout=30)
                answered = "ok"
            except Exception as error:  # noqa: BLE001 - every failure is counted, by kind
                answered = f"{type(error).__name__}: {error}"[:100]
            with lock:
                raw[seen] += 1
                ctl[answered] += 1

        threads = [threading.Thread(target=one) for _ in range(1000)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert set(raw) <= {"ok", "busy"}, raw
        assert sum(raw.values()) == 1000
        assert dict(ctl) == {"ok": 1000}


@as_root
def test_root_is_answered_while_another_uid_holds_every_slot(wardend: Daemon) -> None:
    """nobody, in the control group, holds 500 silent connections (a new one for each
    closed): each of root's 40 ``status`` answered within 0.3 s."""
    waits = []
    with attacker(wardend.socket, 500, NOBODY, NOBODY):
        time.sleep(0.3)
        for _ in range(40):
            began = time.monotonic()
            client.request(wardend.socket, "status", timeout=10)
            waits.append(time.monotonic() - began)
            time.sleep(0.02)
    assert max(waits) < 0.3, f"status waited {max(waits):.3f} s, all: {waits}"


@as_root
def test_a_daemon_out_of_descriptors_tells_each_client_busy(wardend: Daemon) -> None:
    """The daemon's descriptor limit lowered to what it holds plus 8: of 40 clients sending
    ``version``, each is answered or told busy within 3 s; once the limit is back, wardenctl
    is answered."""
    process = psutil.Process(wardend.pid)
    soft, hard = process.rlimit(psutil.RLIMIT_NOFILE)
    process.rlimit(psutil.RLIMIT_NOFILE, (process.num_fds() + 8, hard))
    try:
        burst = burst_once(wardend.socket, 40, VERSION_LINE, timeout=3)
    finally:
        process.rlimit(psutil.RLIMIT_NOFILE, (soft, hard))
    assert set(burst.outcomes) <= {"ok", "busy"}, burst.outcomes
    assert burst.outcomes["busy"] > 0, burst.outcomes
    assert client.request(wardend.socket, "version")["pid"] == wardend.pid


class TestWaitingRoom:
    """How many clients may wait for a slot, and who is served first."""

    def test_the_room_is_a_quarter_of_the_descriptors_at_most(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A limit of 1024 descriptors: 256 may wait; a large limit: BACKLOG."""
        import resource

        monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 4096))
        assert waiting_room() == 256
        monkeypatch.setattr(resource, "getrlimit", lambda which: (1 << 20, 1 << 20))
        assert waiting_room() == BACKLOG

    def test_an_operator_and_a_ready_client_go_first(self) -> None:
        """Root's ready request before an attacker's, which waited longer; a silent one last."""
        now = [0.0]
        rooms = admission.Admission({0}, capacity=1, room=10, clock=lambda: now[0])
        rooms.take(NOBODY)
        made = []
        for uid, ready, at in ((NOBODY, False, 1.0), (NOBODY, True, 2.0), (0, True, 3.0)):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            made.append(conn)
            rooms.enqueue(admission.Waiter(conn, 1, uid, at, ready))
        try:
            order = [rooms.next_waiter() for _ in range(3)]
            expected = [(0, 3.0), (NOBODY, 2.0), (NOBODY, 1.0)]
            assert expected == [(w.uid, w.since) for w in order if w]
        finally:
            for conn in made:
                conn.close()

    def test_a_full_room_pushes_out_the_heaviest_uids_newest(self) -> None:
        """Room for two, both nobody's: root's newcomer takes the newest's place; another of
        nobody's is itself told busy."""
        rooms = admission.Admission({0}, capacity=1, room=2, clock=lambda: 0.0)
        made = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(4)]
        try:
            first, second, third, fourth = (
                admission.Waiter(conn, 1, uid, float(i), True)
                for i, (conn, uid) in enumerate(zip(made, (NOBODY, NOBODY, 0, NOBODY), strict=True))
            )
            assert rooms.enqueue(first) is None
            assert rooms.enqueue(second) is None
            assert rooms.enqueue(third) is second
            assert rooms.enqueue(fourth) is fourth
            assert rooms.waiting == 2
        finally:
            for conn in made:
                conn.close()

    def test_a_ready_waiter_outwaits_a_silent_one(self) -> None:
        """At WAIT_S the silent waiter is told busy; the one whose request is in its socket
        waits on (a loaded daemon serves it late, not never) until READY_WAIT_S."""
        now = [0.0]
        rooms = admission.Admission({0}, capacity=1, room=10, clock=lambda: now[0])
        rooms.take(NOBODY)
        made = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
        try:
            silent = admission.Waiter(made[0], 1, NOBODY, 0.0, False)
            ready = admission.Waiter(made[1], 1, NOBODY, 0.0, True)
            rooms.enqueue(silent)
            rooms.enqueue(ready)
            now[0] = admission.WAIT_S
            assert rooms.expired() == [silent]
            now[0] = admission.READY_WAIT_S - 0.01
            assert rooms.expired() == []
            now[0] = admission.READY_WAIT_S
            assert rooms.expired() == [ready]
        finally:
            for conn in made:
                conn.close()

    def test_a_slot_granted_with_its_request_in_its_socket_is_not_taken_back(self) -> None:
        """Past GRACE_S, with a ready client waiting: a slot whose request is not read yet
        only because the daemon is slow keeps its place; a silent one is the victim."""
        now = [0.0]
        rooms = admission.Admission({0}, capacity=2, room=10, clock=lambda: now[0])
        ready, silent = rooms.take(NOBODY), rooms.take(NOBODY)
        ready.ready = True
        ready.writer = silent.writer = object()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            rooms.enqueue(admission.Waiter(conn, 1, NOBODY, 0.0, True))
            now[0] = admission.GRACE_S
            assert rooms.victim() is silent
            rooms.release(silent)
            rooms.take(NOBODY)  # a fresh slot, still opening: no writer yet
            assert rooms.victim() is None
        finally:
            conn.close()

    def test_a_slot_whose_request_came_after_its_grant_is_not_taken_back(self) -> None:
        """Past GRACE_S, with a ready client waiting: a slot granted before its client sent
        its line, whose line has come since but is not read yet (the daemon is slow), is made
        ready and kept; the victim is the one whose line has not come."""
        now = [0.0]
        rooms = admission.Admission({0}, capacity=2, room=10, clock=lambda: now[0])
        late, silent = rooms.take(NOBODY), rooms.take(NOBODY)
        late.writer = silent.writer = object()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            rooms.enqueue(admission.Waiter(conn, 1, NOBODY, 0.0, True))
            now[0] = admission.GRACE_S
            assert rooms.victim(lambda slot: slot is late) is silent
            assert (late.ready, silent.ready) == (True, False)
            assert rooms.victim(lambda slot: True) is None  # the other's line came too
        finally:
            conn.close()
