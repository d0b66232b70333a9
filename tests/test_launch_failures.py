"""An attempt that cannot be launched leaves an incident, through a real daemon and execve.

A command job whose program is not on the worker PATH fails its first launch;
a plain program that removes its own workdir and crashes fails the launch of
its recovery.  Each is a ``launch_failed`` incident, concluded failed at once
(no launch failure is retried), and a recovery it was to make fails with it.
A job file whose env execve could never take is refused at intake, named.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.program import EXEC_STRING_MAX
from tests.daemon import Daemon
from tests.helpers import wait_until
from tests.test_command_jobs import command_job

SETTLED = ("completed", "failed", "escalated")


@pytest.fixture
def daemon(tmp_path: Path, compile_cache: Path) -> Iterator[Daemon]:
    """A running wardend on a fresh root."""
    with Daemon(tmp_path / "root", compile_cache) as running:
        yield running


@pytest.mark.slow
def test_a_program_not_found_fails_its_launch_with_an_incident(daemon: Daemon) -> None:
    """command[0] on no PATH: the job is failed, its launch_failed incident naming ENOENT and
    the PATH to check; no second attempt."""
    daemon.drop("lost.toml", command_job("lost", ["no-such-program-anywhere"], sdk=False))
    status = daemon.wait("lost", SETTLED, timeout=60)
    assert (status["state"], status["attempt"]) == ("failed", 1)
    assert status["reason"].startswith("attempt 1 could not be launched: ")
    [incident] = daemon.incidents("lost")
    assert (incident["kind"], incident["status"]) == ("launch_failed", "failed")
    assert incident["details"]["errno"] == "ENOENT"
    assert "PATH" in incident["prevention"][0]
    assert "never retried" in incident["outcome"]


@pytest.mark.slow
def test_a_recovery_that_cannot_be_launched_fails_naming_the_launch(
    daemon: Daemon, tmp_path: Path
) -> None:
    """A plain program removes its workdir and exits 1: the restart cannot be launched there,
    the crash incident's recovery fails naming the launch_failed incident, the job is failed."""
    workdir = tmp_path / "scratch"
    workdir.mkdir()
    script = 'rmdir "$PWD" && exit 1'
    job = command_job("gone", ["/bin/sh", "-c", script], sdk=False, workdir=str(workdir))
    daemon.drop("gone.toml", job)
    status = daemon.wait("gone", SETTLED, timeout=60)
    assert (status["state"], status["attempt"]) == ("failed", 2)
    crash, launch = daemon.incidents("gone")
    assert (crash["kind"], crash["status"]) == ("crash", "failed")
    assert f"see incident {launch['id']}" in crash["outcome"]
    assert (launch["kind"], launch["status"], launch["attempt"]) == ("launch_failed", "failed", 2)
    assert str(workdir) in launch["details"]["error"]


@pytest.mark.slow
def test_an_env_execve_cannot_take_is_rejected_at_intake(daemon: Daemon) -> None:
    """A 128 KiB value: rejected with its error file naming the variable and the sizes."""
    big = command_job("huge", ["/bin/true"], sdk=False, env={"BIG": "v" * EXEC_STRING_MAX})
    daemon.drop("huge.toml", big)
    error = daemon.root / "spool" / "rejected" / "huge.toml.error.json"
    wait_until(error.exists, timeout=30, what="the error file of huge.toml")
    problems = json.loads(error.read_text())["problems"]
    assert any(p.startswith("env.BIG: NAME=value is 131,077 bytes") for p in problems), problems
