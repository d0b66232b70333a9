"""Durable, link-safe file primitives: the one audited way to open, create, rename and lock.

Every open passes ``O_NOFOLLOW`` and ``O_CLOEXEC`` and what was opened is
checked with ``fstat`` (its type; its owner, and a directory's mode, where the
caller asks for privacy).  A directory to be written is opened once,
``O_DIRECTORY | O_NOFOLLOW``, as a `Directory`, and every operation inside it
is relative to that descriptor, so a component swapped for a link after the
check changes nothing.  Pending files are created ``O_EXCL`` after unlinking a
stale leftover (unlink never follows), so a planted link at a pending name is
replaced, never written through.

Atomic commit: write a pending sibling, fsync, rename it into place, fsync the
directory.  A reader sees the old complete file or the new one; once `commit`
returns the new file survives a crash of the machine.  A leftover ``.pending``
file is never a committed file.  And `pid_lock`, the flock of the root lock.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobwarden.errors import IncidentKind, JobwardenError

# Larger single writes are split: Linux writes at most about 2 GiB per call.
WRITE_CHUNK = 1 << 30

PENDING_SUFFIX = ".pending"
FILE_MODE = 0o600
DIRECTORY_MODE = 0o700
# Group- or world-writable: someone other than the owner could add, remove or swap entries.
LOOSE_BITS = stat.S_IWGRP | stat.S_IWOTH
# Times a pending name is unlinked and created again before giving up on a racing planter.
EXCLUSIVE_ATTEMPTS = 3

DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK so that opening a planted FIFO cannot hang; it changes nothing for regular files.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
# What a commit writes: buffers, or a function writing the new empty file and giving its size.
Payload = list[memoryview] | Callable[[int], int]


class UnsafePathError(JobwardenError):
    """Raised when a path to write, lock or read is a link, of the wrong type, not ours,
    or writable by others; ``reason`` says which, ``found``, ``owner`` and ``mode`` what is there.
    """

    code = "path.unsafe"
    exit_status = 5
    incident = IncidentKind.UNSAFE_PATH

    def __init__(self, path: str, reason: str, **evidence: Any) -> None:
        super().__init__(f"{path}: {reason}", path=path, reason=reason, **evidence)
        self.path = path
        self.reason = reason


FILE_KINDS = (
    (stat.S_ISREG, "regular file"),
    (stat.S_ISDIR, "directory"),
    (stat.S_ISLNK, "symbolic link"),
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISSOCK, "socket"),
)


def kind_of(mode: int) -> str:
    """The file type of an ``st_mode``, as a word for messages."""
    return next((word for test, word in FILE_KINDS if test(mode)), "device")


def _facts(info: os.stat_result) -> dict[str, Any]:
    return {
        "found": kind_of(info.st_mode),
        "owner": info.st_uid,
        "mode": f"{stat.S_IMODE(info.st_mode):04o}",
    }


def _problem(info: os.stat_result, want_dir: bool, private: bool) -> str | None:
    """Why what was opened is refused, or None when it is acceptable.

    A private directory must be ours and closed to writers other than us; a
    private file must be ours (its mode matters less: only we can reach it).
    """
    wanted = stat.S_ISDIR if want_dir else stat.S_ISREG
    if not wanted(info.st_mode):
        return f"is a {kind_of(info.st_mode)}, expected a {'directory' if want_dir else 'file'}"
    if private and info.st_uid != os.getuid():
        return f"is owned by uid {info.st_uid}, not by uid {os.getuid()} that runs this process"
    if private and want_dir and info.st_mode & LOOSE_BITS:
        return (
            f"has mode {stat.S_IMODE(info.st_mode):04o}: group or others may write it "
            "(expected no group or world write, e.g. 0700)"
        )
    return None


def _refuse_link(
    error: type[UnsafePathError], shown: str, name: str | Path, dir_fd: int | None
) -> UnsafePathError:
    """The error for an open that hit a link or a non-directory (ELOOP, ENOTDIR)."""
    try:
        info = os.lstat(name, dir_fd=dir_fd)
    except OSError:
        return error(shown, "changed while it was opened", expected="no symbolic link")
    if stat.S_ISLNK(info.st_mode):
        target = os.readlink(name, dir_fd=dir_fd)
        return error(
            shown,
            f"is a symbolic link (to {target}); refusing to follow it",
            target=target,
            expected="no symbolic link",
            **_facts(info),
        )
    return error(shown, f"is a {kind_of(info.st_mode)}", expected="directory", **_facts(info))


class Directory:
    """A directory opened once, ``O_DIRECTORY | O_NOFOLLOW``; every operation is relative to it.

    ``private`` directories (checkpoint directories and their quarantine) must be
    ours and closed to other writers, and every file read from them ours.  Refusals
    raise ``error``, an `UnsafePathError` class, so each caller has its own code.
    """

    def __init__(self, path: Path, fd: int, private: bool, error: type[UnsafePathError]) -> None:
        self.path = path
        self.fd = fd
        self.private = private
        self.error = error

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        create: bool = False,
        private: bool = False,
        error: type[UnsafePathError] = UnsafePathError,
    ) -> Directory:
        """Open ``path`` (its last component never followed); ``create`` makes it mode 0700."""
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        return _open_directory(path, path, None, create=create, private=private, error=error)

    def child(self, name: str, *, create: bool = False) -> Directory:
        """The subdirectory ``name``, held to the same rules; ``create`` makes it mode 0700."""
        shown = self.path / name
        return _open_directory(
            shown, name, self.fd, create=create, private=self.private, error=self.error
        )

    def still_at_path(self) -> bool:
        """Whether ``path`` (not followed) still names the directory this descriptor holds."""
        try:
            return _same_file(os.fstat(self.fd), os.lstat(self.path))
        except (FileNotFoundError, NotADirectoryError):
            return False

    def entries(self) -> list[os.DirEntry[str]]:
        """The directory's entries (``entry.name`` only; ``entry.path`` is the bare name too)."""
        with os.scandir(self.fd) as scan:
            return list(scan)

    def lexists(self, name: str) -> bool:
        """Whether anything, a dangling link included, is at ``name``."""
        try:
            os.lstat(name, dir_fd=self.fd)
        except FileNotFoundError:
            return False
        return True

    def open_file(self, name: str, flags: int = READ_FLAGS, mode: int = FILE_MODE) -> int:
        """Open the regular file ``name`` with ``flags`` (plus ``O_NOFOLLOW``), never through
        a link; it must be ours if the directory is private or the open may create it."""
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self.fd)
        except OSError as failure:
            if failure.errno == errno.ELOOP:
                raise _refuse_link(self.error, str(self.path / name), name, self.fd) from failure
            raise
        self.check_file(fd, name, private=self.private or bool(flags & os.O_CREAT))
        return fd

    def read_small(self, name: str, limit: int = 1 << 20) -> bytes:
        """The bytes of a small regular file (a record, a key), at most ``limit``."""
        fd = self.open_file(name)
        try:
            return os.pread(fd, limit, 0)
        finally:
            os.close(fd)

    def check_file(self, fd: int, name: str, private: bool) -> None:
        """Unless ``fd`` is a regular file (ours if ``private``), close it and refuse it."""
        info = os.fstat(fd)
        problem = _problem(info, want_dir=False, private=private)
        if problem is not None:
            os.close(fd)
            shown = str(self.path / name)
            raise self.error(shown, problem, expected="a regular file", **_facts(info))

    def create_exclusive(self, name: str, mode: int = FILE_MODE) -> int:
        """Create ``name`` afresh (``O_EXCL``), unlinking a stale leftover first; returns the fd.

        The leftover is unlinked, never opened, so a planted link is removed
        rather than followed; a name that keeps reappearing is refused.
        """
        for _ in range(EXCLUSIVE_ATTEMPTS):
            self.unlink(name, missing_ok=True)
            try:
                return self.open_file(name, CREATE_FLAGS, mode)
            except FileExistsError:
                continue
        raise self.error(str(self.path / name), "reappears between unlink and exclusive create")

    def commit(
        self,
        name: str,
        buffers: Payload,
        before_replace: Callable[[Path], None] | None = None,
        mode: int = FILE_MODE,
    ) -> int:
        """Durably write ``buffers`` as ``name`` (pending, fsync, rename, fsync); returns bytes.

        ``before_replace`` runs after the pending file is durable and before it
        is selected; the crash-in-commit drill and the writer's fencing check use it.
        """
        pending = name + PENDING_SUFFIX
        fd = self.create_exclusive(pending, mode)
        try:
            written = buffers(fd) if callable(buffers) else write_all(fd, buffers)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            self.unlink(pending, missing_ok=True)
            raise
        os.close(fd)
        if before_replace is not None:
            before_replace(self.path / pending)
        os.replace(pending, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)  # replaces a link
        self.fsync()
        return written

    def write_atomic(self, name: str, data: bytes, mode: int = FILE_MODE) -> None:
        """Durably replace the small file ``name`` with ``data``."""
        self.commit(name, [memoryview(data)], mode=mode)

    def move_to(self, name: str, other: Directory, target: str) -> None:
        """Rename ``name`` unchanged into directory ``other`` as ``target``."""
        os.rename(name, target, src_dir_fd=self.fd, dst_dir_fd=other.fd)

    def unlink(self, name: str, missing_ok: bool = False) -> None:
        """Remove the entry ``name`` (a link itself, never its target)."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def try_lock(self) -> bool:
        """Take ``flock(LOCK_EX)`` on the directory itself without waiting; False if held.

        The lock is on the directory's inode: no file deleted inside can hand it on.
        """
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def fsync(self) -> None:
        """fsync the directory so a rename or unlink in it is durable."""
        os.fsync(self.fd)

    def close(self) -> None:
        """Close the descriptor (dropping a lock taken on it)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Directory:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def pending_path(final: Path) -> Path:
    """The sibling a commit of ``final`` writes before it is replaced into place."""
    return final.with_name(final.name + PENDING_SUFFIX)


