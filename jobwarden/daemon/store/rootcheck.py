"""Refusing a daemon root that someone else could plant links or files in.

wardend runs as root (or as its service user) and writes where paths under its
root lead, so anyone who can write one folder on the way can make it write,
truncate or chmod a file of their choosing.  Before the daemon trusts its root
it checks:

* every folder above the root: owned by root or by the daemon's user, and
  writable by no one else unless its sticky bit is set (as ``/tmp``'s is);
* the root and each folder the daemon uses in it: a real directory, not a
  symlink, owned by the daemon's user and writable by neither group nor others
  (a control group reaches the daemon through its socket, never the tree);
* each file it opens for writing there: opened ``O_NOFOLLOW | O_CLOEXEC``, a
  regular file with one link, owned by the daemon's user; a looser mode left by
  an older version is tightened to 0600.

Each refusal is a `RootUnsafeError` naming the path, what it is, its owner and
its mode.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import structlog

from jobwarden.files import Directory, UnsafePathError, kind_of

log = structlog.get_logger("wardend.rootcheck")

OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
PRIVATE_FILE = 0o600
PRIVATE_FOLDER = 0o700


def user_name(uid: int) -> str:
    """The user's name, or ``uid N`` when the password database has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


class RootUnsafeError(UnsafePathError):
    """Raised before the daemon uses its root when a folder on the way to it, a folder it
    uses in it, or a file it writes there could be another user's: a symlink, not a
    directory (or regular file), owned by someone else, or writable by group or others.
    ``reason`` says which; ``found``, ``owner``, ``mode`` and ``expected`` what is there
    and what should be."""

    code = "daemon.root_unsafe"
    exit_status = 77

    @classmethod
    def at(cls, path: Path, problem: str, info: os.stat_result, expected: str) -> RootUnsafeError:
        """The refusal of ``path``, described from its ``lstat`` or ``stat``."""
        mode = f"{stat.S_IMODE(info.st_mode):04o}"
        found = f"a {kind_of(info.st_mode)} owned by {user_name(info.st_uid)} (uid {info.st_uid})"
        evidence: dict[str, object] = {}
        if stat.S_ISLNK(info.st_mode):
            evidence["target"] = str(path.readlink())
            found += f" pointing to {evidence['target']}"
        else:
            found += f", mode {mode}"
        return cls(
            str(path),
            f"{problem}: found {found}; expected {expected}",
            problem=problem,
            found=kind_of(info.st_mode),
            owner=info.st_uid,
            owner_name=user_name(info.st_uid),
            mode=mode,
            expected=expected,
            daemon_uid=os.geteuid(),
            **evidence,
        )


def _me() -> str:
    uid = os.geteuid()
    return f"{user_name(uid)} (uid {uid})"


def _folder_expected() -> str:
    return f"a directory owned by {_me()} that neither group nor others can write"


def _file_expected() -> str:
    return f"a regular file with one link, owned by {_me()}"


def ancestors(path: Path) -> Iterator[Path]:
    """The folders the kernel walks to reach ``path``: those above it as written, top
    first, then those above it once links are resolved."""
    yield from reversed(path.parents)
    real = Path(os.path.realpath(path.parent))
    yield from (*reversed(real.parents), real)


def check_ancestors(path: Path, *, missing_ok: bool = False) -> None:
    """Refuse a folder above ``path`` that someone else could rename ``path`` out of.

    With ``missing_ok`` a folder not made yet ends the check (the daemon makes the
    rest itself).
    """
    allowed = {0, os.geteuid()}
    owners = "root" + ("" if os.geteuid() == 0 else f" or {_me()}")
    expected = f"a directory owned by {owners}, writable by no one else unless sticky"
    for folder in ancestors(path):
        try:
            info = folder.stat()
        except FileNotFoundError:
            if missing_ok:
                return
            raise
        if not stat.S_ISDIR(info.st_mode):
            raise RootUnsafeError.at(folder, "is not a directory", info, expected)
        if info.st_uid not in allowed:
            raise RootUnsafeError.at(folder, "is owned by another user", info, expected)
        if info.st_mode & OTHERS_WRITE and not info.st_mode & stat.S_ISVTX:
            raise RootUnsafeError.at(
                folder, "is writable by group or others without the sticky bit", info, expected
            )


