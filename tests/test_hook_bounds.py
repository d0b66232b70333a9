"""Webhooks judged by their own answer: a redirect is a failed try, never followed."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from jobwarden.daemon.observe.sinks import DeliveryError, Webhook

EVENT: Mapping[str, Any] = {"event": "job.state", "time": "t", "job": "a", "to": "queued"}
BODY = (json.dumps(EVENT) + "\n").encode()


class Server(ThreadingHTTPServer):
    """A local HTTP server on 127.0.0.1 keeping what it was asked and how each answer ended."""

    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.asked: list[str] = []
        self.ends: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


class Handler(BaseHTTPRequestHandler):
    """Answers POST /hook as the test's class attributes say; keeps each request line."""

    server: Server
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.asked.append(f"POST {self.path}")
        self.answer()

    def do_GET(self) -> None:
        self.server.asked.append(f"GET {self.path}")
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def answer(self) -> None:
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Redirecting(Handler):
    """302 to a landing page whose GET would answer 200."""

    def answer(self) -> None:
        self.send_response(302)
        self.send_header("Location", "/landing")
        self.send_header("Content-Length", "0")
        self.end_headers()


def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[Server]:
    """A running server for the test, shut down after it."""
    server = Server(handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(10)


@pytest.fixture
def redirecting() -> Iterator[Server]:
    yield from serving(Redirecting)


class TestWebhook:
    """A real HTTP server on loopback."""

    def test_a_redirect_is_a_failed_try_named_and_never_followed(self, redirecting: Server) -> None:
        """A 302 to a POST fails the try naming where it led; no body-less GET is sent."""
        with pytest.raises(DeliveryError) as failed:
            Webhook(redirecting.url, 5.0).deliver(BODY, EVENT)
        assert str(failed.value) == (
            "HTTP 302 Found: a redirect (to '/landing') is not followed for a POST; "
            "give the URL it leads to"
        )
        assert redirecting.asked == ["POST /hook"]
