"""The daemon refuses a root another user could control, and never follows a link planted in it.

Run as root, as the adversary did: other users are stood in for by uid 65534
(``os.chown``), their planted links by symlinks to files that must stay untouched.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from jobwarden.daemon.store.layout import Root, RootLockedError
from jobwarden.daemon.store.rootcheck import RootUnsafeError
from tests.daemon import Daemon

NOBODY = 65534


def mode_of(path: Path) -> int:
    """The permission bits of ``path`` itself (a link is not followed)."""
    return stat.S_IMODE(path.lstat().st_mode)


def refusal(root: Root) -> RootUnsafeError:
    """The error `Root.create` raises on ``root``."""
    with pytest.raises(RootUnsafeError) as caught:
        root.create()
    return caught.value


@pytest.fixture
def root(tmp_path: Path) -> Root:
    """A fresh root, created by the daemon's own code."""
    made = Root(tmp_path / "root")
    made.create()
    return made


@pytest.fixture
def precious(tmp_path: Path) -> Path:
    """A file of someone else's that a planted link points at, mode 0644."""
    target = tmp_path / "precious"
    target.write_text("do not touch\n")
    target.chmod(0o644)
    return target


class TestRootCheck:
    """`Root.create` and `Root.check` refuse what another user could control."""

    def test_a_fresh_root_and_its_folders_are_0700(self, root: Root) -> None:
        """Every folder the daemon creates is 0700, the cache included."""
        assert dict.fromkeys(root.folders, 0o700) == {
            folder: mode_of(folder) for folder in root.folders
        }

    def test_an_existing_0755_root_is_accepted_and_kept(self, tmp_path: Path) -> None:
        """A root readable by others but writable only by us is used as it is."""
        (tmp_path / "root").mkdir(mode=0o755)
        Root(tmp_path / "root").create()
        assert mode_of(tmp_path / "root") == 0o755

    def test_a_root_owned_by_another_user_is_refused(self, tmp_path: Path) -> None:
        """The error names the path, the owner and the mode, and nothing is created."""
        (tmp_path / "root").mkdir(mode=0o700)
        os.chown(tmp_path / "root", NOBODY, NOBODY)
        error = refusal(Root(tmp_path / "root"))
        assert str(tmp_path / "root") in error.message
        assert f"(uid {NOBODY})" in error.message
        assert "mode 0700" in error.message
        assert (error.code, error.exit_status) == ("daemon.root_unsafe", 77)
        assert list((tmp_path / "root").iterdir()) == []

    @pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777, 0o702])
    def test_a_root_others_can_write_is_refused(self, tmp_path: Path, mode: int) -> None:
        """Group- or world-writable, sticky or not: refused, naming the mode."""
        (tmp_path / "root").mkdir()
        (tmp_path / "root").chmod(mode)
        error = refusal(Root(tmp_path / "root"))
        assert f"mode {mode:04o}" in error.message
        assert error.evidence["problem"] == "is writable by group or others"

    def test_a_root_that_is_a_symlink_is_refused(self, tmp_path: Path) -> None:
        """The root itself may not be a link, even to a safe folder."""
        (tmp_path / "real").mkdir(mode=0o700)
        (tmp_path / "root").symlink_to(tmp_path / "real")
        error = refusal(Root(tmp_path / "root"))
        assert error.evidence["problem"] == "is a symlink"
        assert list((tmp_path / "real").iterdir()) == []

    def test_a_folder_above_others_can_write_is_refused(self, tmp_path: Path) -> None:
        """Whoever can write the parent can swap the root: refused unless sticky."""
        parent = tmp_path / "shared"
        parent.mkdir()
        parent.chmod(0o777)
        error = refusal(Root(parent / "root"))
        assert str(parent) == error.evidence["path"]
        assert not (parent / "root").exists()
        parent.chmod(0o1777)
        Root(parent / "root").create()

    def test_a_folder_above_owned_by_another_user_is_refused(self, tmp_path: Path) -> None:
        """A parent another user owns could be emptied and refilled by them."""
        parent = tmp_path / "theirs"
        parent.mkdir(mode=0o755)
        os.chown(parent, NOBODY, NOBODY)
        error = refusal(Root(parent / "root"))
        assert (str(parent), NOBODY) == (error.evidence["path"], error.evidence["owner"])

    @pytest.mark.parametrize("name", ["spool", "incoming", "jobs", "checkpoints", "cache"])
    def test_a_planted_folder_link_is_refused(self, tmp_path: Path, name: str) -> None:
        """A used folder that is a link to elsewhere is refused; nothing is made there."""
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o755)
        root = Root(tmp_path / "root")
        folder = {
            "spool": root.path / "spool",
            "incoming": root.incoming,
            "jobs": root.jobs,
            "checkpoints": root.checkpoints,
            "cache": root.path / "cache",
        }[name]
        folder.parent.mkdir(mode=0o700, parents=True)
        folder.symlink_to(elsewhere)
        error = refusal(root)
        assert (str(folder), "is a symlink") == (error.evidence["path"], error.evidence["problem"])
        assert (list(elsewhere.iterdir()), mode_of(elsewhere)) == ([], 0o755)

    def test_a_planted_cache_link_is_not_chmodded(self, root: Root, tmp_path: Path) -> None:
        """cache/jax linked to another folder: refused, the folder keeps its mode."""
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o755)
        root.cache.rmdir()
        root.cache.symlink_to(elsewhere)
        error = refusal(root)
        assert str(root.cache) == error.evidence["path"]
        assert str(elsewhere) == error.evidence["target"]
        assert mode_of(elsewhere) == 0o755

    def test_a_cache_others_can_read_is_tightened(self, root: Root) -> None:
        """A 0755 cache (readable, not writable, by others) is made 0700."""
        root.cache.chmod(0o755)
        root.create()
        assert mode_of(root.cache) == 0o700

    def test_a_folder_of_another_user_is_refused(self, root: Root) -> None:
        """checkpoints/ owned by uid 65534 is refused by `Root.check`."""
        os.chown(root.checkpoints, NOBODY, NOBODY)
        with pytest.raises(RootUnsafeError) as caught:
            root.check()
        assert (str(root.checkpoints), NOBODY) == (
            caught.value.evidence["path"],
            caught.value.evidence["owner"],
        )

    def test_a_group_writable_folder_is_refused(self, root: Root) -> None:
        """spool/incoming 0770 is refused: the control group uses the socket, not the tree."""
        root.incoming.chmod(0o770)
        assert str(root.incoming) == refusal(root).evidence["path"]

    def test_a_file_where_a_folder_belongs_is_refused(self, tmp_path: Path) -> None:
        """jobs as a regular file is refused as not a directory."""
        (tmp_path / "root").mkdir(mode=0o700)
        (tmp_path / "root" / "jobs").write_text("")
        assert refusal(Root(tmp_path / "root")).evidence["problem"] == "is not a directory"


