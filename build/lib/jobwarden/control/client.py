"""The client side of the control socket."""

from __future__ import annotations

import itertools
import json
import os
import socket
from pathlib import Path
from typing import Any

from jobwarden.control.protocol import PROTOCOL_VERSION, ControlError
from jobwarden.errors import JobwardenError

ROOT_ENV = "JOBWARDEN_ROOT"
SOCKET_ENV = "JOBWARDEN_SOCKET"
DEFAULT_ROOT = "/var/lib/jobwarden"
_ids = itertools.count(1)


class DaemonUnreachable(JobwardenError):
    """Raised when no daemon answers on the socket."""

    code = "control.unreachable"
    exit_status = 1


def socket_for(root: str | None, sock: str | None) -> Path:
    """The socket, first found of: --socket, --root's, $JOBWARDEN_SOCKET, $JOBWARDEN_ROOT's."""
    if sock:
        return Path(sock)
    if root:
        return Path(root) / "control.sock"
    if os.environ.get(SOCKET_ENV):
        return Path(os.environ[SOCKET_ENV])
    return Path(os.environ.get(ROOT_ENV) or DEFAULT_ROOT) / "control.sock"


def request(path: Path, cmd: str, timeout: float = 10.0, **args: Any) -> Any:
    """Send one request and return its result; raises ControlError or DaemonUnreachable."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        try:
            conn.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError) as error:
            raise DaemonUnreachable(
                f"wardend is not running: nothing answers on {path} ({error.strerror})",
                socket=str(path),
            ) from error
        request_id = next(_ids)
        line = json.dumps({"v": PROTOCOL_VERSION, "id": request_id, "cmd": cmd, "args": args})
        conn.sendall(line.encode() + b"\n")
        buffer = b""
        while not buffer.endswith(b"\n"):
            chunk = conn.recv(1 << 16)
            if not chunk:
                raise DaemonUnreachable(
                    f"wardend closed the connection on {path}", socket=str(path)
                )
            buffer += chunk
    reply = json.loads(buffer)
    if not reply.get("ok"):
        failure = reply.get("error", {})
        raise ControlError(failure.get("code", "control.error"), failure.get("message", "?"))
    return reply.get("result")
