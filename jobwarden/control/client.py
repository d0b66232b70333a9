"""The client side of the control socket.

A daemon that is alive but cannot take the request now (its listen backlog is
full, it already serves its maximum of clients, or it does not answer in time)
is *busy*, which is not the same as *not running*: `request` retries a full
backlog, a ``control.busy`` answer, or a connection closed before the request
was written whole (a broken pipe and no answer), with a short backoff until its
timeout, then raises `DaemonBusy`.  Each of these proves that the daemon kept
nothing of the request (a ``submit`` answered busy because the daemon was short of
descriptors, memory or space dropped nothing); a request that went unanswered
after it was written is never sent again.  Only the first line of an answer is the
answer: a ``control.busy`` line may follow it when the daemon closes the connection.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from jobwarden.errors import JobwardenError
from jobwarden.protocol import PROTOCOL_VERSION, ControlError

ROOT_ENV = "JOBWARDEN_ROOT"
SOCKET_ENV = "JOBWARDEN_SOCKET"
DEFAULT_ROOT = "/var/lib/jobwarden"
DEFAULT_SOCKET = "/run/jobwarden/control.sock"
RETRY_S = (0.01, 0.2)  # first and largest pause between attempts at a busy daemon
_ids = itertools.count(1)


class DaemonUnreachable(JobwardenError):
    """Raised when no daemon answers on the socket."""

    code = "control.unreachable"
    exit_status = 1


class DaemonBusy(JobwardenError):
    """Raised when a daemon is there but does not take or answer the request in time."""

    code = "control.busy"
    exit_status = 5


def socket_for(root: str | None, sock: str | None) -> Path:
    """The socket, first found of: --socket, --root's, $JOBWARDEN_SOCKET, $JOBWARDEN_ROOT's.

    The shipped unit's root, `DEFAULT_ROOT`, has its socket in `DEFAULT_SOCKET` (the
    unit's RuntimeDirectory): that is where a root of /var/lib/jobwarden is asked,
    unless a socket is in the root itself (a daemon started there by hand)."""
    if sock:
        return Path(sock)
    if not root and os.environ.get(SOCKET_ENV):
        return Path(os.environ[SOCKET_ENV])
    folder = Path(root or os.environ.get(ROOT_ENV) or DEFAULT_ROOT)
    in_root = folder / "control.sock"
    if folder == Path(DEFAULT_ROOT) and not in_root.exists():
        return Path(DEFAULT_SOCKET)
    return in_root


class _Busy(Exception):
    """One attempt met a busy daemon before it read the request: `request` tries again."""


def request(path: Path, cmd: str, timeout: float = 10.0, **args: Any) -> Any:
    """Send one request and return its result (a `StatusAnswer` for ``status``).

    Raises ControlError (the daemon refused it), DaemonUnreachable (nothing
    listens on ``path``) or DaemonBusy (no answer within ``timeout`` seconds).
    A request is sent again only when the daemon has not read it (a full
    backlog, a ``control.busy`` answer, a broken pipe before any answer), never
    after it went unanswered.
    """
    line = json.dumps(
        {"v": PROTOCOL_VERSION, "id": next(_ids), "cmd": cmd, "args": args}, allow_nan=False
    ).encode()
    deadline = time.monotonic() + timeout
    pause = RETRY_S[0]
    while True:
        try:
            reply = _exchange(path, line + b"\n", deadline, timeout)
        except _Busy as busy:
            if time.monotonic() + pause >= deadline:
                raise DaemonBusy(
                    f"wardend is busy on {path}: {busy}, for {timeout:g} s", socket=str(path)
                ) from None
            # Jittered, so that clients told busy at once retry apart (no secret: S311).
            import random  # only a refused client backs off: its start need not pay for it

            time.sleep(pause * random.uniform(0.5, 1.0))  # noqa: S311
            pause = min(pause * 2, RETRY_S[1])
            continue
        if reply.get("ok"):
            result = reply.get("result")
            if cmd == "status" and isinstance(result, dict) and "columns" in result:
                return StatusAnswer(result)
            return result
        failure = reply.get("error") or {}
        raise ControlError(
            str(failure.get("code", "control.error")), str(failure.get("message", "?"))
        )


class StatusAnswer(dict[str, Any]):
    """A ``status`` answer, its table column by column as the daemon sends it.

    ``answer["columns"]`` holds one list per field; ``answer["jobs"]`` gives
    the same table as one dict per job, built the first time it is read, so a
    caller that reads only the columns or the totals never pays for the rows.
    """

    def __missing__(self, key: str) -> Any:
        if key != "jobs" or not isinstance(self.get("columns"), dict):
            raise KeyError(key)
        rows = status_rows(self["columns"])
        self["jobs"] = rows
        return rows


def status_rows(columns: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The status table's columns as one dict per job."""
    names = list(columns)
    return [dict(zip(names, row, strict=True)) for row in zip(*columns.values(), strict=True)]


