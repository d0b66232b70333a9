"""What the daemon writes is private and what its workers inherit is allow-listed.

Run as root, as the adversary did, under a umask of 022 and a pre-existing 0755
root, where the old code left the log and the incident records 0644 and gave
every worker the daemon's whole environment, secrets included.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from jobwarden.daemon.incidents.records import Incident, IncidentLog
from jobwarden.daemon.launch.base import LauncherError
from jobwarden.daemon.observe.notify import WORKER_ENV, WORKER_ENV_PREFIXES, child_environment
from jobwarden.daemon.store.layout import Root, RootLockedError
from jobwarden.daemon.store.rootcheck import RootUnsafeError, open_private
from jobwarden.daemon.supervise.policy import IncidentKind
from jobwarden.errors import exit_status_table
from tests.daemon import Daemon, linreg_job
from tests.helpers import wait_until

DOCS = Path(__file__).parent.parent / "docs"


def mode_of(path: Path) -> int:
    """The permission bits of ``path`` itself (a link is not followed)."""
    return stat.S_IMODE(path.lstat().st_mode)


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


class TestOpenPrivate:
    """`open_private`: the daemon's files are 0600 whatever the umask, never through a link."""

    def test_a_new_file_is_0600_under_umask_0(self, tmp_path: Path) -> None:
        """Created 0600 even when the umask would allow 0666."""
        old = os.umask(0)
        try:
            os.close(open_private(tmp_path / "log", os.O_WRONLY | os.O_APPEND))
        finally:
            os.umask(old)
        assert mode_of(tmp_path / "log") == 0o600

    def test_an_older_looser_file_is_tightened(self, tmp_path: Path) -> None:
        """A 0644 log left by an older daemon becomes 0600, its lines kept."""
        (tmp_path / "log").write_text("old line\n")
        (tmp_path / "log").chmod(0o644)
        fd = open_private(tmp_path / "log", os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"new line\n")
        os.close(fd)
        assert (
            mode_of(tmp_path / "log"),
            (tmp_path / "log").read_text(),
        ) == (0o600, "old line\nnew line\n")

    def test_a_hard_link_is_refused(self, tmp_path: Path, precious: Path) -> None:
        """A second name for someone's file is refused and the file left as it was."""
        os.link(precious, tmp_path / "log")
        with pytest.raises(RootUnsafeError) as caught:
            open_private(tmp_path / "log", os.O_WRONLY | os.O_APPEND)
        assert caught.value.evidence["problem"] == "has 2 hard links"
        assert (precious.read_text(), mode_of(precious)) == ("do not touch\n", 0o644)


class TestIncidentFiles:
    """Incident records and runbooks are private whatever the umask."""

    def test_records_runbooks_and_folder_are_private_under_umask_022(self, root: Root) -> None:
        """incidents.jsonl (both), the snapshot and the runbook 0600; incidents/ 0700."""
        root.job("x").mkdir(mode=0o755)
        log = IncidentLog(root)
        incident = Incident("x-1", "x", IncidentKind.CRASH, time.time(), 1, "it crashed")
        old = os.umask(0o022)
        try:
            log.write(incident, "incident.detected")
        finally:
            os.umask(old)
            log.close()
        folder = root.job("x") / "incidents"
        files = [root.incidents, root.job("x") / "incidents.jsonl", *folder.iterdir()]
        assert len(files) == 4
        assert dict.fromkeys(files, 0o600) == {path: mode_of(path) for path in files}
        assert mode_of(folder) == 0o700


