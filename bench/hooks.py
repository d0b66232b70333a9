"""Notification sinks that hold on: how long one event holds its sink, and what counts as sent.

Against real peers on this box, with ``--notify-timeout 2`` and the default
tries (3) and backoff (0.5 s):

* an exec hook that starts ``sleep 20 &`` and exits 0 at once: how many times
  it runs for one event, whether the event is sent, how long the event holds
  the sink (every later event waits behind it), and how many of its helpers
  are still alive after the event;
* a webhook server that answers a whole 200 one byte every 0.5 s: how long
  one try holds the sink (the timeout bounds it in all);
* a webhook server that answers the POST with a 302 to a page a GET gets
  with 200: whether the event counts as sent, and how many GETs were made.

Prints a table and writes ``bench/results/hooks.json``.

    .venv/bin/python bench/hooks.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil

# Run as a script, import through the repository, as bench/reliability.py does.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.figures import Figure, at_most, records
from jobwarden.daemon.observe.hooks import Channel
from jobwarden.daemon.observe.sinks import DeliveryError, ExecHook, Sink, Webhook

TIMEOUT_S = 2.0
"""``--notify-timeout`` in every case."""
EVENT = {"event": "job.state", "time": "t", "job": "bench", "to": "queued"}
RESULTS = Path(__file__).parent / "results"


def one_event(sink: Sink) -> tuple[float, int, int]:
    """Seconds one event held a channel of ``sink``, and whether it was sent or dropped."""
    channel = Channel(sink)
    channel.thread.start()
    began = time.monotonic()
    channel.put(dict(EVENT))
    channel.close(timeout_s=120)
    return time.monotonic() - began, channel.sent, channel.dropped


def alive(pid: int) -> bool:
    """Whether ``pid`` runs still (a zombie waiting to be reaped has ended)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def helper_hook(folder: Path) -> list[Figure]:
    """The hook leaving ``sleep 20 &`` behind."""
    program, runs = folder / "hook.sh", folder / "runs.txt"
    program.write_text(f"#!/bin/sh\nsleep 20 &\necho $! >> {runs}\n")
    program.chmod(0o700)
    held, sent, _ = one_event(ExecHook(str(program), os.environ, folder, TIMEOUT_S))
    helpers = [int(line) for line in runs.read_text().split()]
    time.sleep(2)  # an orphan killed is reaped by init a little later
    left = sum(alive(pid) for pid in helpers)
    return [
        at_most("exec hook with a helper: runs per event", len(helpers), 1, "d"),
        at_most("exec hook with a helper: events dropped of 1", 1 - sent, 0, "d"),
        at_most("exec hook with a helper: event held its sink", held, TIMEOUT_S, ".2f", " s"),
        at_most("exec hook with a helper: helpers alive after", left, 0, "d"),
    ]


class Peer(BaseHTTPRequestHandler):
    """A webhook receiver that drips its 200 (``/drip``) or redirects (``/moved``)."""

    server: Server
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/landing")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        reply = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        self.close_connection = True
        try:
            for byte in reply:
                self.wfile.write(bytes([byte]))
                time.sleep(0.5)
        except OSError:
            pass

    def do_GET(self) -> None:
        self.server.gets += 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Server(ThreadingHTTPServer):
    """The peer on 127.0.0.1, counting the GETs it was sent."""

    daemon_threads = True
    gets = 0


@contextmanager
def serving() -> Iterator[Server]:
    """A running peer, shut down after."""
    server = Server(("127.0.0.1", 0), Peer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def webhooks() -> list[Figure]:
    """The dripping and the redirecting webhook."""
    with serving() as server:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        began = time.monotonic()
        with suppress(DeliveryError):
            Webhook(f"{base}/drip", TIMEOUT_S).deliver(json.dumps(EVENT).encode(), EVENT)
        held = time.monotonic() - began
        _, sent, _ = one_event(Webhook(f"{base}/moved", TIMEOUT_S))
        gets = server.gets
    return [
        at_most("dripping webhook: one try held its sink", held, TIMEOUT_S + 0.5, ".2f", " s"),
        at_most("redirecting webhook: events counted sent of 1", sent, 0, "d"),
        at_most("redirecting webhook: body-less GETs sent", gets, 0, "d"),
    ]


def main() -> int:
    """Measure, print, write the results."""
    with tempfile.TemporaryDirectory() as folder:
        figures = helper_hook(Path(folder)) + webhooks()
    for figure in figures:
        print(f"{figure.name:52} {figure.measured:>9}  {figure.target:>10}  {figure.result}")
    RESULTS.mkdir(exist_ok=True)
    results = {"timeout_s": TIMEOUT_S, "figures": records(figures)}
    (RESULTS / "hooks.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all(f.result == "PASS" for f in figures) else 1


if __name__ == "__main__":
    sys.exit(main())
