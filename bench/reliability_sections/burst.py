"""Section burst: many honest clients at once, each asking as soon as it is connected; every
one must get its answer or an explicit ``control.busy``, never a close without an answer.
Then the operator's ``status`` while a client of another uid holds every slot."""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import shutil
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from jobwarden.control import client
from jobwarden.control.client import DaemonBusy, DaemonUnreachable
from jobwarden.protocol import ControlError

from .common import Section, ms, percentile
from .socket_abuse import settled_root
from .wardend import running, timed_status

VERSION_LINE = b'{"v": 2, "id": 1, "cmd": "version", "args": {}}\n'
STATUS_LINE = b'{"v": 2, "id": 1, "cmd": "status", "args": {}}\n'
NOBODY = 65534
"""The uid and gid the attacker takes (``nobody`` and ``nogroup`` on Debian and Ubuntu)."""
OUTCOMES = ("ok", "busy", "other error", "closed without answer", "no answer in time")


@dataclass
class Burst:
    """What each client of one burst got: its outcome, and how long its answer took."""

    outcomes: Counter[str] = field(default_factory=Counter)
    broken_pipes: int = 0
    connect_errors: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    retry: list[int] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def lost(self) -> int:
        """Clients that got neither an answer nor a ``control.busy``."""
        return sum(n for k, n in self.outcomes.items() if k not in ("ok", "busy"))


def outcome(data: bytes) -> str:
    """The outcome an answer line stands for."""
    if not data.endswith(b"\n"):
        return "closed without answer"
    reply = orjson.loads(data.split(b"\n")[0])
    if reply.get("ok"):
        return "ok"
    code = (reply.get("error") or {}).get("code")
    return "busy" if code == "control.busy" else "other error"


