"""The control socket's server side: peer-credential checks, bounded requests, dispatch.

Every connection's peer is checked with SO_PEERCRED: root, the daemon's own
uid, or a member of the configured group; anyone else is refused and the
refusal logged, without taking a slot.  Every connection is bounded: at most
`MAX_CLIENTS` are served at once, a request line of at most
`MAX_REQUEST_BYTES` is read within the timeout, and each answer must be taken
by the client within the same timeout, or the connection is dropped with
whatever it had buffered.  When every slot is taken, a new client takes the
slot of the connection that has waited longest without sending a complete
request (a silent connect, a slowloris), or else of the one whose answer has
waited longest for it to read; that connection gets a ``control.busy`` line
(when it can still take one) and is closed.  Only when every slot is busy
answering does the new client get ``control.busy``.  So a slow, silent or
malformed client never blocks the loop or other clients, never keeps an
honest client out for long, and never holds memory for long.  Handlers are plain functions
run on the daemon's loop; any exception in one is an error answer, never a
silent hang-up.
"""

from __future__ import annotations

import asyncio
import ctypes
import enum
import grp
import inspect
import os
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from jobwarden.protocol import (
    MAX_REQUEST_BYTES,
    ControlError,
    encode_error,
    encode_ok,
    parse_request,
)

log = structlog.get_logger("wardend.control")

Handler = Callable[[dict[str, Any]], Any]
READ_TIMEOUT_S = 5.0
HANDLER_TIMEOUT_S = 60.0
MAX_CLIENTS = 64
"""Connections served at once; each may hold a request line and an answer in memory."""
STUCK_S = 0.5
"""How long an answer waits for its client before a new client may take the slot."""
BACKLOG = 1024
"""Connections the kernel queues before the daemon accepts them (asyncio's default is 100)."""


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process on the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def _malloc_trim() -> Callable[[], object]:
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to hand back this way
        return lambda: None
    return lambda: trim(0)


release_memory = _malloc_trim()
"""Hand the allocator's free pages back to the system (glibc's ``malloc_trim``).

Request lines of up to a megabyte, read from many clients at once, leave the
heap fragmented: without a trim the daemon's rss stays at its peak after an
attack has ended."""


class Phase(enum.Enum):
    """What a connection in a slot waits for."""

    READING = "a complete request line from the client"
    ANSWERING = "the daemon's answer"
    SENDING = "the client to take its answer"


@dataclass(eq=False)
class Slot:
    """One served connection: what it waits for, and since when (monotonic)."""

    writer: asyncio.StreamWriter
    task: asyncio.Task[Any] | None
    phase: Phase = Phase.READING
    since: float = field(default_factory=time.monotonic)
    evicted: bool = False

    def wait(self, phase: Phase) -> None:
        """Enter ``phase`` now."""
        self.phase, self.since = phase, time.monotonic()