class TestRootLock:
    """`Root.lock` never follows a planted link."""

    def test_a_planted_lock_link_is_refused_and_its_target_untouched(
        self, root: Root, precious: Path
    ) -> None:
        """Both `Root.check` and `Root.lock` refuse the link; the target is not truncated."""
        root.lock_file.symlink_to(precious)
        with pytest.raises(RootUnsafeError):
            root.check()
        with pytest.raises(RootUnsafeError) as caught:
            root.lock()
        assert str(precious) == caught.value.evidence["target"]
        assert (precious.read_text(), mode_of(precious)) == ("do not touch\n", 0o644)

    def test_a_dangling_lock_link_creates_nothing(self, root: Root, tmp_path: Path) -> None:
        """A link to a file not there yet does not make that file."""
        root.lock_file.symlink_to(tmp_path / "made-by-us")
        with pytest.raises(RootUnsafeError):
            root.lock()
        assert not (tmp_path / "made-by-us").exists()

    def test_the_lock_is_private_holds_our_pid_and_excludes_a_second(self, root: Root) -> None:
        """0600 with our pid inside; a second taker is told who holds it."""
        fd = root.lock()
        try:
            assert (0o600, f"{os.getpid()}\n") == (
                mode_of(root.lock_file),
                root.lock_file.read_text(),
            )
            with pytest.raises(RootLockedError) as caught:
                root.lock()
            assert os.getpid() == caught.value.evidence["holder_pid"]
        finally:
            os.close(fd)


# ---- a real wardend


@dataclass(frozen=True)
class Run:
    """How a wardend run ended: its exit status (None: still serving, so stopped) and stderr."""

    status: int | None
    stderr: str


def wardend(root: Path, timeout: float = 20) -> Run:
    """Run wardend on ``root`` until it exits, or stop it after ``timeout`` s of serving."""
    argv = [sys.executable, "-m", "jobwarden.daemon", "--root", str(root)]
    with subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            return Run(proc.wait(timeout), proc.communicate()[1])
        except subprocess.TimeoutExpired:
            proc.kill()
            return Run(None, proc.communicate()[1])


