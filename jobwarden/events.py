"""Worker -> supervisor events: one JSON object per stdout line, with a schema version.

Every event has ``v`` (the schema version), ``event`` (its kind) and ``time``
(wall-clock seconds, a record, never used for durations).  `parse_line` turns
a line into an `Event` or a `Malformed` kept as evidence; it never raises:
a line nested too deeply, holding NaN or a lone surrogate is malformed too
(`jobwarden.decoding`).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from jobwarden.decoding import loads_json
from jobwarden.errors import JobwardenError

SCHEMA_VERSION = 1

# The fields each kind must carry, with their JSON types.
REQUIRED: dict[str, dict[str, tuple[type, ...]]] = {
    "started": {"pid": (int,), "backend": (str,), "devices": (list,), "runtime": (dict,)},
    "restored": {
        "step": (int,),
        "file": (str,),
        "state_hash": (str,),
        "components": (dict,),
        "checks": (list,),
        "skipped": (list,),
    },
    "ready": {
        "step": (int,),
        "warmup_s": (float, int),
        "state_hash": (str,),
        "components": (dict,),
    },
    "progress": {
        "step": (int,),
        "loss": (float, int, str, type(None)),  # null: none reported; a string: "nan", "inf"
        "examples": (int,),
        "update_s": (float, int),
        "state_hash": (str, type(None)),
    },
    "checkpoint": {
        "step": (int,),
        "file": (str,),
        "bytes": (int,),
        "seconds": (float, int),
        "state_hash": (str,),
    },
    "completed": {"step": (int,), "state_hash": (str,)},
    "preempted": {"step": (int,), "reason": (str,)},
    "failed": {"code": (str,), "message": (str,), "exit_status": (int,)},
    "stall_injected": {"step": (int,), "seconds": (float, int)},
}


class SupervisorGone(Exception):
    """Raised by `Emitter.emit` when stdout is broken: nobody is reading any more."""


@dataclass(frozen=True)
class Event:
    """One parsed, schema-checked event."""

    kind: str
    fields: Mapping[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.fields[name]

    def get(self, name: str, default: Any = None) -> Any:
        """A field, or ``default``."""
        return self.fields.get(name, default)


@dataclass(frozen=True)
class Malformed:
    """A line that is not a valid event, kept verbatim with the reason."""

    line: str
    reason: str
    lineno: int


def parse_line(line: str, lineno: int = 0) -> Event | Malformed:
    """Parse one event line; anything wrong yields a `Malformed`, never an exception."""
    try:
        record = loads_json(line)
    except ValueError as error:
        return Malformed(line, f"not JSON: {error}", lineno)
    except Exception as error:  # noqa: BLE001 - a line from a worker must never crash the daemon
        return Malformed(line, f"unparseable: {type(error).__name__}: {error}", lineno)
    if not isinstance(record, dict):
        return Malformed(line, "not a JSON object", lineno)
    if record.get("v") != SCHEMA_VERSION:
        return Malformed(
            line, f"schema version {record.get('v')!r}, expected {SCHEMA_VERSION}", lineno
        )
    kind = record.get("event")
    if not isinstance(kind, str) or kind not in REQUIRED:
        return Malformed(line, f"unknown event kind {kind!r}", lineno)
    for name, types in REQUIRED[kind].items():
        value = record.get(name)
        if not isinstance(value, types) or isinstance(value, bool):
            return Malformed(
                line,
                f"{kind}.{name} is {value!r}, expected {'/'.join(t.__name__ for t in types)}",
                lineno,
            )
    return Event(kind, record)


def parse_lines(lines: Iterable[str]) -> Iterator[Event | Malformed]:
    """Parse every non-blank line."""
    for number, line in enumerate(lines, 1):
        if line.strip():
            yield parse_line(line.rstrip("\n"), number)


def read_events(path: Path) -> list[Event | Malformed]:
    """All events and malformed lines of an events file."""
    with path.open(encoding="utf-8", errors="replace") as stream:
        return list(parse_lines(stream))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):  # metrics: a NaN accuracy is reported, not a broken stream
        return {k: _finite(v) for k, v in value.items()}
    return value


ENCODER = json.JSONEncoder(allow_nan=False)
"""`json.dumps(..., allow_nan=False)` without building an encoder for every line."""


def iso_twin(seconds: float) -> str:
    """The ISO 8601 twin of an epoch time, as every JSON output of jobwarden writes it beside
    the epoch field (``<field>_iso``): UTC with its offset, to the millisecond."""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.isoformat(timespec="milliseconds")


def encode(kind: str, fields: Mapping[str, Any], at: float | None = None) -> str:
    """One event as its JSON line, newline included; a non-finite float becomes its repr.

    ``at``: the wall-clock time the event happened (default: now).
    """
    record = {"v": SCHEMA_VERSION, "event": kind, "time": time.time() if at is None else at}
    record.update(fields)
    try:
        return ENCODER.encode(record) + "\n"
    except ValueError:  # a non-finite float (the encoder refuses them): written as its repr
        return ENCODER.encode({k: _finite(v) for k, v in record.items()}) + "\n"


class Emitter:
    """Writes events as JSON lines to a stream, flushing each one."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.broken = False

    def emit(self, kind: str, **fields: Any) -> None:
        """Write one event; raises `SupervisorGone` once the stream is broken."""
        self.write(kind, encode(kind, fields))

    def write(self, kind: str, lines: str) -> None:
        """Write and flush encoded event ``lines``; raises `SupervisorGone` (naming ``kind``)."""
        if self.broken:
            raise SupervisorGone(kind)
        try:
            self.stream.write(lines)
            self.stream.flush()
        except (BrokenPipeError, ValueError, OSError) as error:
            self.broken = True
            raise SupervisorGone(kind) from error

    def failed(self, error: JobwardenError) -> int:
        """Report a refusal: a ``failed`` event (if anyone reads) and a line on stderr.

        Returns the error's exit status.
        """
        with contextlib.suppress(SupervisorGone):
            self.emit("failed", exit_status=error.exit_status, **error.as_record())
        human(f"jobwarden worker: {error.code}: {error.message}\n")
        return error.exit_status


def human(text: str) -> None:
    """Write a line for people on stderr; a full disk or a closed stderr costs only the line.

    stderr is evidence for a person; the event stream is the supervisor's.  A
    failed write here must never turn a reported refusal into a crash.
    """
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(text)
        sys.stderr.flush()


def step_ranges(steps: Iterable[int]) -> str:
    """Steps as an operator reads them: runs of consecutive steps as ranges, the rest one by
    one, in order (``[1, 2, 3, 7, 9, 10]``: ``1..3, 7, 9..10``; none: ``none``), so that
    4,389 replayed updates are ``12..4400``, not 4,389 numbers."""
    ordered = sorted(set(steps))
    if not ordered:
        return "none"
    runs: list[list[int]] = [[ordered[0], ordered[0]]]
    for step in ordered[1:]:
        if step == runs[-1][1] + 1:
            runs[-1][1] = step
        else:
            runs.append([step, step])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)
