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
(`jobwarden.daemon.store.staging`), and a rejected request only once its
error file is (requests taken together share the waiting: their job folders
are made durable as one group, each before its own request leaves); a request
found in ``spool/claimed`` at start is taken again, and recognised when its
job folder was already made from it.  The kept request
is the daemon's own copy of the bytes it validated, never a link to the
writer's file, so nothing outside can edit it afterwards.

Nothing a writer puts in the spool escapes as an exception: a name that is
too long to claim, not UTF-8 or holding control characters, and any failure
while validating, is a rejection with its error file.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from jobwarden.daemon.intake.names import name_problems, original_name, printable, safe_name
from jobwarden.daemon.store import jobs, staging
from jobwarden.daemon.store.layout import Root
from jobwarden.errors import JobFileError
from jobwarden.files import UnsafePathError, write_all, write_text_atomic
from jobwarden.jobfile import MAX_JOB_FILE_BYTES, Job, format_of, job_from_bytes

log = structlog.get_logger("wardend.spool")
ERROR_SUFFIX = ".error.json"


@dataclass(frozen=True)
class Rejection:
    """A refused request: where it was moved and why."""

    name: str
    kept_at: Path
    problems: list[str]


ALREADY_ACCEPTED = "already accepted"


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
        [outcome] = self.take_all([path])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def take_all(self, paths: list[Path]) -> list[Job | Rejection | Exception | None]:
        """`take` each of ``paths`` in order, their job folders made durable as one group
        (`staging.make_durable`); for each, its outcome or the exception that stopped it.

        A request whose job id is staged already in the group waits for the group to be
        durable, and is then judged as `take` alone would judge it (a duplicate).
        """
        outcomes: list[Job | Rejection | Exception | None] = [None] * len(paths)
        group: dict[str, tuple[int, Path, Job, staging.Staged]] = {}
        for index, path in enumerate(paths):
            try:
                claimed = self._claim(path)
                if not isinstance(claimed, tuple):
                    outcomes[index] = claimed
                    continue
                verdict = self._judge(*claimed)
                if isinstance(verdict, tuple) and verdict[0].id in group:
                    self._settle(group, outcomes)
                    verdict = self._judge(*claimed)
                if isinstance(verdict, tuple):
                    staged = self._stage(*claimed, *verdict)
                    if isinstance(staged, staging.Staged):
                        group[verdict[0].id] = (index, claimed[0], verdict[0], staged)
                    else:
                        outcomes[index] = staged
                else:
                    outcomes[index] = verdict
            except Exception as error:  # noqa: BLE001 - handed back with the request's outcome
                outcomes[index] = error
        self._settle(group, outcomes)
        return outcomes

    def _claim(self, path: Path) -> tuple[Path, str] | Rejection | None:
        """The claimed path and the name the request arrived under, or its outcome already."""
        if path.name.startswith("."):
            return None
        name = original_name(path.name) if path.parent == self.root.claimed else path.name
        problems = name_problems(name)
        if problems:
            return self._reject(path, name, problems)
        if path.parent == self.root.claimed:
            return path, name
        self._stamp = max(time.time_ns(), self._stamp + 1)
        claimed = self.root.claimed / f"{self._stamp}.{name}"
        try:
            os.rename(path, claimed)
        except FileNotFoundError:
            return None
        return claimed, name

    def _judge(self, claimed: Path, name: str) -> tuple[Job, bytes] | Job | Rejection | None:
        """Validate a claimed request: its job and bytes, or its outcome already."""
        try:
            problems, verdict = self._validate(claimed, name)
        except OSError:
            raise
        except Exception as error:  # whatever a request does, it ends as a rejection
            log.error("spool.validation_failed", file=printable(name), exc_info=error)
            problems, verdict = [f"validation failed: {type(error).__name__}: {error!s:.200}"], None
        if problems == [ALREADY_ACCEPTED]:
            return self._made_already(claimed, verdict[0] if verdict else None)
        if verdict is None:
            return self._reject(claimed, name, problems)
        return verdict

    def _stage(
        self, claimed: Path, name: str, job: Job, raw: bytes
    ) -> staging.Staged | Rejection | None:
        """Write the job's folder as its staging sibling (`staging.stage`), or reject it."""
        try:
            staged = staging.stage(
                self.root,
                job,
                raw,
                claimed.suffix or ".toml",
                claim=claimed.name,
                request_name=name,
            )
        except UnsafePathError as error:  # a link at its staging folder: refused, kept
            return self._reject(claimed, name, [f"unsafe path: {error.message}"])
        return staged

    def _settle(
        self,
        group: dict[str, tuple[int, Path, Job, staging.Staged]],
        outcomes: list[Job | Rejection | Exception | None],
    ) -> None:
        """Make the group's folders durable; then, and only then, its requests leave."""
        members = list(group.values())
        group.clear()
        made = staging.make_durable(self.root, [staged for *_, staged in members])
        for (index, claimed, job, _), record in zip(members, made, strict=True):
            if isinstance(record, OSError):
                outcomes[index] = record
                continue
            try:
                claimed.unlink()
            except OSError as error:
                outcomes[index] = error
                continue
            self.accepted[job.id] = record
            outcomes[index] = job

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
