"""``wardenctl dashboard``: serve the dashboard on loopback until interrupted."""

from __future__ import annotations

import argparse
import ipaddress
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from jobwarden.control.client import socket_for
from jobwarden.dashboard.drills import Drills
from jobwarden.dashboard.server import Dashboard
from jobwarden.dashboard.source import Source

DEFAULT_LISTEN = "127.0.0.1:8765"


def listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` as a loopback address and a port; ValueError names what is wrong."""
    host, colon, port = text.rpartition(":")
    host = host.strip("[]")
    if not colon or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--listen takes HOST:PORT, not {text!r}")
    if host != "localhost":
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(
                f"--listen {text}: the dashboard listens on loopback only (127.0.0.1, ::1 or "
                "localhost); reach it from another machine through an SSH tunnel"
            )
    return host, int(port)


def cmd_dashboard(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM; print the URL, with its token, first."""
    try:
        address = listen_address(args.listen)
    except ValueError as error:
        sys.stderr.write(f"wardenctl: {error}\n")
        return 2
    source = Source(socket_for(args.root, args.socket), getattr(args, "timeout", 10.0))
    source.table()  # a daemon that does not answer is said at once, not on the first visit
    server = Dashboard(address, source, Drills(tuple(Path(p) for p in args.drills or ())))
    sys.stdout.write(f"jobwarden dashboard (read-only): {server.url}\n")
    sys.stdout.flush()

    def stop(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.server_close()
    return 0