def check_folder(path: Path) -> None:
    """Refuse ``path`` unless it is a real directory, ours, and writable only by us."""
    info = path.lstat()
    problem = None
    if stat.S_ISLNK(info.st_mode):
        problem = "is a symlink"
    elif not stat.S_ISDIR(info.st_mode):
        problem = "is not a directory"
    elif info.st_uid != os.geteuid():
        problem = "is owned by another user"
    elif info.st_mode & OTHERS_WRITE:
        problem = "is writable by group or others"
    if problem is not None:
        raise RootUnsafeError.at(path, problem, info, _folder_expected())


def make_folder(path: Path) -> None:
    """Create ``path`` mode 0700 unless something is there already, then `check_folder` it."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(PRIVATE_FOLDER)
    check_folder(path)


def make_private_folder(path: Path) -> None:
    """`make_folder`, then take away the read and search bits of group and others too,
    through a descriptor opened without following a link."""
    make_folder(path)
    with Directory.open(path, private=True, error=RootUnsafeError) as folder:
        os.fchmod(folder.fd, PRIVATE_FOLDER)


def _file_problem(info: os.stat_result) -> str | None:
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_uid != os.geteuid():
        return "is owned by another user"
    if info.st_nlink != 1:
        return f"has {info.st_nlink} hard links"
    return None


def check_file(path: Path) -> None:
    """Refuse ``path`` if it exists and is not a regular file of ours with one link."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    problem = _file_problem(info)
    if problem is not None:
        raise RootUnsafeError.at(path, problem, info, _file_expected())


def check_socket(path: Path) -> None:
    """Refuse what is at the control socket's path unless it is nothing or a socket of ours
    (a stale one a dead daemon left, which the server replaces): a link or any other file
    there is named, never unlinked or bound over."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    problem = None
    if stat.S_ISLNK(info.st_mode):
        problem = "is a symlink"
    elif not stat.S_ISSOCK(info.st_mode):
        problem = "is not a socket"
    elif info.st_uid != os.geteuid():
        problem = "is owned by another user"
    if problem is not None:
        expected = f"nothing, or a stale Unix socket owned by {_me()}"
        raise RootUnsafeError.at(path, problem, info, expected)


def socket_refusal(path: Path) -> int | None:
    """`check_socket` at daemon start: None when the server may bind, else the refusal is
    written to stderr (one line) and the log, and its exit status (77) returned."""
    try:
        check_socket(path)
    except RootUnsafeError as error:
        sys.stderr.write(f"wardend: {error.message}\n")
        log.error("wardend.socket_unsafe", path=error.path, error=error.message)
        return error.exit_status
    return None


def open_private(path: Path, flags: int) -> int:
    """Open (creating it mode 0600) a file the daemon writes, never through a link.

    ``flags`` are the access flags (``os.O_RDWR``, ``os.O_WRONLY | os.O_APPEND``).
    The folder and the file are opened ``O_NOFOLLOW``; anything but a regular
    file of ours with one link is refused, and a file left with a looser mode
    is tightened to 0600.
    """
    with Directory.open(path.parent, error=RootUnsafeError) as folder:
        fd = folder.open_file(path.name, flags | os.O_CREAT, PRIVATE_FILE)
    try:
        info = os.fstat(fd)
        problem = _file_problem(info)
        if problem is not None:
            raise RootUnsafeError.at(path, problem, info, _file_expected())
        if stat.S_IMODE(info.st_mode) != PRIVATE_FILE:
            os.fchmod(fd, PRIVATE_FILE)
    except BaseException:
        os.close(fd)
        raise
    return fd