def fsync_dir(directory: Path) -> None:
    """fsync a directory so a rename or unlink in it is durable."""
    fd = os.open(directory, DIRECTORY_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(
    final: Path,
    buffers: list[memoryview],
    before_replace: Callable[[Path], None] | None = None,
    mode: int = FILE_MODE,
) -> int:
    """Durably write ``buffers`` as ``final``, created with ``mode``; returns the bytes written.

    The parent directory is opened without following a link and everything
    happens relative to it; see `Directory.commit`.
    """
    with Directory.open(final.parent) as directory:
        return directory.commit(final.name, buffers, before_replace, mode)


def write_text_atomic(final: Path, text: str, mode: int = FILE_MODE) -> None:
    """Durably replace a small text file (state records, reason files)."""
    commit(final, [memoryview(text.encode())], mode=mode)


def write_all(fd: int, buffers: list[memoryview]) -> int:
    """Write every buffer to ``fd``, looping over partial writes; returns the byte count."""
    for view in buffers:
        position = 0
        while position < len(view):
            position += os.write(fd, view[position : position + WRITE_CHUNK])
    return sum(len(view) for view in buffers)


def pid_lock(path: Path) -> tuple[int | None, int | None]:
    """Take ``flock(LOCK_EX)`` on ``path`` without waiting and write our pid into it.

    Returns (fd, None) when taken, the caller keeping the fd open for as long
    as it holds the lock; or (None, the holder's pid if readable) when another
    process holds it.  The file is opened without following a link, must be a
    regular file of ours, and after locking must still be the file at ``path``
    (else it was replaced under us and is locked again).
    """
    with Directory.open(path.parent) as directory:
        for _ in range(EXCLUSIVE_ATTEMPTS):
            fd = directory.open_file(path.name, LOCK_FLAGS)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                os.close(fd)
                return None, int(holder) if holder.isdigit() else None
            if directory.lexists(path.name) and _same_file(
                os.fstat(fd), os.lstat(path.name, dir_fd=directory.fd)
            ):  # not unlinked or replaced between our open and our flock
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                return fd, None
            os.close(fd)
    raise UnsafePathError(str(path), "was replaced every time it was locked")


def _same_file(one: os.stat_result, other: os.stat_result) -> bool:
    return (one.st_dev, one.st_ino) == (other.st_dev, other.st_ino)


def _open_directory(
    shown: Path,
    name: str | Path,
    dir_fd: int | None,
    *,
    create: bool,
    private: bool,
    error: type[UnsafePathError],
) -> Directory:
    """Open (after creating, mode 0700, if asked) a directory without following a link."""
    if create:
        try:
            os.mkdir(name, DIRECTORY_MODE, dir_fd=dir_fd)
        except FileExistsError:
            pass
        else:
            os.fsync(dir_fd) if dir_fd is not None else fsync_dir(shown.parent)
    try:
        fd = os.open(name, DIRECTORY_FLAGS, dir_fd=dir_fd)
    except OSError as failure:
        if failure.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refuse_link(error, str(shown), name, dir_fd) from failure
        raise
    info = os.fstat(fd)
    problem = _problem(info, want_dir=True, private=private)
    if problem is not None:
        os.close(fd)
        raise error(str(shown), problem, expected="a directory we own, mode 0700", **_facts(info))
    return Directory(shown, fd, private, error)