def burst_once(sock: Path, clients: int, line: bytes = VERSION_LINE, timeout: float = 30) -> Burst:
    """``clients`` connections made one after the other as fast as one thread can, each
    sending ``line`` at once; then every answer is read.

    A send that finds the pipe broken is counted and the answer read all the same (the
    daemon may answer and close before the request is written, as wardenctl expects).
    A latency runs from the client's connect to its answer's last byte."""
    result = Burst()
    selector = selectors.DefaultSelector()
    conns: dict[socket.socket, tuple[int, float, bytearray]] = {}
    began = time.perf_counter()
    for index in range(clients):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(timeout)
        started = time.perf_counter()
        try:
            conn.connect(str(sock))
        except OSError as error:
            conn.close()
            result.connect_errors[errno.errorcode.get(error.errno or 0, "timeout")] += 1
            result.retry.append(index)
            continue
        try:
            conn.sendall(line)
        except (BrokenPipeError, ConnectionResetError):
            result.broken_pipes += 1
        conn.setblocking(False)
        conns[conn] = (index, started, bytearray())
        selector.register(conn, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while conns and time.monotonic() < deadline:
        for key, _ in selector.select(max(0.0, deadline - time.monotonic())):
            chosen = key.fileobj
            assert isinstance(chosen, socket.socket)
            conn = chosen
            index, started, data = conns[conn]
            try:
                chunk = conn.recv(1 << 20)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                chunk = b""
            data += chunk
            if chunk and not data.endswith(b"\n"):
                continue
            seen = outcome(bytes(data))
            result.outcomes[seen] += 1
            if seen == "ok":
                result.latencies.append(time.perf_counter() - started)
            else:
                result.retry.append(index)
            selector.unregister(conn)
            conn.close()
            del conns[conn]
    for conn, (index, _, _) in conns.items():
        result.outcomes["no answer in time"] += 1
        result.retry.append(index)
        conn.close()
    selector.close()
    result.seconds = time.perf_counter() - began
    return result


def retried(sock: Path, burst: Burst, cmd: str, timeout: float = 30) -> int:
    """How many of the burst's clients told busy (or worse) get an answer when they try
    again as wardenctl does (`client.request`, which retries a busy daemon with backoff)."""
    answered = 0
    for _ in burst.retry:
        with contextlib.suppress(DaemonBusy, DaemonUnreachable, ControlError):
            client.request(sock, cmd, timeout=timeout)
            answered += 1
    return answered


def wardenctl_burst(
    sock: Path, clients: int, cmd: str = "version", timeout: float = 30
) -> Counter[str]:
    """``clients`` threads released together, each one `client.request` (wardenctl's, which
    retries a busy daemon with backoff): how each ended, ``ok`` or the error's kind."""
    ends: Counter[str] = Counter()
    lock = threading.Lock()
    start = threading.Barrier(clients)

    def one() -> None:
        start.wait()
        try:
            client.request(sock, cmd, timeout=timeout)
            end = "ok"
        except (DaemonBusy, DaemonUnreachable, ControlError) as error:
            end = type(error).__name__
        with lock:
            ends[end] += 1

    threads = [threading.Thread(target=one) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 60)
    return ends


@contextlib.contextmanager
def attacker(sock: Path, clients: int, uid: int = NOBODY, gid: int = NOBODY) -> Iterator[int]:
    """A forked child that takes ``uid`` and ``gid`` and holds ``clients`` silent
    connections, opening a new one for each the daemon closes; yields its pid once the
    first ``clients`` are connected.  Needs root (to change uid)."""
    ready_r, ready_w = os.pipe()
    stop_r, stop_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        status = 0
        try:
            os.close(ready_r)
            os.close(stop_w)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            _hold(sock, clients, ready_w, stop_r)
        except BaseException:  # noqa: BLE001 - a forked child exits here, whatever happened
            status = 1
        os._exit(status)
    os.close(ready_w)
    os.close(stop_r)
    try:
        with os.fdopen(ready_r, "rb") as ready:
            if ready.read(1) != b"r":
                raise RuntimeError(f"the attacker (pid {pid}) could not connect to {sock}")
        yield pid
    finally:
        os.close(stop_w)
        os.waitpid(pid, 0)


def _hold(sock: Path, clients: int, ready_w: int, stop_r: int) -> None:
    selector = selectors.DefaultSelector()
    selector.register(stop_r, selectors.EVENT_READ)

    def connect() -> None:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(sock))
        conn.setblocking(False)
        selector.register(conn, selectors.EVENT_READ)

    for _ in range(clients):
        connect()
    os.write(ready_w, b"r")
    os.close(ready_w)
    while True:
        for key, _ in selector.select(1.0):
            if key.fileobj == stop_r:
                return
            held = key.fileobj
            assert isinstance(held, socket.socket)
            with contextlib.suppress(OSError):
                if held.recv(65536):
                    continue
            selector.unregister(held)
            held.close()
            with contextlib.suppress(OSError):
                connect()


def burst_rows(section: Section, name: str, burst: Burst, again: int) -> None:
    """The rows and checks of one burst."""
    o = burst.outcomes
    section.row(
        f"{name}: answered / told busy / closed without answer",
        f"{o['ok']} / {o['busy']} / {o['closed without answer']}"
        f" (other {o['other error']}, late {o['no answer in time']},"
        f" connect errors {sum(burst.connect_errors.values())})",
        "all answered or told busy",
    )
    section.row(f"{name}: broken pipe on send", burst.broken_pipes, "0")
    section.row(
        f"{name}: answer p50 / p99",
        f"{ms(percentile(burst.latencies, 50))} / {ms(percentile(burst.latencies, 99))}",
    )
    section.row(f"{name}: answered once the rest retried", f"{o['ok'] + again}")
    section.check(f"{name}: every client answered or told busy", burst.lost == 0)
    section.check(f"{name}: closed without answer == 0", o["closed without answer"] == 0)
    section.check(f"{name}: all answered at the first try", o["ok"] == sum(o.values()))
    section.check(
        f"{name}: all answered after wardenctl-style retry",
        o["ok"] + again == sum(o.values()) + sum(burst.connect_errors.values()),
    )


