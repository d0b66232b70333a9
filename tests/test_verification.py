"""The replay proof: ReplayPlan and ReplayVerifier on hand-made events, no workers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jobwarden.daemon.incidents.records import Incident
from jobwarden.daemon.supervise.policy import IncidentKind
from jobwarden.daemon.supervise.verification import ReplayVerifier
from jobwarden.events import Event
from jobwarden.proof.replay import ReplayPlan, Verdict

V = Verdict


def event(kind: str, **fields: Any) -> Event:
    """An event as the worker would emit it."""
    return Event(kind, {"v": 1, "event": kind, **fields})


def plan(logged: dict[int, str], last: int | None = None, time: float | None = 100.0) -> ReplayPlan:
    """A failed attempt's log: state hashes by step."""
    return ReplayPlan(1, logged, max(logged, default=0) if last is None else last, time)


def incident() -> Incident:
    """The incident of the failure being recovered."""
    return Incident(
        id="j-1",
        job="j",
        kind=IncidentKind.CRASH,
        opened=90.0,
        attempt=1,
        symptom="crashed",
        boundary={"last_logged_step": 4},
        details={"last_progress_time": 100.0},
    )


def restored(step: int) -> Event:
    """The worker's restored event for ``step``."""
    return event(
        "restored",
        step=step,
        file=f"ckpt-{step}",
        checks=["checksum"],
        state_hash=f"h{step}",
        skipped=[],
    )


def resume(verifier: ReplayVerifier, step: int, state_hash: str) -> Verdict:
    """The resumed attempt restores ``step`` and reports ready with ``state_hash``."""
    verifier.restored(restored(step))
    return verifier.ready(event("ready", step=step, state_hash=state_hash))


LOG = {2: "h2", 3: "h3", 4: "h4"}


