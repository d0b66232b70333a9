"""Hooks and webhooks that would hold a try: each try is bounded in total and judged right."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest

from jobwarden.daemon.config import NotifySettings
from jobwarden.daemon.observe.hooks import Channel, Notifications
from jobwarden.daemon.observe.sinks import DeliveryError, ExecHook, Webhook
from tests.helpers import wait_until

EVENT: Mapping[str, Any] = {"event": "job.state", "time": "t", "job": "a", "to": "queued"}
BODY = (json.dumps(EVENT) + "\n").encode()


def shell_hook(tmp_path: Path, script: str) -> Path:
    """An executable /bin/sh hook running ``script``, with OUT and PID naming files beside it."""
    program = tmp_path / "hook.sh"
    out, pid = tmp_path / "runs.txt", tmp_path / "helper.pid"
    program.write_text("#!/bin/sh\n" + script.replace("OUT", str(out)).replace("PID", str(pid)))
    program.chmod(0o700)
    return program


def gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie waiting for init to reap it counts as ended)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def helper_of(tmp_path: Path) -> int:
    """The pid of the background helper the hook started."""
    return int((tmp_path / "helper.pid").read_text())


SUBREAPER = """\
import os, sys
from pathlib import Path
import psutil
from jobwarden.daemon.launch.reaper import become_subreaper
from jobwarden.daemon.observe.sinks import ExecHook
assert become_subreaper()
ExecHook(sys.argv[1], os.environ, Path(sys.argv[2]), 5.0).deliver(b"{}", {"event": "job.state"})
print("children:", [child.pid for child in psutil.Process().children()])
"""


class TestExecHook:
    """A real /bin/sh hook: its try ends with its own exit, and its process group is killed."""

    def test_a_hook_leaving_a_helper_behind_is_delivered_once_and_the_helper_killed(
        self, tmp_path: Path
    ) -> None:
        """``sleep 60 &`` and exit 0: one run, the event sent, the helper killed after the try."""
        program = shell_hook(tmp_path, "echo ran >> OUT\nsleep 60 &\necho $! > PID\n")
        channel = Channel(ExecHook(str(program), os.environ, tmp_path, 3), backoff_s=0)
        channel.thread.start()
        channel.put(dict(EVENT))
        channel.close(timeout_s=60)
        assert (tmp_path / "runs.txt").read_text().splitlines() == ["ran"]
        assert (channel.sent, channel.dropped) == (1, 0)
        helper = helper_of(tmp_path)
        wait_until(lambda: gone(helper), timeout=10, what=f"the hook's helper {helper} killed")

    def test_a_subreaper_daemon_reaps_the_helpers_it_inherits_from_a_hook(
        self, tmp_path: Path
    ) -> None:
        """A subreaper (as wardend is) inherits a hook's helper; once killed, it is reaped."""
        program = shell_hook(tmp_path, "sleep 60 &\necho $! > PID\n")
        done = subprocess.run(
            [sys.executable, "-c", SUBREAPER, str(program), str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        helper = helper_of(tmp_path)
        assert done.stdout == "children: []\n", f"helper {helper} was left a zombie"

    def test_a_hook_that_does_not_exit_is_killed_with_its_helpers_at_the_timeout(
        self, tmp_path: Path
    ) -> None:
        """A hook sleeping past its timeout fails its try, named; its helper goes with it."""
        program = shell_hook(tmp_path, "sleep 60 &\necho $! > PID\nsleep 60\n")
        with pytest.raises(DeliveryError, match=r"^no exit within 1\.0 s \(killed\)$"):
            ExecHook(str(program), os.environ, tmp_path, 1.0).deliver(BODY, EVENT)
        helper = helper_of(tmp_path)
        wait_until(lambda: gone(helper), timeout=10, what=f"the hook's helper {helper} killed")

    def test_a_failing_hook_reads_the_event_and_its_stderr_ends_the_error(
        self, tmp_path: Path
    ) -> None:
        """The event is the hook's stdin; a non-zero exit fails the try with its stderr's end."""
        program = shell_hook(tmp_path, "cat > OUT\necho boom >&2\nexit 3\n")
        with pytest.raises(DeliveryError, match=r"^exit status 3: boom$"):
            ExecHook(str(program), os.environ, tmp_path, 5.0).deliver(BODY, EVENT)
        assert (tmp_path / "runs.txt").read_bytes() == BODY


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


class Dripping(Handler):
    """A whole 200 reply, one byte every 0.2 s (about 8 s in all)."""

    def answer(self) -> None:
        reply = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        try:
            for byte in reply:
                self.wfile.write(bytes([byte]))
                time.sleep(0.2)
        except OSError:
            self.server.ends.append("cut")
        else:
            self.server.ends.append("finished")
        self.close_connection = True


@contextmanager
def serving(server: Server) -> Iterator[Server]:
    """The server running for the test, shut down after it."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
def failing() -> Iterator[Server]:
    with serving(Server(Handler)) as server:
        yield server


@pytest.fixture
def redirecting() -> Iterator[Server]:
    with serving(Server(Redirecting)) as server:
        yield server


@pytest.fixture
def dripping() -> Iterator[Server]:
    with serving(Server(Dripping)) as server:
        yield server


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

    def test_a_dripping_reply_is_cut_at_the_timeout(self, dripping: Server) -> None:
        """One byte every 0.2 s never trips a per-read timeout; the try's total bound cuts it."""
        with pytest.raises(DeliveryError, match=r"^no reply within 1\.0 s$"):
            Webhook(dripping.url, 1.0).deliver(BODY, EVENT)
        wait_until(lambda: list(dripping.ends), timeout=10, what="the server's answer ended")
        assert dripping.ends == ["cut"]

    def test_a_dripping_reply_over_tls_is_cut_at_the_timeout(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The same over https, with a certificate for 127.0.0.1 the client trusts."""
        key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
        subprocess.run(
            [
                *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
                *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
                *("-addext", "subjectAltName=IP:127.0.0.1"),
            ],
            capture_output=True,
            check=True,
            timeout=60,
        )
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        server = Server(Dripping)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        with serving(server):
            with pytest.raises(DeliveryError, match=r"^no reply within 1\.0 s$"):
                Webhook(server.url.replace("http:", "https:"), 1.0).deliver(BODY, EVENT)
            wait_until(lambda: list(server.ends), timeout=10, what="the server's answer ended")
        assert server.ends == ["cut"]


def test_the_retry_settings_reach_each_sink(failing: Server, tmp_path: Path) -> None:
    """``tries`` and ``backoff_s`` from the settings: two tries of a 500, then dropped."""
    settings = NotifySettings(webhook=failing.url, timeout_s=5.0, tries=2, backoff_s=0.0)
    notifications = Notifications.of(settings, os.environ, tmp_path)
    notifications.start()
    notifications.publish(dict(EVENT))
    notifications.close()
    assert failing.asked == ["POST /hook", "POST /hook"]
    assert notifications.counts() == {"sent": 0, "dropped": 1, "overflowed": 0}
