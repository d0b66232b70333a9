"""Through a real daemon, default supervision: a job crashing often but committing between
crashes completes, every recovery verified; one dying at the same update every time is
failed as a deterministic crash loop."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwarden.testfaults import ENV, Fault
from tests.daemon import Daemon, linreg_job

pytestmark = pytest.mark.slow


def test_a_job_crashing_often_but_committing_completes_with_default_supervision(
    tmp_path: Path, compile_cache: Path
) -> None:
    """SIGKILLed every 3 s while it commits every 5 updates: at least 6 crashes, more
    than today's max_restarts = 3, yet it completes and every crash's recovery is verified
    (before, the fourth crash failed the job: 'crash; max_restarts exhausted')."""
    run = {"steps": 400, "checkpoint_every": 5, "keep_checkpoints": 2}
    faults = {"crash_every_s": 3.0, "step_delay_s": 0.05, "every_attempt": True}
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        daemon.drop("often.toml", linreg_job("often", run=run, faults=faults))
        status = daemon.wait("often", timeout=300)
        incidents = daemon.incidents("often")
    crashes = [i for i in incidents if i["kind"] == "crash"]
    assert status["state"] == "completed", status["reason"]
    assert len(crashes) >= 6, [i["symptom"] for i in crashes]
    assert all(i["status"] == "verified" for i in crashes), [i["status"] for i in crashes]
    assert status["restarts_without_progress"] == 0


def test_a_job_dying_at_the_same_update_is_failed_as_a_deterministic_crash_loop(
    tmp_path: Path, compile_cache: Path
) -> None:
    """fail_after = 3 in every attempt: attempt 1 commits step 2 (progress), then each
    attempt restores step 2 and dies at update 3; after max_restarts = 3 restarts without
    progress the job fails, naming the update, the restored step and the verdict."""
    faults = {"fail_after": 3, "every_attempt": True}
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        daemon.drop("loop.toml", linreg_job("loop", faults=faults))
        status = daemon.wait("loop", timeout=240)
        incidents = daemon.incidents("loop")
    assert status["state"] == "failed"
    assert status["attempt"] == 5
    assert "no progress in 4 attempts: each died at update 3" in status["reason"]
    assert status["reason"].endswith("a deterministic failure (max_restarts 3)")
    last = incidents[-1]
    loop = last["details"]["crash_loop"]
    assert loop["deterministic"] is True
    assert [a["restored_step"] for a in loop["attempts"]] == [2, 2, 2, 2]
    assert [a["died_at_update"] for a in loop["attempts"]] == [3, 3, 3, 3]
    assert "Fix the program or the data" in last["outcome"]


def test_a_replay_mismatch_with_on_mismatch_continue_is_recorded_and_the_job_completes(
    tmp_path: Path, compile_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The momentum zeroed on restore (a test-only fault) makes the recovery differ; under
    on_mismatch = "continue" the incident is concluded mismatch naming the update and the
    component, the job runs on to completion, and status keeps the divergence (the default,
    escalate, is tested in tests/test_drills.py)."""
    monkeypatch.setenv(ENV, Fault.ZERO_OPT_STATE_ON_RESTORE.value)
    job = linreg_job("goes-on", faults={"fail_after": 3}, supervision={"on_mismatch": "continue"})
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        daemon.drop("goes-on.toml", job)
        status = daemon.wait("goes-on", timeout=180)
        incidents = daemon.incidents("goes-on")
    assert status["state"] == "completed", status["reason"]
    assert status["diverged_at_step"] == 2
    [crash] = [i for i in incidents if i["kind"] == "crash"]
    assert crash["status"] == "mismatch"
    assert crash["verification"]["verdict"] == "mismatch"
    assert crash["verification"]["checks"][-1]["what"] == "restored state"
