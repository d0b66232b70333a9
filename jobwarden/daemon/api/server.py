"""The control socket's server side: peer checks, admission, bounded requests, dispatch.

Every connection's peer is checked with SO_PEERCRED as it is accepted: root, the
daemon's own uid, or a member of the configured group; anyone else is told
``control.forbidden``, the refusal logged, without taking a slot.  At most
`MAX_CLIENTS` connections are served at once; a client that finds them all taken
waits for one, nothing of it read meanwhile, in a waiting room of `waiting_room`
places (at most `BACKLOG`, and a quarter of the daemon's descriptors), for at most
`admission.WAIT_S`.  Who is served next, whose slot is taken back for whom, and who
is pushed out of a full room is `admission.Admission`'s policy: a client whose
request is already in its socket first, root and the daemon's uid before the
control group, the uid holding the fewest slots before the others; a slot is taken
back only from a connection that had its chance (no complete request within
`admission.GRACE_S`, an answer not taken within `admission.STUCK_S`), of the uid
holding the most.  Every client so refused is told ``control.busy`` ending in
"retry", a line that reaches it (written, then the connection closed, never
aborted): a request so refused was never read, so that wardenctl may send it again.
An honest burst is served in turn (1,000 clients at once: 1,000 answers), and one
uid of the control group holding every slot and every place keeps root waiting
`GRACE_S` or `STUCK_S` at most.  Out of descriptors, `listener.Listener` still tells
each client busy, on a descriptor it keeps in reserve.

A served connection is bounded too: a request line of at most `MAX_REQUEST_BYTES` is
read within the timeout, and each answer must be taken by the client within the same
timeout, or the connection is dropped with whatever it had buffered.  So a slow,
silent or malformed client never blocks the loop or other clients, never keeps an
honest client out for long, and never holds memory for long (once an overload has
passed, the heap's free pages are handed back).  Handlers are plain functions run on
the daemon's loop; any exception in one is an error answer, never a silent hang-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import grp
import inspect
import os
import resource
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from jobwarden.daemon.api.admission import WAIT_S, Admission, Phase, Slot, Waiter, has_request
from jobwarden.daemon.api.listener import HeardProtocol, Listener, heard, peer_credentials
from jobwarden.daemon.api.versions import downgrade, upgrade
from jobwarden.protocol import (
    MAX_REQUEST_BYTES,
    PROTOCOL_VERSION,
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
BACKLOG = 1024
"""Connections the kernel queues before the daemon accepts them (asyncio's default is 100)."""
TICK_S = 0.05
"""How often, while clients wait for a slot, the queue is looked over."""
LINGER_S = 0.5
"""How long a connection closed to serve a waiting client before it sent its request is
still read from (its line discarded, unanswered but for the busy line it was told), so
that its late request meets no broken pipe."""


def waiting_room() -> int:
    """How many accepted clients may wait for a slot: `BACKLOG`, or a quarter of the
    daemon's descriptors when that is fewer, so that waiting clients never starve the
    daemon's own files of descriptors."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return BACKLOG
    return max(1, min(BACKLOG, soft // 4))


def _malloc_trim() -> Callable[[], object]:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to hand back this way
        return lambda: None
    return lambda: trim(0)


release_memory = _malloc_trim()
"""Hand the allocator's free pages back to the system (glibc's ``malloc_trim``): request
lines of up to a megabyte, read from many clients at once, leave the heap fragmented,
and without a trim the daemon's rss stays at its peak after an attack has ended."""


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
        self.listener: Listener | None = None
        self.admission = Admission({0, os.getuid()}, MAX_CLIENTS, waiting_room())
        self.tasks: set[asyncio.Task[None]] = set()
        self._ticking: asyncio.TimerHandle | None = None
        self.refused = 0
        self.busy = 0
        self.evicted = 0
        self.lingering = 0
        """Evicted connections still read from for their late request (`LINGER_S`)."""
        self._trimmed_at = 0
        self.dropped = 0

    @property
    def pressure(self) -> int:
        """Connections told busy, evicted or dropped so far: the marks of an overload."""
        return self.busy + self.evicted + self.dropped

    def allowed(self, uid: int, gid: int) -> bool:
        """root, the daemon's uid, or the configured group."""
        if uid in (0, os.getuid()) or (self.gid is not None and gid == self.gid):
            return True
        if self.gid is None:
            return False
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
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177 if self.gid is None else 0o117)
        try:
            sock.bind(str(self.path))
            sock.listen(BACKLOG)
        except BaseException:
            sock.close()
            raise
        finally:
            os.umask(old)
        if self.gid is not None:
            os.chown(self.path, -1, self.gid)
            self.path.chmod(0o660)
        else:
            self.path.chmod(0o600)
        self.listener = Listener(sock, self._accepted, self._tell_busy, BACKLOG)
        self.listener.start(asyncio.get_running_loop())

    async def close(self) -> None:
        """Stop accepting, tell the waiting clients busy, and remove the socket file."""
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        while (waiter := self.admission.next_waiter()) is not None:
            self._tell_busy(waiter.conn, "the daemon is stopping")
        if self._ticking is not None:
            self._ticking.cancel()
        self.path.unlink(missing_ok=True)

    def _accepted(self, conn: socket.socket) -> None:
        """A new connection: refused, served at once, or queued for a slot."""
        try:
            pid, uid, gid = peer_credentials(conn)
        except OSError:
            conn.close()
            return
        if not self.allowed(uid, gid):
            self._refuse(conn, pid, uid, gid)
            return
        waiter = Waiter(conn, pid, uid, time.monotonic(), has_request(conn))
        if self.admission.free():
            self._grant(waiter)
            return
        pushed_out = self.admission.enqueue(waiter)
        if pushed_out is not None:
            waiting = self.admission.waiting
            self._tell_busy(pushed_out.conn, f"{MAX_CLIENTS} clients served, {waiting} waiting")
        self._make_room()
        if self.admission.waiting and self._ticking is None:
            self._ticking = asyncio.get_running_loop().call_later(TICK_S, self._tick)

    def _tell_busy(self, conn: socket.socket, why: str) -> None:
        """Answer an unread connection ``control.busy`` and close it: its request, never
        read, may be sent again."""
        self.busy += 1
        message = f"{why}: retry"
        with contextlib.suppress(OSError):  # a fresh socket's buffer takes the line at once
            conn.send(encode_error(None, "control.busy", message))
        conn.close()

    def _grant(self, waiter: Waiter) -> None:
        slot = self.admission.take(waiter.uid)
        slot.ready, slot.conn = waiter.ready or has_request(waiter.conn), waiter.conn
        task = asyncio.get_running_loop().create_task(self._serve(waiter, slot))
        slot.task = task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        task.add_done_callback(self._trim_if_quiet)

    def _trim_if_quiet(self, _: object = None) -> None:
        """Once an overload has passed (no slot held, no evicted connection still read from,
        their buffers freed), hand the heap's free pages back (`release_memory`)."""
        if not self.admission.slots and not self.lingering and self.pressure != self._trimmed_at:
            self._trimmed_at = self.pressure
            gc.collect()  # a connection's buffers may be held in a cycle of its transport
            release_memory()

    def _release(self, slot: Slot) -> None:
        """Free ``slot`` and hand it on to the next waiter."""
        if not self.admission.release(slot):
            return
        while self.admission.free() and (waiter := self.admission.next_waiter()) is not None:
            self._grant(waiter)

    def _tick(self) -> None:
        """While clients wait: notice requests that came in, tell those waiting too long
        busy, and take back the slots that had their chance."""
        self._ticking = None
        self.admission.promote(lambda waiter: has_request(waiter.conn))
        for waiter in self.admission.expired():
            self._tell_busy(waiter.conn, f"no free slot within {WAIT_S:g} s")
        self._make_room()
        if self.admission.waiting:
            self._ticking = asyncio.get_running_loop().call_later(TICK_S, self._tick)

    def _make_room(self) -> None:
        """Evict slots for the ready waiters, while there are some and a slot had its chance."""
        while not self.admission.free() and (victim := self.admission.victim(heard)) is not None:
            self._evict(victim)

    def _evict(self, victim: Slot) -> None:
        """Close the connection in ``victim``: one waiting for its request is told busy
        (the line written, then the connection closed once it is flushed); one that does
        not take its answer is cut off with it."""
        self.evicted += 1
        victim.evicted = True
        writer: asyncio.StreamWriter = victim.writer
        task = victim.task
        if victim.phase is Phase.READING:
            waited = time.monotonic() - victim.since
            message = f"closed to serve a waiting client: no complete request in {waited:.3g} s"
            writer.write(encode_error(None, "control.busy", f"{message}: retry"))
            if self.lingering < MAX_CLIENTS and task is not None and writer.can_write_eof():
                writer.write_eof()  # its request, when it comes, is read and dropped
                self.lingering += 1
                task.add_done_callback(self._lingered)
                asyncio.get_running_loop().call_later(LINGER_S, task.cancel)
                task = None
            else:
                writer.close()
        else:
            writer.transport.abort()
        if task is not None:
            task.cancel()
        self._release(victim)

    def _lingered(self, _: object) -> None:
        self.lingering -= 1
        self._trim_if_quiet()

    async def _serve(self, waiter: Waiter, slot: Slot) -> None:
        """Serve one connection in its slot until it ends or is evicted."""
        loop = asyncio.get_running_loop()
        writer = None
        try:
            reader = asyncio.StreamReader(limit=MAX_REQUEST_BYTES + 1)
            protocol = HeardProtocol(reader, slot)
            transport, _ = await loop.connect_accepted_socket(lambda: protocol, waiter.conn)
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            slot.writer = writer
            await self._converse(reader, writer, slot, waiter.pid)
        except asyncio.CancelledError:
            if not slot.evicted:
                raise
        except (ConnectionError, OSError, TimeoutError):
            pass
        finally:
            self._release(slot)
            if writer is not None:
                await self._finish(writer)
            else:
                waiter.conn.close()

    def _refuse(self, conn: socket.socket, pid: int, uid: int, gid: int) -> None:
        self.refused += 1
        log.warning(
            "control.refused",
            peer_pid=pid,
            peer_uid=uid,
            peer_gid=gid,
            reason="peer is not root, the daemon's user or the control group",
        )
        with contextlib.suppress(OSError):
            conn.send(encode_error(None, "control.forbidden", f"uid {uid} may not use this daemon"))
        conn.close()

    async def _converse(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: Slot, pid: int
    ) -> None:
        while True:
            slot.wait(Phase.READING, time.monotonic())
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
            slot.ready = False  # a later request on this connection has its `GRACE_S`
            if not line or slot.evicted:  # an evicted one was told busy, its line dropped
                return
            if not line.endswith(b"\n"):
                message = "request line ended without a newline"
                await self._send(writer, encode_error(None, "control.bad_request", message))
                return
            slot.wait(Phase.ANSWERING, time.monotonic())
            answer = await self._dispatch(line)
            slot.wait(Phase.SENDING, time.monotonic())
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
        request_id, version = None, PROTOCOL_VERSION
        try:
            request = upgrade(parse_request(line))
            request_id, version = request.id, request.version
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
            return encode_ok(request_id, downgrade(request, result), version)
        except TimeoutError:
            return encode_error(request_id, "control.timeout", "the daemon took too long", version)
        except ControlError as error:
            request_id = error.evidence.get("request_id", request_id)
            return encode_error(request_id, error.code, error.message, version)
        except Exception as error:  # any failure is an answer, never a hang-up
            log.error("control.failed", request=line[:200], error=repr(error), exc_info=error)
            return encode_error(
                request_id,
                "control.internal",
                f"the daemon could not answer: {type(error).__name__}: {error!s:.200}",
                version,
            )
