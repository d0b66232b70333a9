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

from jobwarden.daemon.layout import Root
from jobwarden.errors import JobFileError
from jobwarden.files import write_text_atomic
from jobwarden.jobfile import MAX_JOB_FILE_BYTES, Job, format_of, job_from_bytes

log = structlog.get_logger("wardend.spool")
RESCAN_SETTLE_S = 1.0


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
    """Start a watchdog observer on the whole spool; returns it (call ``.stop()``).

    The whole spool is watched, not only ``incoming``, so that every rename the
    spool sees (tmp -> incoming by writers, incoming -> claimed -> rejected by
    the daemon) has both halves inside the watch.  watchdog holds a rename
    whose other half it never sees for half a second to pair it, and every
    later event waits behind it; accepted requests therefore leave the spool
    by link and unlink, not by rename.  A file renamed in from outside the
    spool is only an unpaired "created" event, indistinguishable from a file
    still being written: the rescan picks it up.
    """
    observer = Observer()
    observer.schedule(
        SpoolHandler(root.incoming, enqueue), str(root.incoming.parent), recursive=True
    )
    observer.daemon = True
    observer.start()
    return observer


def pending_requests(root: Root, settle_s: float = RESCAN_SETTLE_S) -> list[Path]:
    """Requests waiting in incoming and leftovers in claimed, oldest first.

    A file in incoming modified less than ``settle_s`` ago is left for its
    watch event or the next scan: it may still be being written by a writer
    that ignores the tmp-then-rename discipline.
    """
    found = []
    now = time.time_ns()
    for folder in (root.claimed, root.incoming):
        for entry in os.scandir(folder):
            if entry.name.startswith("."):
                continue
            mtime = entry.stat(follow_symlinks=False).st_mtime_ns
            if folder == root.incoming and now - mtime < settle_s * 1e9:
                continue
            found.append((mtime, Path(entry.path)))
    return [path for _, path in sorted(found)]


ALREADY_ACCEPTED = "already accepted"


def _same_file(claimed: Path, folder: Path) -> bool:
    """Whether a claimed file is the request a job folder already holds (a crash between
    the accepting link and unlink)."""
    mine = os.lstat(claimed)
    for request in folder.glob("request.*"):
        theirs = os.lstat(request)
        if (theirs.st_dev, theirs.st_ino) == (mine.st_dev, mine.st_ino):
            return True
    return False


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
        if problems == [ALREADY_ACCEPTED]:
            claimed.unlink()
            return None
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
            if _same_file(claimed, self.root.job(job.id)):
                return [ALREADY_ACCEPTED], None
            return [f"id: duplicate job id {job.id!r}: a job with this id already exists"], None
        return [], job

    def _accept(self, claimed: Path, job: Job) -> Job:
        folder = self.root.job(job.id)
        folder.mkdir()
        os.link(claimed, folder / f"request{claimed.suffix or '.toml'}")
        claimed.unlink()
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
