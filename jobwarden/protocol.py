"""The control protocol: newline-delimited JSON over a Unix socket.

Request:  {"v": 2, "id": <any JSON scalar>, "cmd": "<command>", "args": {...}}
Response: {"v": 2, "id": <same>, "ok": true, "result": ...}
      or  {"v": 2, "id": <same>, "ok": false, "error": {"code": "...", "message": "..."}}

The answer carries the request's version, and has that version's shapes: a
client written against version 1 keeps working (`SUPPORTED_VERSIONS`; how an
older version's shapes are made is in jobwarden/daemon/api/versions.py).

A request line is at most `MAX_REQUEST_BYTES`, nests at most
`jobwarden.decoding.MAX_DEPTH` levels, and holds no NaN, Infinity or lone
surrogate; every answer is strict JSON (``allow_nan=False``).  docs/protocol.md
has the commands.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from jobwarden.decoding import loads_json
from jobwarden.errors import JobwardenError

PROTOCOL_VERSION = 2  # what this package's client sends, and the newest the daemon speaks
SUPPORTED_VERSIONS = (1, 2)
MAX_REQUEST_BYTES = 1024 * 1024  # a job file (at most 256 KiB) JSON-escaped, with room
MAX_ID_CHARS = 256
MAX_INT = 2**63 - 1  # integers in requests (ids, offsets) fit a signed 64-bit field


class ControlError(JobwardenError):
    """Raised for a request the daemon refuses; ``code`` goes back to the client."""

    code = "control.error"
    exit_status = 1

    def __init__(self, code: str, message: str, **evidence: Any) -> None:
        super().__init__(message, **evidence)
        self.code = code  # type: ignore[misc]


# NamedTuples, not dataclasses: importing dataclasses (and inspect) would cost every
# wardenctl command's start ~7 ms.
class Request(NamedTuple):
    """One parsed control request."""

    id: Any
    cmd: str
    args: dict[str, Any]
    version: int = PROTOCOL_VERSION


class Encoded(NamedTuple):
    """A result already encoded as JSON (UTF-8 bytes): the status table caches its rows so."""

    data: bytes


def is_int(value: Any) -> bool:
    """Whether ``value`` is a JSON integer: bool is not one, though Python says True == 1."""
    return isinstance(value, int) and not isinstance(value, bool)


def _valid_id(value: Any) -> bool:
    if value is None or isinstance(value, bool):
        return True
    if is_int(value):
        return bool(abs(value) <= MAX_INT)
    if isinstance(value, float):
        return True  # finite: loads_json refuses NaN and overflow
    return isinstance(value, str) and len(value) <= MAX_ID_CHARS


def parse_request(line: bytes) -> Request:
    """Parse one request line; raises `ControlError` naming what is wrong."""
    if len(line) > MAX_REQUEST_BYTES:
        raise ControlError(
            "control.too_large", f"request of {len(line)} bytes exceeds {MAX_REQUEST_BYTES}"
        )
    try:
        data = loads_json(line)
    except ValueError as error:
        raise ControlError("control.bad_json", f"request is not acceptable JSON: {error}") from None
    if not isinstance(data, dict):
        raise ControlError("control.bad_request", "request is not a JSON object")
    request_id = data.get("id")
    if not _valid_id(request_id):
        raise ControlError(
            "control.bad_request",
            f"id must be null, a boolean, a number within 64 bits or a string of at most "
            f"{MAX_ID_CHARS} characters",
        )
    version = data.get("v")
    if not is_int(version) or version not in SUPPORTED_VERSIONS:
        spoken = ", ".join(map(str, SUPPORTED_VERSIONS))
        raise ControlError(
            "control.version",
            f"protocol version {version!r:.40} is not supported: this daemon speaks {spoken}",
            request_id=request_id,
        )
    cmd, args = data.get("cmd"), data.get("args", {})
    if not isinstance(cmd, str) or not isinstance(args, dict):
        raise ControlError(
            "control.bad_request", "cmd must be a string and args an object", request_id=request_id
        )
    return Request(request_id, cmd, args, version)


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message, allow_nan=False, default=str).encode() + b"\n"


def encode_ok(request_id: Any, result: Any, version: int = PROTOCOL_VERSION) -> bytes:
    """A success response line; raises ValueError for a result that is not strict JSON."""
    head = {"v": version, "id": request_id, "ok": True}
    if isinstance(result, Encoded):
        return b"".join((_line(head)[:-2], b', "result": ', result.data, b"}\n"))
    return _line({**head, "result": result})


def encode_error(
    request_id: Any, code: str, message: str, version: int = PROTOCOL_VERSION
) -> bytes:
    """An error response line."""
    return _line(
        {
            "v": version,
            "id": request_id,
            "ok": False,
            "error": {"code": code, "message": message},
        }
    )