class ControlServer:
    """Serves the control protocol on one Unix socket."""

    def __init__(
        self,
        path: Path,
        handlers: dict[str, Handler],
        group: str | None = None,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.path = path
        self.handlers = handlers
        self.gid = grp.getgrnam(group).gr_gid if group else None
        self.members = set(grp.getgrnam(group).gr_mem) if group else set()
        self.read_timeout_s = read_timeout_s
        self.server: asyncio.Server | None = None
        self.refused = 0
        self.slots: dict[asyncio.StreamWriter, Slot] = {}
        self.busy = 0
        self.evicted = 0
        self._trimmed_at = 0
        self.dropped = 0

    @property
    def pressure(self) -> int:
        """Connections told busy, evicted or dropped so far: the marks of an overload."""
        return self.busy + self.evicted + self.dropped

    def allowed(self, uid: int, gid: int) -> bool:
        """root, the daemon's uid, or the configured group."""
        if uid in (0, os.getuid()):
            return True
        if self.gid is None:
            return False
        if gid == self.gid:
            return True
        try:
            import pwd

            return pwd.getpwuid(uid).pw_name in self.members
        except KeyError:
            return False

    async def start(self) -> None:
        """Bind the socket (replacing a stale one) with mode 0600, or 0660 with a group."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_socket():
            self.path.unlink()
        old = os.umask(0o177 if self.gid is None else 0o117)
        try:
            self.server = await asyncio.start_unix_server(
                self._serve, path=str(self.path), limit=MAX_REQUEST_BYTES + 1, backlog=BACKLOG
            )
        finally:
            os.umask(old)
        if self.gid is not None:
            os.chown(self.path, -1, self.gid)
            self.path.chmod(0o660)
        else:
            self.path.chmod(0o600)

    async def close(self) -> None:
        """Stop accepting and remove the socket file."""
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        self.path.unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            pid, uid, gid = peer_credentials(writer.get_extra_info("socket"))
            if not self.allowed(uid, gid):
                self._refuse(writer, pid, uid, gid)
            elif len(self.slots) < MAX_CLIENTS or self._evict():
                await self._hold(reader, writer, pid)
            else:
                self.busy += 1
                message = f"the daemon serves {MAX_CLIENTS} clients already"
                writer.write(encode_error(None, "control.busy", message))
        except (ConnectionError, OSError, TimeoutError):
            pass
        finally:
            await self._finish(writer)

    async def _hold(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pid: int
    ) -> None:
        """Serve one connection in a slot until it ends or is evicted."""
        slot = Slot(writer, asyncio.current_task())
        self.slots[writer] = slot
        try:
            await self._converse(reader, writer, slot, pid)
        except asyncio.CancelledError:
            if not slot.evicted:
                raise
        finally:
            self.slots.pop(writer, None)
            if not self.slots and self.pressure != self._trimmed_at:
                self._trimmed_at = self.pressure
                release_memory()

    def _evict(self) -> bool:
        """Free a slot for a new client: close the longest-waiting connection that holds no
        complete request or, failing one, the one whose answer has waited longest (and at
        least `STUCK_S`) for it to read.  False when there is none."""
        stuck = time.monotonic() - STUCK_S
        waiting = [
            s
            for s in self.slots.values()
            if s.phase is Phase.READING or (s.phase is Phase.SENDING and s.since <= stuck)
        ]
        if not waiting:
            return False
        victim = min(waiting, key=lambda s: (s.phase is Phase.SENDING, s.since))
        self.evicted += 1
        victim.evicted = True
        del self.slots[victim.writer]
        if victim.phase is Phase.READING:  # its buffer is empty: this line leaves at once
            waited = time.monotonic() - victim.since
            message = f"closed to serve a newer client: no complete request in {waited:.3g} s"
            victim.writer.write(encode_error(None, "control.busy", message))
        victim.writer.transport.abort()
        if victim.task is not None:
            victim.task.cancel()
        return True

    def _refuse(self, writer: asyncio.StreamWriter, pid: int, uid: int, gid: int) -> None:
        self.refused += 1
        log.warning(
            "control.refused",
            peer_pid=pid,
            peer_uid=uid,
            peer_gid=gid,
            reason="peer is not root, the daemon's user or the control group",
        )
        writer.write(encode_error(None, "control.forbidden", f"uid {uid} may not use this daemon"))

    async def _converse(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: Slot, pid: int
    ) -> None:
        while True:
            slot.wait(Phase.READING)
            try:
                line = await asyncio.wait_for(reader.readline(), self.read_timeout_s)
            except TimeoutError:
                message = f"no complete request within {self.read_timeout_s:g} s"
                await self._send(writer, encode_error(None, "control.timeout", message))
                return
            except ValueError:
                message = f"request exceeds {MAX_REQUEST_BYTES} bytes"
                await self._send(writer, encode_error(None, "control.too_large", message))
                return
            if not line:
                return
            if not line.endswith(b"\n"):
                message = "request line ended without a newline"
                await self._send(writer, encode_error(None, "control.bad_request", message))
                return
            slot.wait(Phase.ANSWERING)
            answer = await self._dispatch(line)
            slot.wait(Phase.SENDING)
            await self._send(writer, answer, pid)

    async def _send(
        self, writer: asyncio.StreamWriter, data: bytes, pid: int | None = None
    ) -> None:
        """Write one answer; raises TimeoutError (the connection is dropped) if it is not taken."""
        writer.write(data)
        try:
            await asyncio.wait_for(writer.drain(), self.read_timeout_s)
        except TimeoutError:
            self.dropped += 1
            log.warning(
                "control.dropped",
                peer_pid=pid,
                reason=f"the client did not take its answer within {self.read_timeout_s:g} s",
                buffered=writer.transport.get_write_buffer_size(),
            )
            writer.transport.abort()
            raise

    async def _finish(self, writer: asyncio.StreamWriter) -> None:
        """Close the connection; what a client never reads is discarded, not kept."""
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), self.read_timeout_s)
        except (TimeoutError, ConnectionError, OSError):
            writer.transport.abort()

    async def _dispatch(self, line: bytes) -> bytes:
        request_id = None
        try:
            request = parse_request(line)
            request_id = request.id
            handler = self.handlers.get(request.cmd)
            if handler is None:
                known = ", ".join(sorted(self.handlers))
                raise ControlError(
                    "control.unknown_command",
                    f"unknown command {request.cmd!r:.80}; known: {known}",
                )
            result = handler(request.args)
            if inspect.isawaitable(result):
                result = await asyncio.wait_for(result, HANDLER_TIMEOUT_S)
            return encode_ok(request_id, result)
        except TimeoutError:
            return encode_error(request_id, "control.timeout", "the daemon took too long")
        except ControlError as error:
            return encode_error(
                error.evidence.get("request_id", request_id), error.code, error.message
            )
        except Exception as error:  # any failure is an answer, never a hang-up
            log.error("control.failed", request=line[:200], error=repr(error), exc_info=error)
            return encode_error(
                request_id,
                "control.internal",
                f"the daemon could not answer: {type(error).__name__}: {error!s:.200}",
            )