class TestReplayVerifier:
    def test_boundary_and_every_update_matched_is_verified(self) -> None:
        """Restored 2 equals the log, updates 3 and 4 reproduce it: verified at step 4."""
        verifier = ReplayVerifier(plan(LOG), incident())
        assert resume(verifier, 2, "h2") == V.PENDING
        assert verifier.progress(event("progress", step=3, state_hash="h3")) == V.PENDING
        assert verifier.progress(event("progress", step=4, state_hash="h4")) == V.VERIFIED
        checks = verifier.incident.verification["checks"]  # type: ignore[index]
        assert [(c["what"], c["step"]) for c in checks] == [
            ("restored state", 2),
            ("update", 3),
            ("update", 4),
        ]
        assert verifier.incident.replayed_steps == [3, 4]
        assert verifier.plan.replayed_updates == 2

    def test_mismatch_at_the_boundary(self) -> None:
        """A restored state that differs from the logged one is a mismatch before any update."""
        verifier = ReplayVerifier(plan(LOG), incident())
        assert resume(verifier, 2, "other") == V.MISMATCH
        assert verifier.mismatch_step == 2
        text = verifier.incident.verification["text"]  # type: ignore[index]
        assert text.startswith("MISMATCH at step 2 (restored state)")
        assert verifier.incident.prevention

    def test_mismatch_mid_replay(self) -> None:
        """Update 3 matches, update 4 differs: mismatch at 4, and it stays a mismatch."""
        verifier = ReplayVerifier(plan(LOG), incident())
        resume(verifier, 2, "h2")
        assert verifier.progress(event("progress", step=3, state_hash="h3")) == V.PENDING
        assert verifier.progress(event("progress", step=4, state_hash="x")) == V.MISMATCH
        assert verifier.progress(event("progress", step=5, state_hash="h5", time=1)) == V.MISMATCH
        assert verifier.mismatch_step == 4
        assert verifier.time_lost_s is None

    def test_nothing_logged_is_unverified(self) -> None:
        """A failed attempt that logged nothing leaves nothing to compare: unverified."""
        verifier = ReplayVerifier(plan({}, last=0, time=None), incident())
        assert verifier.ready(event("ready", step=0, state_hash="h0")) == V.UNVERIFIED
        assert verifier.incident.recovery_point == {"fresh": True, "step": 0}
        assert verifier.plan.checks == []

    def test_restored_past_the_log_is_unverified(self) -> None:
        """A checkpoint newer than the last logged update (its events were lost) is unverified."""
        verifier = ReplayVerifier(plan(LOG), incident())
        assert resume(verifier, 6, "h6") == V.UNVERIFIED

    def test_partial_log_checks_only_what_was_logged(self) -> None:
        """hash_every > 1: updates with no logged hash are passed over, the rest compared."""
        verifier = ReplayVerifier(plan({2: "h2", 4: "h4"}, last=5), incident())
        resume(verifier, 2, "h2")
        assert verifier.progress(event("progress", step=3, state_hash="zz")) == V.PENDING
        assert verifier.progress(event("progress", step=4, state_hash="h4")) == V.PENDING
        assert verifier.progress(event("progress", step=5, state_hash=None)) == V.VERIFIED
        assert [c["step"] for c in verifier.plan.checks] == [2, 4]

    def test_settle_before_the_log_is_exhausted(self) -> None:
        """An attempt that completes first is settled on what was compared."""
        verifier = ReplayVerifier(plan(LOG), incident())
        resume(verifier, 2, "h2")
        assert verifier.settle() == V.VERIFIED

    def test_time_lost_is_measured_at_the_first_new_update(self) -> None:
        """From the failed attempt's last progress to the first update past the boundary."""
        verifier = ReplayVerifier(plan(LOG, time=100.0), incident())
        resume(verifier, 2, "h2")
        verifier.progress(event("progress", step=3, state_hash="h3", time=101.0))
        verifier.progress(event("progress", step=4, state_hash="h4", time=102.0))
        assert verifier.time_lost_s is None
        verifier.progress(event("progress", step=5, state_hash="h5", time=103.5))
        assert verifier.time_lost_s == 3.5
        assert verifier.incident.time_lost_s == 3.5

    def test_recovery_point_records_quarantined_files(self) -> None:
        """A corrupt newer file the worker passed over is named in the evidence."""
        verifier = ReplayVerifier(plan(LOG), incident())
        skipped = {"file": "ckpt-4", "quarantined_to": "q/ckpt-4", "code": "c", "message": "m"}
        verifier.restored(event("restored", **{**restored(2).fields, "skipped": [skipped]}))
        assert verifier.incident.evidence["quarantined ckpt-4"] == "q/ckpt-4"
        assert verifier.incident.recovery_point["step"] == 2  # type: ignore[index]


class TestReplayPlan:
    def test_from_events_keeps_hashes_and_skips_malformed_lines(self, tmp_path: Path) -> None:
        """ready and progress hashes are logged; garbage lines are not an error."""
        update = {"v": 1, "event": "progress", "loss": 0.5, "examples": 8, "update_s": 0.01}
        lines = [
            {"v": 1, "event": "ready", "step": 0, "state_hash": "h0", "warmup_s": 1.0},
            {**update, "step": 1, "state_hash": "h1", "time": 10.0},
            {**update, "step": 2, "state_hash": None, "time": 11.0},
        ]
        lines[0]["components"] = {}
        path = tmp_path / "events.jsonl"
        path.write_text("\n".join([*map(json.dumps, lines), "not json"]) + "\n")
        built = ReplayPlan.from_events(1, path)
        assert (
            built.logged,
            built.last_logged_step,
            built.last_progress_time,
        ) == ({0: "h0", 1: "h1"}, 2, 11.0)

    def test_from_a_missing_file_is_empty(self, tmp_path: Path) -> None:
        """An attempt that never wrote events logged nothing."""
        built = ReplayPlan.from_events(1, tmp_path / "absent.jsonl")
        assert (built.logged, built.last_logged_step, built.last_progress_time) == ({}, 0, None)

    def test_to_verify_lists_logged_updates_after_the_restored_step(self) -> None:
        """The work being replayed."""
        built = plan(LOG)
        built.restored_step = 2
        assert built.to_verify() == [3, 4]
