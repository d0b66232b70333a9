"""Spool intake: watch ``spool/incoming``, claim each request by rename, validate it.

Writers follow the Maildir discipline: create in ``spool/tmp/``, rename into
``spool/incoming/``.  watchdog (inotify) reports files moved in or closed
after writing; its callback only hands the path to the daemon's loop.  A
rescan at start and at a slow interval catches missed events and inotify
overflow.  A request is claimed by an atomic rename into ``spool/claimed/``,
so two scans never process it twice; it then becomes a job folder or is moved
to ``spool/rejected/`` beside an error file listing every problem.  Nothing is
deleted, nothing is silently fixed.

Crash safety: a request leaves the spool only once its job folder is durable
(`jobwarden.daemon.store.jobs.create_folder`), and a rejected request only once its
error file is; a request found in ``spool/claimed`` at start is taken again,
and recognised when its job folder was already made from it.  The kept request
is the daemon's own copy of the bytes it validated, never a link to the
writer's file, so nothing outside can edit it afterwards.

Nothing a writer puts in the spool escapes as an exception: a name that is
too long to claim, not UTF-8 or holding control characters, and any failure
while validating, is a rejection with its error file.
"""

from __future__ import annotations

import hashlib
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

from jobwarden.daemon.store import jobs
from jobwarden.daemon.store.layout import Root
from jobwarden.errors import JobFileError
from jobwarden.files import UnsafePathError, write_all, write_text_atomic
from jobwarden.jobfile import MAX_JOB_FILE_BYTES, Job, format_of, job_from_bytes

log = structlog.get_logger("wardend.spool")
RESCAN_SETTLE_S = 1.0
NAME_MAX = 255
STAMP_DIGITS = 19  # time.time_ns() until the year 2286
MAX_NAME_BYTES = NAME_MAX - STAMP_DIGITS - 1
"""The longest request name: the claim renames it to ``<stamp>.<name>`` within NAME_MAX."""
ERROR_SUFFIX = ".error.json"


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
        self._hand_over(event.dest_path)

    def on_closed(self, event: FileSystemEvent) -> None:
        """A file closed after writing directly in incoming."""
        self._hand_over(event.src_path)

    def _hand_over(self, raw: str | bytes) -> None:
        try:
            path = Path(os.fsdecode(raw))
            if path.parent == self.incoming:
                self.enqueue(path)
        except Exception as error:  # the rescan catches what is missed here
            log.error("spool.watch_failed", error=repr(error), exc_info=error)


def watch(root: Root, enqueue: Callable[[Path], None]) -> Any:
    """Start a watchdog observer on the whole spool; returns it (call ``.stop()``).

    The whole spool is watched, not only ``incoming``, so that every rename the
    spool sees (tmp -> incoming by writers, incoming -> claimed -> rejected by
    the daemon) has both halves inside the watch.  watchdog holds a rename
    whose other half it never sees for half a second to pair it, and every
    later event waits behind it; accepted requests therefore leave the spool
    by unlink (their job folder holds the daemon's copy), not by rename.  A
    file renamed in from outside the spool is only an unpaired "created"
    event, indistinguishable from a file still being written: the rescan
    picks it up.
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
    that ignores the tmp-then-rename discipline.  A file gone while listed is
    skipped.
    """
    found = []
    now = time.time_ns()
    for folder in (root.claimed, root.incoming):
        for entry in os.scandir(folder):
            if entry.name.startswith("."):
                continue
            try:
                mtime = entry.stat(follow_symlinks=False).st_mtime_ns
            except OSError:
                continue
            if folder == root.incoming and now - mtime < settle_s * 1e9:
                continue
            found.append((mtime, Path(entry.path)))
    return [path for _, path in sorted(found)]


ALREADY_ACCEPTED = "already accepted"


