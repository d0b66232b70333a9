"""The ``/metrics`` HTTP listener: few connections, each over within a deadline.

A scrape is one small GET, so the listener is an asyncio server on a loop of
its own in one thread (never the daemon's loop), rather than a thread per
connection with a timeout per read: a client that drips a header byte at a
time held a thread and a descriptor for as long as it liked, and about 1,100
of them took the daemon to its descriptor limit.  Here:

* at most `MAX_CONNECTIONS` are open at once; one more is answered ``503``
  and closed at once, without reading it (counted in `Listener.refused`);
* each connection has `DEADLINE_S` in all, from its accept to the last byte
  of its answer, whatever it sends and however slowly; then it is aborted;
* the request line and headers may hold `MAX_HEAD_BYTES`, and every answer
  ends the connection (``Connection: close``), so nothing idles between scrapes;
* the listen backlog is `MAX_CONNECTIONS` too, and asyncio accepts at most a
  backlog's worth per turn of its loop, so the refused connections awaiting
  their close hold at most as many descriptors again;
* when accept itself fails for want of descriptors or memory (EMFILE, ENFILE,
  ENOBUFS, ENOMEM), asyncio pauses the accepts for a second and tries again,
  where a thread's server would spin.

Refusals and accept failures are logged once per episode
(``metrics.refusing``, then ``metrics.serving`` with the count;
``metrics.accept_failed``).  Scrapes themselves are not logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from typing import Any

import structlog
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

log = structlog.get_logger("wardend.metrics")

MAX_CONNECTIONS = 16
"""Connections served at once: a scraper or two, with room for a curl."""
DEADLINE_S = 5.0
"""A connection's whole life, its request read and its answer written."""
MAX_HEAD_BYTES = 16 << 10
"""The request line and headers together (a scrape's are a few hundred bytes)."""
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 20\r\nConnection: close\r\nRetry-After: 1\r\n\r\ntoo many connections"
)
NOT_FOUND = b"not found; try /metrics\n"


def answer(head: bytes, exposition: bytes) -> bytes:
    """The whole HTTP answer to a request whose line and headers are ``head``."""
    line = head.split(b"\n", 1)[0].strip()
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
        return response(400, "text/plain; charset=utf-8", b"bad request\n", body=True)
    method, target = parts[0], parts[1]
    if method not in (b"GET", b"HEAD"):
        return response(405, "text/plain; charset=utf-8", b"GET or HEAD only\n", body=True)
    body = method == b"GET"
    if target.split(b"?", 1)[0] in (b"/metrics", b"/metrics/"):
        return response(200, CONTENT_TYPE_PLAIN_0_0_4, exposition, body)
    return response(404, "text/plain; charset=utf-8", NOT_FOUND, body)


REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


def response(status: int, kind: str, data: bytes, body: bool) -> bytes:
    """Status line, headers and (unless ``body`` is false, for HEAD) ``data``."""
    head = (
        f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: {kind}\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    ).encode()
    return head + data if body else head


async def read_head(reader: asyncio.StreamReader) -> bytes:
    """The request line and headers, up to the blank line (``\\r\\n`` or ``\\n`` endings).

    Raises ValueError past `MAX_HEAD_BYTES`, IncompleteReadError if the client hangs up.
    """
    head = b""
    while True:
        line = await reader.readuntil(b"\n")
        head += line
        if len(head) > MAX_HEAD_BYTES:
            raise ValueError(f"request head over {MAX_HEAD_BYTES} bytes")
        if line.strip() == b"" and head.strip():
            return head


class Listener:
    """Serves ``/metrics`` from `exposition` on a loop of its own, in one thread.

    Made, it has bound its socket (OSError when it cannot); `start` serves it until `close`.
    """

    def __init__(
        self,
        host: str,
        port: int,
        max_connections: int = MAX_CONNECTIONS,
        deadline_s: float = DEADLINE_S,
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.create_server((host, port), family=family, backlog=max_connections)
        self.address: tuple[str, int] = self.socket.getsockname()[:2]
        self.max_connections = max_connections
        self.deadline_s = deadline_s
        self.exposition = b""
        """The latest rendering, replaced by the daemon's loop; the listener only reads it."""
        self.active = 0
        self.refused = 0
        """Connections answered 503 since start (over ``max_connections``)."""
        self.aborted = 0
        """Connections closed at their deadline, or for a head too long, since start."""
        self._refusing = 0
        self._accept_failing = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-http", daemon=True)

    def start(self) -> None:
        """Start serving in the listener's thread (returns once it accepts)."""
        self._thread.start()
        self._ready.wait(10)

    def close(self) -> None:
        """Stop serving, close every connection and the socket, and join the thread."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # its loop is already closed
                loop.call_soon_threadsafe(stop.set)
            self._thread.join(5)
        self.socket.close()

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.set_exception_handler(self._loop_trouble)
        self._stop = asyncio.Event()
        server = await asyncio.start_server(
            self._connection, sock=self.socket, limit=4096, backlog=self.max_connections
        )
        self._ready.set()
        async with server:
            await self._stop.wait()
            server.close()
            for writer in list(self._writers):
                writer.transport.abort()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._accept_failing = False
        if self.active >= self.max_connections:
            self._refuse(writer)
            return
        if self._refusing:
            log.info("metrics.serving", refused=self._refusing, connections=self.active + 1)
            self._refusing = 0
        self.active += 1
        self._writers.add(writer)
        done = False
        try:
            async with asyncio.timeout(self.deadline_s):
                head = await read_head(reader)
                writer.write(answer(head, self.exposition))
                await writer.drain()
                done = True
        except (TimeoutError, ValueError, asyncio.LimitOverrunError):
            self.aborted += 1
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self.active -= 1
            self._writers.discard(writer)
            if done:
                writer.close()  # all of it is in the kernel's buffer: closes at once
            else:
                writer.transport.abort()

    def _refuse(self, writer: asyncio.StreamWriter) -> None:
        """Answer 503 without reading, and close (the answer fits any socket's buffer)."""
        self.refused += 1
        if not self._refusing:
            log.warning("metrics.refusing", connections=self.active, limit=self.max_connections)
        self._refusing += 1
        writer.write(REFUSAL)
        writer.close()

    def _loop_trouble(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """asyncio's own reports (an accept failing for want of descriptors): once per episode."""
        if not self._accept_failing:
            error = context.get("exception")
            log.error("metrics.accept_failed", problem=context.get("message"), error=repr(error))
        self._accept_failing = True
