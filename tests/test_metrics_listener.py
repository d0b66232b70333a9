"""The /metrics listener on real loopback sockets: its answers, its cap and its deadline."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import pytest

from jobwarden.daemon.observe.listener import Listener, answer


@contextlib.contextmanager
def serving(max_connections: int = 4, deadline_s: float = 5.0) -> Iterator[Listener]:
    """A started listener on a free loopback port, closed on the way out."""
    listener = Listener("127.0.0.1", 0, max_connections, deadline_s)
    listener.exposition = b"jobwarden_up 1\n"
    listener.start()
    try:
        yield listener
    finally:
        listener.close()


def connect(listener: Listener) -> socket.socket:
    """A blocking connection to the listener with a 10 s timeout."""
    return socket.create_connection(listener.address, timeout=10)


def read_all(conn: socket.socket) -> bytes:
    """Everything the listener sends until it closes."""
    data = b""
    while chunk := conn.recv(1 << 16):
        data += chunk
    return data


class TestAnswer:
    """What a request's head is answered with."""

    @pytest.mark.parametrize(
        ("head", "expected"),
        [
            (b"GET /metrics HTTP/1.1\r\n\r\n", b"HTTP/1.1 200 OK"),
            (b"GET /metrics/?x=1 HTTP/1.0\n\n", b"HTTP/1.1 200 OK"),
            (b"GET /other HTTP/1.1\r\n\r\n", b"HTTP/1.1 404 Not Found"),
            (b"POST /metrics HTTP/1.1\r\n\r\n", b"HTTP/1.1 405 Method Not Allowed"),
            (b"nonsense\r\n\r\n", b"HTTP/1.1 400 Bad Request"),
        ],
    )
    def test_status_line(self, head: bytes, expected: bytes) -> None:
        """/metrics (a query or a slash allowed) is 200, another path 404, a bad line 400."""
        assert expected == answer(head, b"x 1\n").split(b"\r\n", 1)[0]

    def test_head_has_no_body(self) -> None:
        """HEAD gets the headers of the GET, Content-Length included, and nothing after."""
        got = answer(b"HEAD /metrics HTTP/1.1\r\n\r\n", b"x 1\n")
        assert got.endswith(b"Content-Length: 4\r\nConnection: close\r\n\r\n")


class TestListener:
    """The listener's bounds, through real connections."""

    def test_a_scrape_gets_the_exposition_and_the_connection_closes(self) -> None:
        """One GET, one answer with the latest rendering, then the listener closes."""
        with serving() as listener, connect(listener) as conn:
            conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            got = read_all(conn)
        assert got.startswith(b"HTTP/1.1 200 OK\r\n")
        assert got.endswith(b"\r\n\r\njobwarden_up 1\n")

    def test_connections_over_the_cap_are_answered_503_at_once(self) -> None:
        """4 silent connections hold the 4 slots; a fifth is told 503 without being read."""
        with serving(max_connections=4) as listener:
            held = [connect(listener) for _ in range(4)]
            try:
                deadline = time.monotonic() + 10
                while listener.active < 4 and time.monotonic() < deadline:
                    time.sleep(0.01)
                with connect(listener) as extra:
                    got = read_all(extra)
                assert got.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
                assert listener.refused == 1
            finally:
                for conn in held:
                    conn.close()

    def test_a_dripping_client_is_cut_off_at_its_deadline_not_per_read(self) -> None:
        """A header byte every 0.1 s never lets a read time out; the 1 s deadline still ends it."""
        with serving(deadline_s=1.0) as listener, connect(listener) as conn:
            began = time.monotonic()
            conn.sendall(b"GET /metrics HTTP/1.1\r\n")
            with contextlib.suppress(OSError):
                while time.monotonic() - began < 10:
                    conn.sendall(b"X")
                    time.sleep(0.1)
            elapsed = time.monotonic() - began
        assert 0.9 <= elapsed < 3, elapsed
        assert listener.aborted == 1

    def test_closing_ends_connections_still_open(self) -> None:
        """A silent connection does not hold the listener's close; it is aborted."""
        listener = Listener("127.0.0.1", 0)
        listener.start()
        with connect(listener) as conn:
            time.sleep(0.1)
            began = time.monotonic()
            listener.close()
            assert time.monotonic() - began < 2
            assert read_all(conn) == b""
