"""The names a deployment relies on: wardend's root and socket from the unit's environment,
and wardenctl finding the shipped unit's socket with nothing set."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jobwarden.control import client
from jobwarden.control.client import DEFAULT_ROOT, DEFAULT_SOCKET, socket_for
from tests.helpers import wait_until


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No JOBWARDEN_* variables from the caller's shell."""
    monkeypatch.delenv("JOBWARDEN_ROOT", raising=False)
    monkeypatch.delenv("JOBWARDEN_SOCKET", raising=False)


@pytest.mark.usefixtures("clean_env")
class TestClientSocket:
    def test_nothing_set_asks_the_shipped_units_socket(self) -> None:
        """The unit's root keeps its socket in /run/jobwarden, and that is the default."""
        if (Path(DEFAULT_ROOT) / "control.sock").exists():
            pytest.skip(f"LOUD SKIP: a daemon runs by hand in {DEFAULT_ROOT} on this machine")
        assert socket_for(None, None) == Path(DEFAULT_SOCKET)
        assert socket_for(DEFAULT_ROOT, None) == Path(DEFAULT_SOCKET)

    def test_explicit_and_environment_choices_win(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """--socket, then --root's own socket, then $JOBWARDEN_SOCKET, then $JOBWARDEN_ROOT's."""
        assert socket_for(str(tmp_path), "/x.sock") == Path("/x.sock")
        assert socket_for(str(tmp_path), None) == tmp_path / "control.sock"
        monkeypatch.setenv("JOBWARDEN_SOCKET", "/env.sock")
        assert socket_for(None, None) == Path("/env.sock")
        assert socket_for(str(tmp_path), None) == tmp_path / "control.sock"
        monkeypatch.delenv("JOBWARDEN_SOCKET")
        monkeypatch.setenv("JOBWARDEN_ROOT", str(tmp_path))
        assert socket_for(None, None) == tmp_path / "control.sock"


def test_wardend_takes_its_root_and_socket_from_the_environment(tmp_path: Path) -> None:
    """With $JOBWARDEN_ROOT and $JOBWARDEN_SOCKET set, as the unit sets them, wardend needs
    no --root or --socket; without either, it says --root is required."""
    root, sock = tmp_path / "root", tmp_path / "run" / "control.sock"
    root.mkdir(mode=0o700)
    sock.parent.mkdir(mode=0o700)
    env = {**os.environ, "JOBWARDEN_ROOT": str(root), "JOBWARDEN_SOCKET": str(sock)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobwarden.daemon"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        answer = wait_until(
            lambda: client.request(sock, "version"),
            timeout=30,
            what="wardend answering on the socket named by $JOBWARDEN_SOCKET",
            retry=(client.DaemonUnreachable, OSError),
        )
        assert answer["root"] == str(root)
        assert (root / "spool" / "incoming").is_dir()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    env.pop("JOBWARDEN_ROOT")
    done = subprocess.run(
        [sys.executable, "-m", "jobwarden.daemon"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--root" in done.stderr
