"""Evidence writes on a full disk: counted and logged, never fatal to following an attempt."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from jobwarden.daemon.launch.base import pump
from jobwarden.daemon.store.evidence import EvidenceFile, keep
from jobwarden.events import Event, Malformed

FULL = Path("/dev/full")  # every write fails with ENOSPC


def test_a_full_disk_costs_the_bytes_not_the_writer() -> None:
    """Each refused write is counted, with the errno named."""
    events = EvidenceFile(FULL)
    events.write(b"one\n")
    events.write(b"two\n")
    events.close()
    assert (events.lost_bytes, (events.error or "").split()[0]) == (8, "ENOSPC")


def test_writes_resume_when_the_disk_takes_bytes(tmp_path: Path) -> None:
    """A file that can be written keeps every byte and loses none."""
    events = EvidenceFile(tmp_path / "events.jsonl")
    events.write(b"a\n")
    events.write(b"b\n")
    events.close()
    assert ((tmp_path / "events.jsonl").read_bytes(), events.lost_bytes) == (b"a\nb\n", 0)


def test_keep_returns_the_error_instead_of_raising(tmp_path: Path) -> None:
    """A small evidence file that cannot be written names why."""
    assert keep(tmp_path / "missing-folder" / "exit.json", "{}") is not None
    assert keep(tmp_path / "exit.json", "{}") is None


def test_the_pump_dispatches_every_event_while_the_disk_is_full() -> None:
    """Events still reach the supervisor when events.jsonl cannot be written."""
    lines = [
        {"v": 1, "event": "completed", "step": 8, "state_hash": "h"},
        {"v": 1, "event": "preempted", "step": 8, "reason": "r"},
    ]
    seen: list[Event | Malformed] = []
    events = EvidenceFile(FULL)

    async def run() -> None:
        stream = asyncio.StreamReader()
        stream.feed_data(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
        stream.feed_eof()
        await pump(stream, events, seen.append, seen.append)

    asyncio.run(run())
    assert [e.kind for e in seen if isinstance(e, Event)] == ["completed", "preempted"]
    assert events.lost_bytes > 0