class TestChildEnvironment:
    """Workers get an allow-listed environment, never the daemon's secrets."""

    def test_secrets_and_unlisted_variables_stay_behind(self) -> None:
        """Credentials, the notify and client variables and anything unlisted are dropped."""
        daemon = {
            "AWS_SECRET_ACCESS_KEY": "s3cr3t",
            "GITHUB_TOKEN": "t",
            "DATABASE_PASSWORD": "p",
            "NOTIFY_SOCKET": "/run/systemd/notify",
            "WATCHDOG_USEC": "30000000",
            "WATCHDOG_PID": "1",
            "JOBWARDEN_ROOT": "/var/lib/jobwarden",
            "JOBWARDEN_SOCKET": "/run/jobwarden/control.sock",
            "JOBWARDEN_SUPERVISOR_PID": "1",
            "LD_PRELOAD": "/tmp/evil.so",
            "SSH_AUTH_SOCK": "/tmp/agent",
        }
        assert child_environment(daemon) == {}

    def test_the_listed_variables_are_kept(self) -> None:
        """PATH, HOME, the locale, PYTHONPATH, JAX and XLA knobs and the test fault pass."""
        kept = {
            "PATH": "/usr/bin",
            "HOME": "/var/lib/jobwarden",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "TZ": "UTC",
            "TMPDIR": "/tmp",
            "PYTHONPATH": "/opt/plugins",
            "PYTHONUNBUFFERED": "1",
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false",
            "JOBWARDEN_TEST_FAULT": "garbage_on_stdout",
        }
        assert kept == child_environment({**kept, "AWS_SECRET_ACCESS_KEY": "s3cr3t"})

    def test_docs_list_every_inherited_variable(self) -> None:
        """docs/daemon.md names each variable and prefix a worker inherits."""
        text = (DOCS / "daemon.md").read_text()
        missing = [name for name in (*WORKER_ENV, *WORKER_ENV_PREFIXES) if f"`{name}" not in text]
        assert missing == []

    def test_docs_list_wardend_exit_statuses(self) -> None:
        """docs/daemon.md gives the root's refusals their exit statuses."""
        text = (DOCS / "daemon.md").read_text()
        table = exit_status_table()
        for error in (RootLockedError, RootUnsafeError, LauncherError):
            assert f"| {table[error.code]} | `{error.code}` |" in text, error.code


def proc_environ(pid: int) -> dict[str, str]:
    """The environment a process was started with, as the kernel keeps it."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


@pytest.mark.slow
def test_a_worker_does_not_see_the_daemons_secrets(
    tmp_path: Path, compile_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AWS_SECRET_ACCESS_KEY in wardend's environment is absent from its running worker's."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-do-not-leak")
    monkeypatch.setenv("TZ", "UTC")
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        assert daemon.proc is not None
        assert proc_environ(daemon.proc.pid)["AWS_SECRET_ACCESS_KEY"] == "s3cr3t-do-not-leak"
        daemon.drop(
            "slow.toml", linreg_job("slow", run={"steps": 200}, faults={"step_delay_s": 0.1})
        )
        status = daemon.wait("slow", ("running",), timeout=120)
        seen = wait_until(
            lambda: proc_environ(status["pid"]),
            timeout=10,
            what="the worker's environment",
            retry=(OSError,),
        )
    assert "AWS_SECRET_ACCESS_KEY" not in seen
    assert "s3cr3t-do-not-leak" not in "".join(seen.values())
    launcher_adds = {"JOBWARDEN_SUPERVISOR_PID", "JOBWARDEN_ATTEMPT_FOLDER"}  # docs/daemon.md
    assert set(seen) - launcher_adds <= set(child_environment(os.environ))
    assert seen["JOBWARDEN_ATTEMPT_FOLDER"] == str(daemon.job_folder("slow") / "attempts" / "1")
    assert (str(daemon.proc.pid), "UTC") == (seen["JOBWARDEN_SUPERVISOR_PID"], seen["TZ"])


# ---- evidence file modes under a pre-existing 0755 root and umask 022

MINE = ("wardend.lock", "wardend.log", "incidents.jsonl")


@pytest.fixture(scope="module")
def evidence_root(tmp_path_factory: pytest.TempPathFactory, compile_cache: Path) -> Path:
    """A 0755 root in which wardend (umask 022) recovered one crashed job."""
    root = tmp_path_factory.mktemp("evidence") / "root"
    root.mkdir(mode=0o755)
    old = os.umask(0o022)
    try:
        daemon = Daemon(root, compile_cache).start()
    finally:
        os.umask(old)
    try:
        daemon.drop("crash.toml", linreg_job("crash", faults={"fail_after": 3}))
        assert daemon.wait("crash")["state"] == "completed"
    finally:
        daemon.stop()
    return root


@pytest.mark.slow
def test_the_daemons_log_lock_and_incident_files_are_0600(evidence_root: Path) -> None:
    """wardend.log, the lock, every incident record and runbook 0600; incidents/ 0700."""
    job = evidence_root / "jobs" / "crash"
    files = [
        *(evidence_root / name for name in MINE),
        job / "incidents.jsonl",
        *(job / "incidents").iterdir(),
    ]
    assert len(files) == 6
    assert dict.fromkeys(files, 0o600) == {path: mode_of(path) for path in files}
    assert mode_of(job / "incidents") == 0o700


@pytest.mark.slow
def test_every_file_and_folder_the_daemon_makes_is_private(evidence_root: Path) -> None:
    """Everything under the root but the root itself: files 0600, folders 0700."""
    loose = {
        str(path.relative_to(evidence_root)): f"{mode_of(path):04o}"
        for path in evidence_root.rglob("*")
        if mode_of(path) != (0o700 if path.is_dir() else 0o600)
    }
    assert loose == {}
