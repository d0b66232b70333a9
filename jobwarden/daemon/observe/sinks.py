"""Where notifications go: an exec hook or a webhook, one try per call, each bounded in total.

A try is judged by what the sink itself answers: a hook by its own exit (not
by the pipes a helper it started may hold open), a webhook by its status (a
redirect is never followed, since urllib would re-send the POST as a GET
without its body). No try outlasts its timeout: a hook is killed with its
whole process group once it has exited or its time is up, and a webhook's
connection is shut down under a reply that drips (urllib's own timeout bounds
each read, not the try).
"""

from __future__ import annotations

import contextlib
import http.client
import math
import os
import select
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Protocol

import psutil

from jobwarden import __version__
from jobwarden.daemon.children import CHILDREN
from jobwarden.daemon.observe.notify import child_environment
from jobwarden.daemon.store.evidence import describe

ERROR_CHARS = 300
"""Of a hook's stderr, this much is kept in the log."""
REAP_ROUNDS = 10
"""Generations of a hook's helpers reaped at most (each is inherited when its parent dies)."""


class DeliveryError(Exception):
    """Raised by a sink when one try failed; the message is what the log keeps."""


class Sink(Protocol):
    """Where events go: one try per call, `DeliveryError` when it failed."""

    name: str

    def deliver(self, body: bytes, event: Mapping[str, Any]) -> None:
        """Deliver one event, or raise `DeliveryError`."""


def environment_of(event: Mapping[str, Any]) -> dict[str, str]:
    """The ``JOBWARDEN_EVENT*`` variables an exec hook gets beside the JSON on stdin."""
    names = {"event": "JOBWARDEN_EVENT", "time_iso": "JOBWARDEN_EVENT_TIME"}
    env = {}
    for key in ("event", "time_iso", "job", "from", "to", "incident", "kind", "status"):
        value = event.get(key)
        if value is not None:
            env[names.get(key, f"JOBWARDEN_EVENT_{key.upper()}")] = str(value)
    return env


def exited_within(pid: int, timeout_s: float) -> bool:
    """Whether the child ``pid`` exits in time, left unreaped so that its group id stays ours."""
    descriptor = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(descriptor, select.POLLIN)
        return bool(poller.poll(math.ceil(timeout_s * 1000)))
    finally:
        os.close(descriptor)


def end_group(hook: subprocess.Popen[bytes]) -> None:
    """Kill the hook's process group (helpers it left included), then reap the hook itself."""
    with contextlib.suppress(ProcessLookupError):  # not while the leader is unreaped
        os.killpg(hook.pid, signal.SIGKILL)
    hook.wait()
    CHILDREN.discard(hook.pid)
    reap_group(hook.pid)


def reap_group(group: int) -> None:
    """Reap the group's killed helpers a subreaper daemon inherited, which nothing else waits for.

    A helper's own children are inherited when it dies, so the search goes on
    until no child of the daemon is left in the group.
    """
    for _ in range(REAP_ROUNDS):
        found = []
        for child in psutil.Process().children():
            with contextlib.suppress(OSError, psutil.Error):  # gone, or reaped meanwhile
                if os.getpgid(child.pid) == group:
                    found.append(child.pid)
        if not found:
            return
        for pid in found:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)  # SIGKILLed: it ends at once


def tail_of(stream: IO[bytes]) -> str:
    """The end of what a hook wrote to its stderr file, as text."""
    size = stream.seek(0, os.SEEK_END)
    stream.seek(max(0, size - 4 * ERROR_CHARS))
    return stream.read().decode(errors="replace").strip()[-ERROR_CHARS:]


class ExecHook:
    """Runs a program per event: argv[0] only, no shell, the event on stdin."""

    name = "exec"

    def __init__(
        self, program: str, environ: Mapping[str, str], cwd: Path, timeout_s: float
    ) -> None:
        self.program = program
        self.environment = child_environment(environ)
        self.cwd = cwd
        self.timeout_s = timeout_s

    def deliver(self, body: bytes, event: Mapping[str, Any]) -> None:
        """Run the hook once in a session of its own; it must exit 0 within the timeout."""
        with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stderr:
            stdin.write(body)
            stdin.seek(0)
            try:
                with CHILDREN.starting():
                    hook = subprocess.Popen(  # the operator's own program, no shell
                        [self.program],
                        stdin=stdin,
                        stdout=subprocess.DEVNULL,
                        stderr=stderr,
                        env={**self.environment, **environment_of(event)},
                        cwd=self.cwd,
                        start_new_session=True,
                    )
                    CHILDREN.add(hook.pid)
            except OSError as error:
                raise DeliveryError(f"could not start: {error}") from error
            try:
                exited = exited_within(hook.pid, self.timeout_s)
            finally:
                end_group(hook)
            if not exited:
                raise DeliveryError(f"no exit within {self.timeout_s} s (killed)")
            if hook.returncode != 0:
                tail = tail_of(stderr)
                raise DeliveryError(
                    f"exit status {hook.returncode}" + (f": {tail}" if tail else "")
                )


