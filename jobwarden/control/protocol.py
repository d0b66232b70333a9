"""The control protocol: newline-delimited JSON over a Unix socket.

Request:  {"v": 1, "id": <any JSON scalar>, "cmd": "<command>", "args": {...}}
Response: {"v": 1, "id": <same>, "ok": true, "result": ...}
      or  {"v": 1, "id": <same>, "ok": false, "error": {"code": "...", "message": "..."}}

A request line is at most `MAX_REQUEST_BYTES`.  docs/protocol.md has the commands.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from jobwarden.errors import JobwardenError

PROTOCOL_VERSION = 1
MAX_REQUEST_BYTES = 1024 * 1024  # a job file (at most 256 KiB) JSON-escaped, with room


class ControlError(JobwardenError):
    """Raised for a request the daemon refuses; ``code`` goes back to the client."""

    code = "control.error"
    exit_status = 1

    def __init__(self, code: str, message: str, **evidence: Any) -> None:
        super().__init__(message, **evidence)
        self.code = code  # type: ignore[misc]


@dataclass(frozen=True)
class Request:
    """One parsed control request."""

    id: Any
    cmd: str
    args: dict[str, Any] = field(default_factory=dict)


def parse_request(line: bytes) -> Request:
    """Parse one request line; raises `ControlError` naming what is wrong."""
    if len(line) > MAX_REQUEST_BYTES:
        raise ControlError(
            "control.too_large", f"request of {len(line)} bytes exceeds {MAX_REQUEST_BYTES}"
        )
    try:
        data = json.loads(line)
    except ValueError as error:
        raise ControlError("control.bad_json", f"request is not JSON: {error}") from error
    if not isinstance(data, dict):
        raise ControlError("control.bad_request", "request is not a JSON object")
    if data.get("v") != PROTOCOL_VERSION:
        raise ControlError(
            "control.version", f"protocol version {data.get('v')!r} is not {PROTOCOL_VERSION}"
        )
    cmd, args = data.get("cmd"), data.get("args", {})
    if not isinstance(cmd, str) or not isinstance(args, dict):
        raise ControlError("control.bad_request", "cmd must be a string and args an object")
    request_id = data.get("id")
    if isinstance(request_id, dict | list):
        raise ControlError("control.bad_request", "id must be a JSON scalar")
    return Request(request_id, cmd, args)


def encode_ok(request_id: Any, result: Any) -> bytes:
    """A success response line."""
    return (
        json.dumps(
            {"v": PROTOCOL_VERSION, "id": request_id, "ok": True, "result": result}, default=str
        ).encode()
        + b"\n"
    )


def encode_error(request_id: Any, code: str, message: str) -> bytes:
    """An error response line."""
    return (
        json.dumps(
            {
                "v": PROTOCOL_VERSION,
                "id": request_id,
                "ok": False,
                "error": {"code": code, "message": message},
            }
        ).encode()
        + b"\n"
    )
