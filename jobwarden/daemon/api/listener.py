"""The control socket's accept loop, which answers a client even when the daemon is out of
descriptors.

asyncio's own accept loop, on EMFILE or ENFILE, logs and stops accepting for a second,
and a client waits in the backlog for an answer that may never come.  This one keeps a
descriptor in reserve: out of descriptors, it closes the reserve, accepts the next
client with its number, hands it to ``busy`` (which tells it ``control.busy``, retry,
and closes it) and takes the reserve back.  Only when the reserve cannot be had again
(another thread took the number) does it pause, for `PAUSE_S`.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import struct
from collections.abc import Callable
from typing import Literal

import structlog

from jobwarden.daemon.api.admission import Phase, Slot, has_request

log = structlog.get_logger("wardend.control")

SHORT_OF = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""accept(2)'s errors that mean the daemon, not the client, is short of something."""
PAUSE_S = 0.1
"""How long accepting pauses when the daemon is out of descriptors and has none in reserve."""


class HeardProtocol(asyncio.StreamReaderProtocol):
    """A control connection's stream protocol that marks its slot ready as soon as a
    request line is received, before the serving task runs to read it: a slot whose
    request has come is not taken back (`admission.Slot.ready`)."""

    def __init__(self, reader: asyncio.StreamReader, slot: Slot) -> None:
        super().__init__(reader)
        self._slot = slot

    def data_received(self, data: bytes) -> None:
        """Feed the reader; a newline means a complete request waits to be read."""
        if b"\n" in data and self._slot.phase is Phase.READING:
            self._slot.ready = True
        super().data_received(data)


def heard(slot: Slot) -> bool:
    """Whether a complete request line waits in ``slot``'s socket, not read by the daemon."""
    return slot.conn is not None and has_request(slot.conn)


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process on the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def _reserve() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


class Listener:
    """Accepts on a listening socket for the loop: each connection goes to ``accepted``,
    or, when the daemon is out of descriptors, to ``busy``."""

    def __init__(
        self,
        sock: socket.socket,
        accepted: Callable[[socket.socket], None],
        busy: Callable[[socket.socket, str], None],
        batch: int,
    ) -> None:
        self.sock = sock
        self.accepted = accepted
        self.busy = busy
        self.batch = batch
        self.reserve = _reserve()
        self.short = 0
        """Connections accepted on the reserve's descriptor (told busy), so far."""
        self._short_now = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Accept whenever a client connects."""
        self._loop = loop
        self.sock.setblocking(False)
        loop.add_reader(self.sock.fileno(), self._ready)

    def close(self) -> None:
        """Stop accepting and close the socket and the reserve."""
        if self._loop is not None:
            self._loop.remove_reader(self.sock.fileno())
        self.sock.close()
        if self.reserve is not None:
            os.close(self.reserve)
            self.reserve = None

    def _ready(self) -> None:
        for _ in range(self.batch):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as error:
                if error.errno not in SHORT_OF:
                    log.error("control.accept_failed", error=repr(error))
                    return
                spared = self._spare()
                if spared == "stuck":
                    self._pause(error)
                if spared != "told":
                    return
                continue
            self._short_now = False
            conn.setblocking(False)
            self.accepted(conn)

    def _spare(self) -> Literal["told", "empty", "stuck"]:
        """Out of descriptors: tell the next client busy on the reserve's descriptor.
        "empty" when no client waits, "stuck" when there is no reserve to spend."""
        if self.reserve is None:
            self.reserve = _reserve()
            if self.reserve is None:
                return "stuck"
        os.close(self.reserve)
        self.reserve = None
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            self.reserve = _reserve()
            return "empty" if self.reserve is not None else "stuck"
        except OSError:
            conn = None
        if conn is not None:
            self.short += 1
            if not self._short_now:
                self._short_now = True
                log.warning(
                    "control.out_of_descriptors",
                    reason="clients are told busy until descriptors are free again",
                )
            self.busy(conn, "the daemon is out of file descriptors")
        self.reserve = _reserve()
        return "told" if conn is not None and self.reserve is not None else "stuck"

    def _pause(self, error: OSError) -> None:
        assert self._loop is not None
        log.warning("control.accept_paused", error=repr(error), pause_s=PAUSE_S)
        self._loop.remove_reader(self.sock.fileno())
        self._loop.call_later(PAUSE_S, self._resume)

    def _resume(self) -> None:
        if self._loop is not None and self.sock.fileno() >= 0:
            self._loop.add_reader(self.sock.fileno(), self._ready)
