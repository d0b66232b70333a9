"""Spool intake: watch ``spool/incoming``, claim each request by rename, validate it.

Writers follow the Maildir discipline: create in ``spool/tmp/``, rename into
``spool/incoming/``.  watchdog (inotify) reports files moved in or closed
after writing; its callback only hands the path to the daemon's loop.  A
rescan at start and at a slow interval catches missed events and inotify
overflow.  A request is claimed by an atomic rename into ``spool/claimed/``,
so two scans never process it twice; it then becomes a job folder or is moved
to ``spool/rejected/`` beside an error file listing every problem.  Nothing is
deleted, nothing is silently fixed.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from jobwarden.checkpoint.atomic import write_text_atomic
from jobwarden.daemon.layout import Root
from jobwarden.errors import JobFileError
from jobwarden.jobfile import MAX_JOB_FILE_BYTES, Job, format_of, job_from_bytes

log = structlog.get_logger("wardend.spool")


@dataclass(frozen=True)
class Rejection:
    """A refused request: where it was moved and why."""

    name: str
    kept_at: Path
    problems: list[str]


class SpoolHandler(FileSystemEventHandler):
    """watchdog callbacks: hand paths to the loop, nothing else (an exception here kills the
    observer thread)."""

    def __init__(self, incoming: Path, enqueue: Callable[[Path], None]) -> None:
        self.incoming = incoming
        self.enqueue = enqueue

    def on_moved(self, event: FileSystemEvent) -> None:
        """A file renamed into incoming."""
        dest = Path(os.fsdecode(event.dest_path))
        if dest.parent == self.incoming:
            self.enqueue(dest)

    def on_closed(self, event: FileSystemEvent) -> None:
        """A file closed after writing directly in incoming."""
        path = Path(os.fsdecode(event.src_path))
        if path.parent == self.incoming:
            self.enqueue(path)


def watch(root: Root, enqueue: Callable[[Path], None]) -> Any:
    """Start a watchdog observer on ``spool/incoming``; returns it (call ``.stop()``)."""
    observer = Observer()
    observer.schedule(SpoolHandler(root.incoming, enqueue), str(root.incoming), recursive=False)
    observer.daemon = True
    observer.start()
    return observer


def pending_requests(root: Root) -> list[Path]:
    """Requests waiting in incoming and leftovers in claimed, oldest first."""
    found = []
    for folder in (root.claimed, root.incoming):
        for entry in os.scandir(folder):
            if not entry.name.startswith("."):
                found.append((entry.stat(follow_symlinks=False).st_mtime_ns, Path(entry.path)))
    return [path for _, path in sorted(found)]


class Spool:
    """Claims and validates requests; `take` returns a Job or a Rejection."""

    def __init__(self, root: Root, known: Callable[[str], bool]) -> None:
        self.root = root
        self.known = known

    def take(self, path: Path) -> Job | Rejection | None:
        """Claim ``path`` and validate it; None if someone else claimed it first."""
        if path.name.startswith("."):
            return None
        if path.parent == self.root.claimed:
            claimed = path
        else:
            claimed = self.root.claimed / f"{time.time_ns()}.{path.name}"
            try:
                os.rename(path, claimed)
            except FileNotFoundError:
                return None
        name = path.name if path.parent != self.root.claimed else path.name.split(".", 1)[-1]
        problems, job = self._validate(claimed, name)
        if job is not None:
            return self._accept(claimed, job)
        return self._reject(claimed, name, problems)

    def _validate(self, claimed: Path, name: str) -> tuple[list[str], Job | None]:
        info = os.lstat(claimed)
        if stat.S_ISLNK(info.st_mode):
            return ["not a regular file: a symbolic link (requests must be regular files)"], None
        if not stat.S_ISREG(info.st_mode):
            return [f"not a regular file (mode {stat.filemode(info.st_mode)})"], None
        if info.st_size > MAX_JOB_FILE_BYTES:
            return [f"file is {info.st_size} bytes, over the {MAX_JOB_FILE_BYTES}-byte limit"], None
        fd = os.open(claimed, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            raw = os.read(fd, MAX_JOB_FILE_BYTES + 1)
        finally:
            os.close(fd)
        try:
            job = job_from_bytes(raw, name, format_of(Path(name)))
        except JobFileError as error:
            return error.problems, None
        if self.known(job.id) or self.root.job(job.id).exists():
            return [f"id: duplicate job id {job.id!r}: a job with this id already exists"], None
        return [], job

    def _accept(self, claimed: Path, job: Job) -> Job:
        folder = self.root.job(job.id)
        folder.mkdir()
        os.rename(claimed, folder / f"request{claimed.suffix or '.toml'}")
        write_text_atomic(folder / "job.json", json.dumps(job.to_record(), indent=2) + "\n")
        return job

    def _reject(self, claimed: Path, name: str, problems: list[str]) -> Rejection:
        target = self.root.rejected / name
        suffix = 1
        while target.exists() or target.is_symlink():
            target = self.root.rejected / f"{name}.{suffix}"
            suffix += 1
        os.rename(claimed, target)
        record = {"file": target.name, "received": time.time(), "problems": problems}
        write_text_atomic(
            target.with_name(target.name + ".error.json"), json.dumps(record, indent=2) + "\n"
        )
        log.warning("spool.rejected", file=name, kept_at=str(target), problems=problems)
        return Rejection(name, target, problems)