def name_problems(name: str) -> list[str]:
    """What makes a request's file name unusable (empty when it is fine)."""
    raw = os.fsencode(name)
    problems = []
    if len(raw) > MAX_NAME_BYTES:
        problems.append(
            f"name: {len(raw)} bytes, over the {MAX_NAME_BYTES}-byte limit "
            f"(the claim prefixes a {STAMP_DIGITS + 1}-byte stamp within NAME_MAX = {NAME_MAX})"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        problems.append(f"name: not UTF-8 text (byte {raw[error.start]:#04x} at {error.start})")
        text = name
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        problems.append("name: holds control characters")
    return problems


def printable(name: str) -> str:
    """``name`` as text safe to log and show: undecodable bytes and control characters escaped."""
    text = os.fsencode(name).decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def safe_name(name: str) -> str:
    """A short, printable name unique to ``name``, to keep a request with an unusable name."""
    raw = os.fsencode(name)
    stem = "".join(
        c if (c.isascii() and c.isalnum()) or c in "._-" else "_" for c in printable(name)
    )
    return f"badname-{hashlib.sha256(raw).hexdigest()[:16]}-{stem[:64].lstrip('.')}"


def original_name(claimed: str) -> str:
    """The name a claimed file arrived under: ``<stamp>.<name>`` without its stamp."""
    stamp, dot, rest = claimed.partition(".")
    return rest if dot and stamp.isdigit() and rest else claimed


class Spool:
    """Claims and validates requests; `take` returns a Job or a Rejection.

    Not thread-safe: the daemon calls it from one intake thread only.
    """

    def __init__(
        self,
        root: Root,
        known: Callable[[str], bool],
        refusal: Callable[[Job], str | None] | None = None,
    ) -> None:
        self.root = root
        self.known = known
        self.refusal = refusal
        """Why the daemon could not run a valid job (its sandbox blocks what the job needs,
        `jobwarden.daemon.sandbox.job_refusal`), or None: such a job is rejected here
        rather than failing at run time."""
        self._stamp = 0
        self._next_suffix: dict[str, int] = {}
        self.accepted: dict[str, jobs.JobRecord] = {}
        """The record of each job `take` made durable, until the loop adopts it (`adopted`):
        the job goes on in memory as it was validated, never read back from its folder."""
        self.rejected = count_rejected(root)
        """Error files in spool/rejected: counted once here, then kept by `_reject` (the loop
        only reads it)."""

    def adopted(self, job: Job) -> jobs.JobRecord:
        """The record `take` made for ``job``, handed over once (on the loop, once durable)."""
        return self.accepted.pop(job.id)

    def take(self, path: Path) -> Job | Rejection | None:
        """Claim ``path`` and validate it; its job folder or its rejection is durable on return.

        None if someone else claimed it first, if it is a dotfile, or if it is a
        claimed leftover whose job folder was already made from it.  Raises
        OSError for a file system failure (the request stays in the spool and is
        tried again at the next scan).
        """
        if path.name.startswith("."):
            return None
        name = original_name(path.name) if path.parent == self.root.claimed else path.name
        problems = name_problems(name)
        if problems:
            return self._reject(path, name, problems)
        if path.parent == self.root.claimed:
            claimed = path
        else:
            self._stamp = max(time.time_ns(), self._stamp + 1)
            claimed = self.root.claimed / f"{self._stamp}.{name}"
            try:
                os.rename(path, claimed)
            except FileNotFoundError:
                return None
        try:
            problems, verdict = self._validate(claimed, name)
        except OSError:
            raise
        except Exception as error:  # whatever a request does, it ends as a rejection
            log.error("spool.validation_failed", file=printable(name), exc_info=error)
            problems, verdict = [f"validation failed: {type(error).__name__}: {error!s:.200}"], None
        if problems == [ALREADY_ACCEPTED]:
            return self._made_already(claimed, verdict[0] if verdict else None)
        if verdict is not None:
            job, raw = verdict
            try:
                record = jobs.create_folder(
                    self.root,
                    job,
                    raw,
                    claimed.suffix or ".toml",
                    claim=claimed.name,
                    request_name=name,
                )
            except UnsafePathError as error:  # a link at its staging folder: refused, kept
                return self._reject(claimed, name, [f"unsafe path: {error.message}"])
            claimed.unlink()
            self.accepted[job.id] = record
            return job
        return self._reject(claimed, name, problems)

    def _made_already(self, claimed: Path, job: Job | None) -> Job | None:
        """A claimed file whose job folder was made from it: the job if the daemon has not
        adopted it yet (the take that made the folder failed after it, out of descriptors,
        say), None if it has or is about to (a crash after the folder was made, a second
        claimed copy); the file goes either way."""
        if job is None or self.known(job.id) or job.id in self.accepted:
            claimed.unlink()
            return None
        record = jobs.read_folder(self.root.job(job.id))
        claimed.unlink()
        self.accepted[job.id] = record
        return job

    def _validate(self, claimed: Path, name: str) -> tuple[list[str], tuple[Job, bytes] | None]:
        info = os.lstat(claimed)
        if stat.S_ISLNK(info.st_mode):
            return ["not a regular file: a symbolic link (requests must be regular files)"], None
        if not stat.S_ISREG(info.st_mode):
            return [f"not a regular file (mode {stat.filemode(info.st_mode)})"], None
        if info.st_size > MAX_JOB_FILE_BYTES:
            return [f"file is {info.st_size} bytes, over the {MAX_JOB_FILE_BYTES}-byte limit"], None
        fd = os.open(claimed, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            opened = os.fstat(fd)
            if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
                return ["the file was replaced while it was being read"], None
            raw = os.read(fd, MAX_JOB_FILE_BYTES + 1)
        finally:
            os.close(fd)
        try:
            job = job_from_bytes(raw, name, format_of(Path(name)))
        except JobFileError as error:
            return error.problems, None
        folder = self.root.job(job.id)
        if self.known(job.id) or os.path.lexists(folder):
            if jobs.holds_request(folder, claimed):
                return [ALREADY_ACCEPTED], (job, raw)
            return [f"id: duplicate job id {job.id!r}: a job with this id already exists"], None
        if self.refusal is not None and (refused := self.refusal(job)) is not None:
            return [refused], None
        return [], (job, raw)

    def _reject(self, source: Path, name: str, problems: list[str]) -> Rejection | None:
        """Write the error file, then move the request beside it (so either it is still in
        the spool, or it is rejected with its error file)."""
        try:
            links = os.lstat(source).st_nlink
        except FileNotFoundError:
            return None
        kept = name if not name_problems(name) else safe_name(name)
        target = self._target(kept, printable(source.name))
        error_file = target.with_name(target.name + ERROR_SUFFIX)
        record = {
            "file": target.name,
            "submitted_as": printable(name),
            "claimed_as": printable(source.name),
            "links": links,
            "received": time.time(),
            "problems": problems,
        }
        counted = not os.path.lexists(error_file)  # one left by a crash is counted already
        write_text_atomic(error_file, json.dumps(record, indent=2) + "\n")
        try:
            os.rename(source, target)
        except FileNotFoundError:
            error_file.unlink(missing_ok=True)
            if not counted:
                self.rejected -= 1  # the crash's error file, gone with its request
            return None
        if counted:
            self.rejected += 1
        log.warning("spool.rejected", file=printable(name), kept_at=str(target), problems=problems)
        return Rejection(name, target, problems)

    def _target(self, name: str, claimed_as: str) -> Path:
        """A free name in rejected/: ``name``, else ``name.1``, ``name.2``...

        Taken means the file or its error file exists, unless that error file
        describes this same claimed file (a crash between writing it and the move).
        """
        suffix = self._next_suffix.get(name, 0)
        while True:
            target = self.root.rejected / (f"{name}.{suffix}" if suffix else name)
            error_file = target.with_name(target.name + ERROR_SUFFIX)
            if not os.path.lexists(target) and (
                not os.path.lexists(error_file) or _describes(error_file, claimed_as)
            ):
                if len(self._next_suffix) > 10_000:
                    self._next_suffix.clear()
                self._next_suffix[name] = suffix + 1
                return target
            suffix += 1


def count_rejected(root: Root) -> int:
    """The error files in spool/rejected (0 when it cannot be listed)."""
    try:
        with os.scandir(root.rejected) as entries:
            return sum(entry.name.endswith(ERROR_SUFFIX) for entry in entries)
    except OSError:
        return 0


def _describes(error_file: Path, claimed_as: str) -> bool:
    try:
        record = json.loads(error_file.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("claimed_as") == claimed_as


def drop(root: Root, name: str, data: bytes) -> Path:
    """Put a request into the spool the Maildir way; returns its path in incoming.

    Written under a unique name in spool/tmp, fsynced, renamed into incoming.
    On any failure the file in spool/tmp is removed: nothing is left behind.
    """
    unique = f"{time.time_ns()}-{name}"
    tmp = root.spool_tmp / unique
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            write_all(fd, [memoryview(data)])
            os.fsync(fd)
        finally:
            os.close(fd)
        target = root.incoming / unique
        os.rename(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target
