"""What the daemon benchmarks read: wardend's own records, and the daemon that writes them.

The daemon is the package's harness (`jobwarden.control.harness.Wardend`), with readers of
its ``wardend.log`` and ``incidents.jsonl`` added: the benchmarks time the records the
daemon writes anyway.  bench/daemon.py, bench/recovery.py and bench/peers.py use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Self

from jobwarden.control import harness

POLL_S = 0.01
RESCAN_INTERVAL_S = 1.0
SETTLED_STATES = harness.SETTLED_STATES
private_dir = harness.private_dir
Record = dict[str, Any]
Match = Callable[[Record], bool]


# ---- records


def job_text(job_id: str, sections: Mapping[str, Mapping[str, object]] | None = None) -> str:
    """A linreg job file with the given sections."""
    return harness.job_text(job_id, **(sections or {}))


def stamp(record: Record) -> float:
    """The wall-clock seconds of a daemon log record (its ``time``)."""
    return float(record["time"])


def read_events(path: Path) -> list[Record]:
    """The worker events of one attempt (malformed lines skipped; none yet: empty)."""
    return harness.read_records(path)


def first_time(events: list[Record], kind: str) -> float | None:
    """The ``time`` of the first event of ``kind``."""
    return next((e["time"] for e in events if e.get("event") == kind), None)


def last_time(events: list[Record], kinds: tuple[str, ...]) -> float | None:
    """The ``time`` of the last event of one of ``kinds``."""
    times = [e["time"] for e in events if e.get("event") in kinds]
    return times[-1] if times else None


def need(value: float | None, job: str, what: str) -> float:
    """``value``, which a run must have produced."""
    if value is None:
        raise RuntimeError(f"{job}: no {what} event")
    return value


def is_event(name: str, **fields: object) -> Match:
    """A predicate on a record's ``event`` and fields."""
    return lambda r: r.get("event") == name and all(r.get(k) == v for k, v in fields.items())


def transition_to(job: str, *targets: str) -> Match:
    """A predicate for ``job.transition`` of ``job`` into one of ``targets``."""
    return lambda r: (
        r.get("event") == "job.transition" and r.get("job") == job and r.get("to") in targets
    )


class JsonLines:
    """An incremental reader of a JSON-lines file another process appends to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.rest = b""
        self.records: list[Record] = []

    def poll(self) -> None:
        """Read the complete lines appended since the last poll."""
        try:
            with self.path.open("rb") as stream:
                stream.seek(self.offset)
                data = stream.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        *lines, self.rest = (self.rest + data).split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError):
                self.records.append(json.loads(line))


# ---- the daemon


class Wardend(harness.Wardend):
    """One wardend process on its own root, and readers of its log and incident records."""

    def __init__(self, root: Path, cache: Path, *extra: str) -> None:
        super().__init__(root, cache, *extra, rescan_interval=RESCAN_INTERVAL_S)
        self.log = JsonLines(root / "wardend.log")
        self.incidents = JsonLines(root / "incidents.jsonl")

    def start(self, timeout: float | None = None) -> Self:
        """Start the daemon and wait for it to answer and for its ``wardend.ready`` line."""
        super().start(timeout)
        self.wait_for(self.log, is_event("wardend.ready"), timeout or self.start_timeout_s)
        return self

    def wait_for(self, stream: JsonLines, match: Match, timeout: float = 120) -> Record:
        """The first record of ``stream`` that matches, polling until ``timeout``."""
        deadline = time.monotonic() + timeout
        checked = 0
        while True:
            stream.poll()
            for record in stream.records[checked:]:
                if match(record):
                    return record
            checked = len(stream.records)
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"wardend exited with status {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no matching record in {stream.path.name}")
            time.sleep(POLL_S)

    def drop_timed(self, name: str, text: str) -> float:
        """`drop` (in spool/tmp, renamed into spool/incoming); returns the time right after."""
        self.drop(name, text)
        return time.time()

    def write_incoming(self, name: str, text: str) -> float:
        """Write the request directly in spool/incoming (one write, then close)."""
        fd = os.open(
            self.root / "spool" / "incoming" / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600
        )
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        return time.time()


@contextlib.contextmanager
def running(root: Path, cache: Path, *extra: str) -> Iterator[Wardend]:
    """A started daemon, stopped (SIGTERM) on the way out."""
    daemon = Wardend(root, cache, *extra)
    try:
        yield daemon.start()
    finally:
        daemon.stop()


def wait_exit(pid: int, timeout: float) -> float | None:
    """When process ``pid`` exits, seen through a pidfd; None if it was already gone."""
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return None
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        return time.time() if ready else None
    finally:
        os.close(fd)


def clear_folder(folder: Path) -> int:
    """Remove everything inside ``folder`` (keeping it and its mode); returns entries removed."""
    removed = 0
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
        removed += 1
    return removed


def count_files(folder: Path) -> int:
    """Files under ``folder``."""
    return sum(len(files) for _, _, files in os.walk(folder))
