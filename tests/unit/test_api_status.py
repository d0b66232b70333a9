"""The ``status`` handler (`api.status`): the table as columns or rows, totals, one job.

Answers are decoded exactly as a client decodes them (`Encoded` bytes are
the JSON the socket sends).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from jobwarden.daemon.api import status
from jobwarden.protocol import ControlError, Encoded
from jobwarden.states import JobState
from tests.unit.rig import Rig, play

S = JobState


def decoded(answer: Any) -> dict[str, Any]:
    """The answer as the client gets it."""
    return json.loads(answer.data) if isinstance(answer, Encoded) else answer


@pytest.mark.parametrize("job", [7, "ghost", ""])
def test_status_of_a_job_that_is_not_known_is_refused(tmp_path: Path, job: Any) -> None:
    """status job: a non-string or unknown id is no_such_job."""

    async def scenario(rig: Rig) -> None:
        rig.submit("known")
        with pytest.raises(ControlError) as caught:
            status.status(rig, {"job": job})
        assert (caught.value.code, caught.value.message) == (
            "control.no_such_job",
            f"no job {job!r}",
        )

    play(tmp_path, scenario)


@pytest.mark.parametrize("rows", [1, "true", None, [True]])
def test_rows_that_is_not_a_boolean_is_refused(tmp_path: Path, rows: Any) -> None:
    """status rows: true or false only."""

    async def scenario(rig: Rig) -> None:
        with pytest.raises(ControlError) as caught:
            status.status(rig, {"rows": rows})
        assert caught.value.code == "control.bad_request"

    play(tmp_path, scenario)


def test_status_of_an_empty_table(tmp_path: Path) -> None:
    """No jobs: every column empty, totals all zero, the daemon's own fields."""

    async def scenario(rig: Rig) -> None:
        answer = decoded(status.status(rig, {}))
        assert answer["columns"] == {name: [] for name in status.TABLE_FIELDS}
        assert answer["totals"] == {"jobs": 0, "states": {}, "needs_attention": 0, "rejected": 0}
        assert answer["daemon"]["needs_attention"] == 0
        full = decoded(status.status(rig, {"rows": True}))
        assert (full["jobs"], full["totals"]["jobs"]) == ([], 0)

    play(tmp_path, scenario)


def test_status_of_one_queued_job(tmp_path: Path) -> None:
    """One job no supervisor holds: its column values, its full row, its detail."""

    async def scenario(rig: Rig) -> None:
        rig.submit("one", run={"steps": 12})
        columns = decoded(status.status(rig, {}))["columns"]
        assert {name: values[0] for name, values in columns.items()} == {
            "id": "one",
            "state": "queued",
            "attempt": 0,
            "step": 0,
            "steps": 12,
            "newest_checkpoint_step": None,
            "pid": None,
            "rss_mb": None,
            "uptime_s": None,
            "last_progress_age_s": None,
        }
        [row] = decoded(status.status(rig, {"rows": True}))["jobs"]
        assert (row["task"], row["checkpoint"], row["incidents"], row["uptime_s"]) == (
            "linreg",
            "one",
            [],
            None,
        )
        detail = status.status(rig, {"job": "one"})
        assert [h["to"] for h in detail["history"]] == ["queued"]
        assert (detail["request"]["run"]["steps"], detail["members"]) == (12, None)
        goodput = detail["goodput"]
        assert (goodput["goodput"], goodput["productive_s"], goodput["new_updates"]) == (0, 0, 0)

    play(tmp_path, scenario)


def test_totals_count_states_and_those_that_need_attention(tmp_path: Path) -> None:
    """Failed and escalated jobs need attention; the spool's rejections are counted."""

    async def scenario(rig: Rig) -> None:
        for job_id, state in (("f", S.FAILED), ("e", S.ESCALATED), ("c", S.COMPLETED)):
            rig.job_in(job_id, state)
        rig.spool.rejected = 2
        answer = decoded(status.status(rig, {}))
        assert answer["totals"] == {
            "jobs": 3,
            "states": {"completed": 1, "escalated": 1, "failed": 1},
            "needs_attention": 2,
            "rejected": 2,
        }
        assert answer["daemon"]["needs_attention"] == 2

    play(tmp_path, scenario)


def test_a_live_job_shows_its_sample_and_uptime(tmp_path: Path) -> None:
    """A job with a live worker shows its pid, rss and uptime; a resting one does not."""

    async def scenario(rig: Rig) -> None:
        record, attempt = await rig.live("busy")
        record.sample = {"rss_mb": 321.5, "status": "running"}
        rig.job_in("idle", S.PREEMPTED).sample = {"rss_mb": 99.0}
        columns = decoded(status.status(rig, {}))["columns"]
        assert (columns["pid"], columns["rss_mb"]) == ([attempt.pid, None], [321.5, None])
        assert isinstance(columns["uptime_s"][0], float)
        assert (columns["uptime_s"][1], columns["step"][0]) == (None, 1)
        [live, idle] = decoded(status.status(rig, {"rows": True}))["jobs"]
        assert (live["process_status"], idle["rss_mb"]) == ("running", None)

    play(tmp_path, scenario)


def test_the_columns_follow_a_transition_between_requests(tmp_path: Path) -> None:
    """The cached columns are made again once a record is saved: a later answer is current."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("moving")
        rows = status.StatusRows()
        assert decoded(status.status(rig, {}, rows))["columns"]["state"] == ["queued"]
        rig.put(record, S.PREEMPTED)
        assert decoded(status.status(rig, {}, rows))["columns"]["state"] == ["preempted"]
        full = decoded(status.status(rig, {"rows": True}, rows))["jobs"][0]
        assert (full["state"], full["attempt"]) == ("preempted", 1)

    play(tmp_path, scenario)


def test_a_non_finite_rss_is_answered_for_the_strict_encoder_to_refuse(tmp_path: Path) -> None:
    """A NaN rss is not written as null: the answer is left as data, which the protocol's
    strict encoder refuses by name."""

    async def scenario(rig: Rig) -> None:
        record, _ = await rig.live("odd")
        record.sample = {"rss_mb": float("nan")}
        answer = status.status(rig, {})
        assert isinstance(answer, dict)
        assert math.isnan(answer["columns"]["rss_mb"][0])

    play(tmp_path, scenario)