@pytest.mark.slow
class TestWardendRefuses:
    """wardend refuses an unsafe root at start, before it touches anything in it."""

    def test_a_root_owned_by_another_user(self, tmp_path: Path) -> None:
        """Refused naming the path, the owner and the mode; nothing created inside."""
        (tmp_path / "root").mkdir(mode=0o700)
        os.chown(tmp_path / "root", NOBODY, NOBODY)
        done = wardend(tmp_path / "root")
        assert list((tmp_path / "root").iterdir()) == []
        assert done.status not in (None, 0)
        assert f"{tmp_path / 'root'}: is owned by another user" in done.stderr
        assert f"(uid {NOBODY}), mode 0700" in done.stderr

    def test_a_root_with_mode_0777(self, tmp_path: Path) -> None:
        """Refused naming the mode; nothing created inside."""
        (tmp_path / "root").mkdir()
        (tmp_path / "root").chmod(0o777)
        done = wardend(tmp_path / "root")
        assert list((tmp_path / "root").iterdir()) == []
        assert done.status not in (None, 0)
        assert f"{tmp_path / 'root'}: is writable by group or others" in done.stderr
        assert "mode 0777" in done.stderr

    def test_a_planted_lock_link_leaves_its_target_untouched(
        self, root: Root, precious: Path
    ) -> None:
        """wardend.lock linked to another file: refused, the file neither truncated nor written."""
        lock = root.path / "wardend.lock"
        lock.symlink_to(precious)
        done = wardend(root.path)
        assert (precious.read_text(), mode_of(precious)) == ("do not touch\n", 0o644)
        assert done.status not in (None, 0)
        assert f"{lock}: is a symlink" in done.stderr

    def test_a_planted_cache_link_leaves_its_target_mode(self, root: Root, tmp_path: Path) -> None:
        """cache/jax linked to another folder: refused, the folder not chmodded."""
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o755)
        root.cache.rmdir()
        root.cache.symlink_to(elsewhere)
        done = wardend(root.path)
        assert mode_of(elsewhere) == 0o755
        assert done.status not in (None, 0)
        assert f"{root.cache}: is a symlink" in done.stderr

    def test_exits_77_with_one_line(self, tmp_path: Path) -> None:
        """The exit status is RootUnsafeError's and stderr is one line, no traceback."""
        (tmp_path / "root").mkdir()
        (tmp_path / "root").chmod(0o777)
        done = wardend(tmp_path / "root")
        assert (done.status, len(done.stderr.splitlines())) == (77, 1)
        assert done.stderr.startswith(f"wardend: {tmp_path / 'root'}: is writable")


def test_deleting_the_lock_file_admits_no_second_daemon(tmp_path: Path) -> None:
    """The root lock is on the directory: a deleted wardend.lock hands it to nobody."""
    root = Root(tmp_path / "root")
    root.create()
    fd = root.lock()
    try:
        root.lock_file.unlink()
        with pytest.raises(RootLockedError):
            root.lock()
    finally:
        os.close(fd)


@pytest.mark.slow
class TestControlSocketPath:
    """What is found at ``control.sock`` before the server binds: only a stale socket is ours."""

    def test_a_planted_socket_link_is_refused_with_77_naming_the_path(
        self, root: Root, precious: Path
    ) -> None:
        """control.sock linked to another file: exit 77 naming it, no traceback, file untouched."""
        root.socket.symlink_to(precious)
        done = wardend(root.path)
        assert (precious.read_text(), mode_of(precious)) == ("do not touch\n", 0o644)
        assert (done.status, "Traceback" in done.stderr) == (77, False)
        assert done.stderr.startswith(f"wardend: {root.socket}: is a symlink")
        assert root.socket.is_symlink()

    def test_a_regular_file_there_is_refused_and_kept(self, root: Root) -> None:
        """A regular file at control.sock: exit 77 naming it; the file is left as it was."""
        root.socket.write_text("not a socket\n")
        done = wardend(root.path)
        assert (done.status, "Traceback" in done.stderr) == (77, False)
        assert done.stderr.startswith(f"wardend: {root.socket}: is not a socket")
        assert root.socket.read_text() == "not a socket\n"

    def test_a_stale_socket_of_a_dead_daemon_is_replaced(self, root: Root) -> None:
        """A socket nobody listens on (its daemon died) is replaced, and wardend serves."""
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(str(root.socket))
        stale.close()
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with probe, pytest.raises(ConnectionRefusedError):
            probe.connect(str(root.socket))
        with Daemon(root.path) as daemon:
            assert daemon.proc is not None
            assert daemon.ask("version")["pid"] == daemon.proc.pid