def _connect(path: Path, deadline: float) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(max(0.001, deadline - time.monotonic()))
    try:
        conn.connect(str(path))
    except BaseException as error:
        conn.close()
        if isinstance(error, FileNotFoundError | ConnectionRefusedError):
            raise DaemonUnreachable(
                f"wardend is not running: nothing answers on {path} ({error.strerror})",
                socket=str(path),
            ) from error
        if isinstance(error, TimeoutError):
            raise _Busy("it did not accept the connection") from error
        if isinstance(error, OSError) and error.errno == errno.EAGAIN:
            raise _Busy("its listen backlog is full") from error
        if isinstance(error, OSError):
            raise DaemonUnreachable(
                f"cannot connect to wardend on {path}: {error.strerror}", socket=str(path)
            ) from error
        raise
    return conn


LARGE_ANSWER = 64 << 10
"""An answer this long (a status table of hundreds of jobs) is decoded by orjson, 4x faster
than json; a shorter one by json, since importing orjson costs a command's start ~10 ms."""


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _loads(answer: bytes | bytearray) -> Any:
    """One answer line decoded as strict JSON (NaN and Infinity refused)."""
    if len(answer) >= LARGE_ANSWER:
        import orjson

        return orjson.loads(answer)
    return json.loads(answer, parse_constant=_refuse_constant)


def _exchange(path: Path, line: bytes, deadline: float, timeout: float) -> dict[str, Any]:
    buffer = bytearray()
    taken = True
    with _connect(path, deadline) as conn:
        try:
            # A daemon that refuses the connection at once (busy, forbidden) may close it
            # before our request is written: its answer is read all the same.
            try:
                conn.sendall(line)
            except (BrokenPipeError, ConnectionResetError):
                taken = False  # the line never arrived whole: the daemon cannot have run it
            while b"\n" not in buffer:
                conn.settimeout(max(0.001, deadline - time.monotonic()))
                chunk = conn.recv(1 << 20)
                if not chunk:
                    break
                buffer += chunk
        except TimeoutError as error:
            raise DaemonBusy(
                f"wardend is busy on {path}: no answer within {timeout:g} s", socket=str(path)
            ) from error
        except ConnectionResetError:
            pass
    if b"\n" not in buffer:
        if not taken and not buffer:
            raise _Busy("it closed the connection before taking the request")
        raise DaemonUnreachable(f"wardend closed the connection on {path}", socket=str(path))
    answer = buffer[: buffer.index(b"\n") + 1]  # a busy line may follow: this one answers
    try:
        reply = _loads(answer)
    except ValueError as error:
        raise DaemonUnreachable(
            f"wardend sent an answer that is not JSON on {path}: {error}", socket=str(path)
        ) from error
    if not isinstance(reply, dict):
        raise DaemonUnreachable(
            f"wardend sent an answer that is not an object on {path}", socket=str(path)
        )
    failure = reply.get("error")
    if not reply.get("ok") and isinstance(failure, dict) and failure.get("code") == "control.busy":
        raise _Busy(str(failure.get("message") or "it serves its maximum of clients"))
    return reply
