"""The phase watches through a real daemon and real workers: a hung commit is a commit stall."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon import Daemon, linreg_job

pytestmark = pytest.mark.slow


@pytest.fixture
def daemon(tmp_path: Path, compile_cache: Path) -> Iterator[Daemon]:
    """A running wardend on a fresh root, sharing the session's compilation cache."""
    with Daemon(tmp_path / "root", compile_cache) as running:
        yield running


def test_a_hung_commit_is_found_as_a_commit_stall(daemon: Daemon) -> None:
    """Every commit of attempt 1 waits 60 s (commit_delay_s) under a 1 s commit watch: the
    first is stopped as a stall of the commit phase within 1.25 s, stacks taken, and the
    job resumes and completes; status names the phases and their durations."""
    job = linreg_job(
        "hung-commit",
        faults={"commit_delay_s": 60},
        supervision={"commit_timeout_s": 1, "stall_timeout_s": 30},
    )
    daemon.drop("hung-commit.toml", job)
    status = daemon.wait("hung-commit", timeout=60)
    assert status["state"] == "completed"
    (incident,) = daemon.incidents("hung-commit")
    details = incident["details"]
    assert (incident["kind"], details["phase"], details["timeout_s"]) == ("stall", "commit", 1)
    assert 1.0 <= details["gap_s"] <= 1.25
    assert details["last_event"]["event"] == "progress"
    assert details["last_event"]["commit"] == "sync"
    assert "sdk/faults.py" in details["stack_dump"]
    assert "in _commit" in details["stack_dump"]
    assert "stuck in its commit phase: no checkpoint event for" in incident["symptom"]
    reasons = [entry["reason"] for entry in status["history"]]
    assert any("in the commit phase (timeout 1 s)" in (reason or "") for reason in reasons)
    seen = status["phases"]["phases"]
    assert seen["commit"]["count"] >= 4
    assert seen["commit"]["longest_s"] < 1.0  # attempt 2's commits, undelayed
    assert seen["startup"]["count"] == seen["restore"]["count"] == 2
