"""``[supervision] on_mismatch = "continue"``: a replay that differs is recorded, not fatal."""

from __future__ import annotations

from pathlib import Path

from jobwarden.states import JobState as S
from tests.scripted import Exit
from tests.unit.rig import Rig, play

GO_ON = {"supervision": {"on_mismatch": "continue"}}


def test_a_replayed_update_that_differs_is_recorded_and_the_job_goes_on(tmp_path: Path) -> None:
    """Update 5 replayed with another hash: no kill, the incident is concluded mismatch
    with the diverging update as evidence, the job runs on to completion and its record
    and status name the divergence."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("drift", **GO_ON)
        same, other = rig.worker(record, "a"), rig.worker(record, "b")
        rig.launcher.plan(
            "drift",
            [*same.start(), *same.updates(1, 5), Exit(1)],
            [*same.start(4), *other.updates(5, 8), *other.completed()],
        )
        await rig.launched(record)
        await rig.until_settled("drift")
        assert record.state is S.COMPLETED
        assert rig.launcher.attempts[1].received == []
        [incident] = rig.incident_records("drift")
        assert (incident["status"], incident["verification"]["verdict"]) == (
            "mismatch",
            "mismatch",
        )
        assert incident["details"]["mismatch"]["step"] == 5
        assert "unverifiable past this step" in incident["outcome"]
        assert record.diverged == {"step": 5, "incident": incident["id"]}
        assert any("continued (on_mismatch = continue)" in h["reason"] for h in record.history)

    play(tmp_path, scenario)


def test_a_later_recovery_is_marked_unverifiable_past_the_divergence(tmp_path: Path) -> None:
    """The diverged attempt commits step 6 and crashes at 7; the next one reproduces its
    log exactly: verified against it, and marked unverifiable past step 5."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("drift", **GO_ON)
        same, other = rig.worker(record, "a"), rig.worker(record, "b")
        rig.launcher.plan(
            "drift",
            [*same.start(), *same.updates(1, 5), Exit(1)],
            [*same.start(4), *other.updates(5, 7), Exit(1)],
            [*other.start(6), *other.updates(7, 8), *other.completed()],
        )
        await rig.launched(record)
        await rig.until_settled("drift")
        assert record.state is S.COMPLETED
        first, second = rig.incident_records("drift")
        assert first["status"] == "mismatch"
        assert second["status"] == "verified"
        assert second["details"]["unverifiable_past_step"] == 5
        assert "unverifiable past that step" in second["outcome"]

    play(tmp_path, scenario)


def test_escalate_stays_the_default(tmp_path: Path) -> None:
    """Without the setting a differing replay still stops and escalates the job."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("drift")
        assert record.job.supervision.on_mismatch == "escalate"
        same, other = rig.worker(record, "a"), rig.worker(record, "b")
        rig.launcher.plan(
            "drift",
            [*same.start(), *same.updates(1, 5), Exit(1)],
            [*same.start(4), *other.updates(5, 8), *other.completed()],
        )
        await rig.launched(record)
        await rig.until_settled("drift")
        assert record.state is S.ESCALATED
        assert record.diverged is None

    play(tmp_path, scenario)


def test_a_drills_failure_whose_replay_differs_is_not_told_there_is_nothing_to_fix(
    tmp_path: Path,
) -> None:
    """fail_after injects the crash; the recovery's replay then differs. The prevention says
    the failure is the drill's and that what the recovery found is the program's own, and
    asks to find why the replay differs: no 'nothing to fix in the program' beside it."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("drilled", faults={"fail_after": 5})
        same, other = rig.worker(record, "a"), rig.worker(record, "b")
        rig.launcher.plan(
            "drilled",
            [*same.start(), *same.updates(1, 5), Exit(1)],
            [*same.start(4), *other.updates(5, 8), *other.completed()],
        )
        await rig.launched(record)
        await rig.until_settled("drilled")
        [incident] = rig.incident_records("drilled")
        told = " ".join(incident["prevention"])
        assert "injected by a drill" in told
        assert "Find why the replay differs" in told
        assert "Nothing to fix" not in told
        assert "what its recovery found is the program's own" in told

    play(tmp_path, scenario)