class Deadline:
    """One webhook try's bound: the connection it opened is shut down when the time is up."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.lock = threading.Lock()
        self.watched: list[socket.socket] = []
        self.passed = False
        self.timer = threading.Timer(seconds, self.cut)
        self.timer.daemon = True

    def left(self) -> float:
        """Seconds still left (a little above 0 once none are, so no socket turns non-blocking)."""
        return max(0.001, self.end - time.monotonic())

    def over(self) -> bool:
        """Whether the try has had all its time."""
        return self.passed or time.monotonic() >= self.end

    def watch(self, sock: socket.socket) -> None:
        """Keep a duplicate of the connection's socket to shut it down, whatever wraps it later."""
        copy = sock.dup()
        with self.lock:
            self.watched.append(copy)
            if self.passed:
                shut(copy)

    def cut(self) -> None:
        """Shut every watched connection down: a blocked read or handshake returns at once."""
        with self.lock:
            self.passed = True
            for sock in self.watched:
                shut(sock)

    def __enter__(self) -> Deadline:
        self.timer.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.timer.cancel()
        with self.lock:
            for sock in self.watched:
                sock.close()
            self.watched.clear()


def shut(sock: socket.socket) -> None:
    """Shut a socket down both ways; one already disconnected is left as it is."""
    with contextlib.suppress(OSError):  # ENOTCONN: the peer was gone already
        sock.shutdown(socket.SHUT_RDWR)


class WatchedConnection(http.client.HTTPConnection):
    """An HTTP connection whose socket its try's `Deadline` shuts down when the time is up."""

    def __init__(self, *args: Any, deadline: Deadline | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = deadline
        self._create_connection = self.create_watched

    def create_watched(
        self, address: tuple[str, int], timeout: float, source: tuple[str, int] | None = None
    ) -> socket.socket:
        """Connect within the time left; the socket is watched before a proxy's tunnel or TLS."""
        if self.deadline is None:
            return socket.create_connection(address, timeout, source)
        sock = socket.create_connection(address, self.deadline.left(), source)
        self.deadline.watch(sock)
        return sock


class WatchedTLSConnection(http.client.HTTPSConnection, WatchedConnection):
    """An HTTPS connection made over a `WatchedConnection`'s watched socket."""

    def __init__(self, *args: Any, deadline: Deadline | None = None, **kwargs: Any) -> None:
        http.client.HTTPSConnection.__init__(self, *args, **kwargs)
        self.deadline = deadline


class WatchedHandler(urllib.request.HTTPHandler):
    """Opens http URLs over `WatchedConnection`s of one try's deadline."""

    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(WatchedConnection, req, deadline=self.deadline)


class WatchedTLSHandler(urllib.request.HTTPSHandler):
    """Opens https URLs over `WatchedTLSConnection`s of one try's deadline."""

    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(WatchedTLSConnection, req, deadline=self.deadline)


class Unredirected(urllib.request.HTTPRedirectHandler):
    """Follows no redirect: urllib would re-send a POST as a GET without its body."""

    def redirect_request(self, *args: Any) -> None:
        return None


class Webhook:
    """POSTs each event as application/json to an http or https URL."""

    name = "webhook"

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s

    def deliver(self, body: bytes, event: Mapping[str, Any]) -> None:
        """POST once; anything but a 2xx status within the timeout, all told, is a failed try."""
        request = urllib.request.Request(  # noqa: S310 - the scheme is checked at start
            self.url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": f"jobwarden/{__version__}",
                "X-Jobwarden-Event": str(event["event"]),
            },
        )
        deadline = Deadline(self.timeout_s)
        opener = urllib.request.build_opener(
            Unredirected, WatchedHandler(deadline), WatchedTLSHandler(deadline)
        )
        try:
            with deadline, opener.open(request, timeout=self.timeout_s):
                pass  # a 2xx status: delivered, whatever the body says
        except urllib.error.HTTPError as error:
            error.close()
            text = f"HTTP {error.code} {error.reason}"
            if 300 <= error.code < 400:
                where = error.headers.get("Location")
                text += f": a redirect (to {where!r}) is not followed for a POST"
                text += "; give the URL it leads to"
            raise DeliveryError(text) from error
        except (OSError, ValueError, http.client.HTTPException) as error:  # resets, a bad reply
            if deadline.over():
                raise DeliveryError(f"no reply within {self.timeout_s} s") from error
            reason = getattr(error, "reason", error)
            text = describe(reason) if isinstance(reason, OSError) else str(reason)
            raise DeliveryError(text) from error
