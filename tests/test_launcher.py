"""The launcher seam: a second launcher, picked by name, runs the same verified recovery."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobwarden.daemon.launch import registry as launcher
from jobwarden.daemon.launch.local import LocalLauncher
from jobwarden.errors import JobwardenError
from tests.daemon import Daemon, linreg_job
from tests.launchers import BANNER, BashLauncher

REPO = Path(__file__).resolve().parent.parent


def test_launchers_load_by_entry_point_name_or_module_path() -> None:
    """'local' is registered; module:attribute names any other."""
    assert isinstance(launcher.load("local"), LocalLauncher)
    assert isinstance(launcher.load("tests.launchers:BashLauncher"), BashLauncher)


@pytest.mark.parametrize("name", ["nosuch", "tests.launchers:Missing", "json:dumps"])
def test_an_unknown_launcher_is_refused_by_name(name: str) -> None:
    """A name that is not a Launcher is a clear error naming it."""
    with pytest.raises(JobwardenError, match=name):
        launcher.load(name)


@pytest.mark.slow
def test_a_crash_under_the_bash_launcher_is_recovered_and_verified(
    tmp_path: Path, compile_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fail_after 3 through `bash -c`: incident, resume from 2, update 3 verified, completed."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    with Daemon(
        tmp_path / "root", compile_cache, "--launcher", "tests.launchers:BashLauncher"
    ) as daemon:
        daemon.drop("crash.toml", linreg_job("crash", faults={"fail_after": 3}))
        status = daemon.wait("crash")
        (incident,) = daemon.incidents("crash")
    assert (status["state"], status["attempt"]) == ("completed", 2)
    assert (
        incident["kind"],
        incident["status"],
        incident["recovery_point"]["step"],
    ) == ("crash", "verified", 2)
    attempts = daemon.job_folder("crash") / "attempts"
    for number in (1, 2):
        assert (attempts / str(number) / "stderr.log").read_text().startswith(BANNER)
    started = [
        json.loads(line)
        for line in (daemon.root / "wardend.log").read_text().splitlines()
        if '"attempt.started"' in line
    ]
    assert [line["launcher"] for line in started] == ["bash", "bash"]