def burst(
    folder: Path,
    cache: Path,
    *,
    clients: int = 1000,
    status_clients: int = 300,
    jobs: int = 100,
    attackers: int = 200,
    operator_requests: int = 50,
    operator_bound_s: float = 0.5,
) -> Section:
    """Honest bursts of ``version`` and ``status``; the operator's ``status`` while a client
    of another uid (``nobody``, in the daemon's control group) holds every slot."""
    section = Section("burst")
    section.sizes = {
        "version clients": clients,
        "status clients": status_clients,
        "jobs known": jobs,
        "attacker connections": attackers,
    }
    root = folder / "root"
    settled_root(root, jobs)
    # The attacker, another uid, must reach the socket: a folder it may pass through, in
    # the system's temporary folder (a test's own folder is private to its user).
    shared = Path(tempfile.mkdtemp(prefix="jobwarden-burst-"))
    shared.chmod(0o711)
    sock = shared / "control.sock"
    operator: list[float] = []
    failed: list[str] = []
    can_attack = os.geteuid() == 0
    group = ("--group", "nogroup") if can_attack else ()
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, shared, ignore_errors=True)
        daemon = cleanup.enter_context(running(root, cache, "--socket", str(sock), *group))
        versions = burst_once(sock, clients, VERSION_LINE)
        versions_again = retried(sock, versions, "version")
        statuses = burst_once(sock, status_clients, STATUS_LINE)
        statuses_again = retried(sock, statuses, "status")
        threaded = wardenctl_burst(sock, clients)
        if can_attack:
            with attacker(sock, attackers):
                for _ in range(operator_requests):
                    try:
                        operator.append(timed_status(sock, timeout=10))
                    except (DaemonBusy, DaemonUnreachable, ControlError) as error:
                        failed.append(repr(error)[:200])
                    time.sleep(0.02)
        alive = daemon.alive() and daemon.ask("version")["pid"] == daemon.pid
    f = section.figures
    for name, one, again in (
        ("version", versions, versions_again),
        ("status", statuses, statuses_again),
    ):
        f[name] = {
            "outcomes": dict(one.outcomes),
            "broken_pipes": one.broken_pipes,
            "connect_errors": dict(one.connect_errors),
            "answer_p50_s": percentile(one.latencies, 50),
            "answer_p99_s": percentile(one.latencies, 99),
            "answered_after_retry": again,
            "seconds": one.seconds,
        }
    f.update(
        {
            "operator_status_n": len(operator),
            "operator_status_p50_s": percentile(operator, 50),
            "operator_status_p99_s": percentile(operator, 99),
            "operator_status_max_s": max(operator, default=None),
            "operator_status_failed": failed,
            "wardenctl_threads": dict(threaded),
            "daemon_alive": alive,
        }
    )
    burst_rows(section, f"{clients} x version", versions, versions_again)
    burst_rows(section, f"{status_clients} x status", statuses, statuses_again)
    section.row(
        f"{clients} threads through wardenctl at once: answered",
        ", ".join(f"{k} {v}" for k, v in sorted(threaded.items())),
        f"ok {clients}",
    )
    section.check("wardenctl threads all answered", threaded["ok"] == clients)
    section.check("daemon alive", alive)
    if can_attack:
        section.row(
            f"operator status p50 / p99 / max, another uid holding {attackers} connections",
            f"{ms(f['operator_status_p50_s'])} / {ms(f['operator_status_p99_s'])} / "
            f"{ms(f['operator_status_max_s'])} ({len(failed)} failed)",
            f"max <= {ms(operator_bound_s)}",
        )
        section.check("operator answered throughout", not failed and bool(operator))
        section.check(
            "operator status within bound",
            (f["operator_status_max_s"] or 1e9) <= operator_bound_s,
        )
    return section
