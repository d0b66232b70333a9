"""A job stopped or cancelled while its recovery attempt starts keeps no incident open.

Through a real daemon (no warm spare, so a recovery attempt starts cold) and
its socket: the first attempt crashes (an injected fault), and the recovery
attempt is stopped, or cancelled, while its worker still imports JAX, before
it has written ``ready``.  The crash incident is
concluded ``interrupted`` there and then, naming the job's state; a stopped
job resumed by the operator then completes with every incident concluded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.protocol import ControlError
from tests.daemon import Daemon, ctl, linreg_job
from tests.helpers import wait_until

RUN = {"steps": 60, "checkpoint_every": 10}
CRASH = {"fail_after": 25}


@pytest.fixture
def daemon(tmp_path: Path, compile_cache: Path) -> Iterator[Daemon]:
    """One daemon for the test."""
    with Daemon(tmp_path / "root", compile_cache, "--no-warm-spare") as started:
        yield started


def stop_recovery_at_start(daemon: Daemon, job: str, command: str) -> None:
    """Wait for the recovery attempt's worker to exist, then ``command`` (stop or cancel) it
    before it is ready."""
    wait_until(
        lambda: daemon.state(job),
        lambda s: s["state"] == "recovering" and s["attempt"] == 2 and s["pid"] is not None,
        timeout=90,
        what=f"the recovery attempt of {job} started",
        retry=(ControlError,),
    )
    args = {"job": job} if command == "stop" else {"jobs": [job]}
    daemon.ask(command, **args)
    events = daemon.attempt_folder(job, 2) / "events.jsonl"
    written = events.read_text() if events.exists() else ""
    assert '"ready"' not in written, f"attempt 2 was ready before the {command}: {written}"


@pytest.mark.slow
@pytest.mark.parametrize("command", ["stop", "cancel"])
def test_a_recovery_cut_short_concludes_its_incident(daemon: Daemon, command: str) -> None:
    """stop or cancel of a recovery attempt that is still starting: the crash incident is
    interrupted (not open) once the job rests; a stopped job resumed completes, with no
    incident open."""
    job = f"cut-{command}"
    daemon.drop(f"{job}.toml", linreg_job(job, run=RUN, faults=CRASH))
    stop_recovery_at_start(daemon, job, command)
    resting = "preempted" if command == "stop" else "cancelled"
    daemon.wait(job, (resting,), timeout=60)
    [crash] = daemon.incidents(job)
    assert (crash["kind"], crash["status"]) == ("crash", "interrupted")
    assert "it is preempted (stopped by operator" in crash["outcome"]
    if command == "cancel":
        return
    resumed = ctl(daemon, "resume", job)
    assert resumed.returncode == 0, resumed.stderr
    assert daemon.wait(job, ("completed", "failed", "escalated"), timeout=120)["state"] == (
        "completed"
    )
    assert [i["status"] for i in daemon.incidents(job) if i["status"] == "open"] == []
