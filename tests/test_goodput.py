"""Goodput: the accounting on recorded event sequences, and a short chaos soak through wardend.

The unit tests build attempts by hand (`Trace`, `Mark`) and run in
milliseconds; the soak runs a real daemon on a 60 s job SIGKILLed every 15 s
(``[faults] crash_every_s``) and checks the final state against an
uninterrupted run's and the goodput the daemon reports.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobwarden.control.tables import render_goodput
from jobwarden.daemon.incidents import goodput
from jobwarden.daemon.incidents.goodput import Mark, Trace, account, failure_cost, marks_of
from jobwarden.daemon.incidents.records import Incident, render_runbook
from jobwarden.daemon.supervise.policy import IncidentKind
from jobwarden.events import encode, parse_line
from tests.conftest import Runner
from tests.daemon import Daemon, linreg_job
from tests.helpers import job, kinds


def steps(first: int, last: int, at: float, every: float = 0.1) -> list[Mark]:
    """Progress marks for steps ``first..last``, the first at ``at``, then every ``every`` s."""
    return [Mark("progress", at + i * every, step) for i, step in enumerate(range(first, last + 1))]


def close(expected: dict[str, float], found: dict[str, float]) -> bool:
    """Whether every bucket of ``found`` is within a microsecond of ``expected`` (default 0)."""
    return all(abs(expected.get(name, 0.0) - value) < 1e-6 for name, value in found.items())


class TestAccount:
    """`account`: where each second of a job went."""

    def test_uninterrupted_job(self) -> None:
        """Queue, start-up, the first update's compilation, one commit held, new updates, and
        the shutdown after the last one."""
        marks = [
            Mark("started", 2.0),
            Mark("ready", 3.0),
            *steps(1, 5, 3.1),
            Mark("checkpoint", 3.52, 5, 0.02),
            *steps(6, 10, 3.6),
            Mark("completed", 4.0, 10),
        ]
        found = account(0.0, [Trace(1, 1.0, 4.2, None, tuple(marks))], end=4.1)
        assert found.wall_s == pytest.approx(4.1)
        assert found.productive_s == pytest.approx(1.0 - 0.1 - 0.02)
        expected = {"queue": 1.0, "startup": 2.0, "compile": 0.1, "checkpoint": 0.02, "other": 0.1}
        assert close(expected, found.badput_s), found.badput_s
        assert (found.new_updates, found.replayed_updates) == (10, 0)
        assert found.goodput == pytest.approx(0.88 / 4.1)

    def test_crash_then_resume_counts_replay_backoff_and_restore(self) -> None:
        """Attempt 1 dies 0.3 s after step 7; attempt 2 restores step 5 and redoes 6 and 7."""
        first = Trace(1, 0.0, 2.0, None, (Mark("ready", 1.0), *steps(1, 7, 1.1)))
        second = Trace(
            2,
            2.5,
            5.0,
            None,
            (
                Mark("started", 3.0),
                Mark("restored", 3.2, 5),
                Mark("ready", 3.5, 5),
                *steps(6, 10, 3.6),
                Mark("completed", 4.0, 10),
            ),
        )
        found = account(0.0, [first, second], end=4.0)
        assert (found.new_updates, found.replayed_updates) == (10, 2)
        assert found.productive_s == pytest.approx(0.6 + 0.3)
        expected = {
            "startup": 1.0 + (1.0 - 0.2),
            "restore": 0.2,
            "compile": 0.1 + 0.1,  # each attempt's first update
            "backoff": 0.5,
            "replay": 0.1 + 0.3,  # step 7 again (6's time is compile); attempt 1's tail
        }
        assert close(expected, found.badput_s), found.badput_s
        assert found.wall_s == pytest.approx(found.productive_s + sum(found.badput_s.values()))

    def test_a_stalled_attempt_s_silence_is_stall_time(self) -> None:
        """Stopped by the stall watch 3 s after its last update: 3 s of stall."""
        trace = Trace(1, 0.0, 5.0, "stall", (Mark("ready", 1.0), *steps(1, 2, 1.5, 0.5)))
        found = account(0.0, [trace], end=5.0)
        assert found.badput_s["stall"] == pytest.approx(3.0)
        assert found.badput_s["compile"] == pytest.approx(0.5)
        assert found.productive_s == pytest.approx(0.5)

    def test_a_job_still_queued_is_all_queue(self) -> None:
        """No attempt yet: every second so far is queue time and goodput is zero."""
        found = account(10.0, [], end=12.5)
        assert found.badput_s["queue"] == pytest.approx(2.5)
        assert found.goodput == 0.0


def test_failure_cost_splits_the_time_from_last_update_to_first_new_one() -> None:
    """The incident's cost: lost tail, backoff, start-up, restore, replay; it sums to the span."""
    first = Trace(1, 0.0, 2.0, None, (Mark("ready", 1.0), *steps(1, 7, 1.1)))
    marks = (Mark("started", 3.0), Mark("restored", 3.2, 5), Mark("ready", 3.5, 5))
    second = Trace(2, 2.5, None, None, (*marks, *steps(6, 10, 3.6)))
    cost = failure_cost([first, second], 1)
    expected = {"lost": 0.3, "backoff": 0.5, "startup": 0.8, "restore": 0.2, "compile": 0.1}
    assert close({**expected, "replay": 0.1}, cost), cost
    first_new_update, last_update, its_own_time = 3.8, 1.7, 0.1
    assert sum(cost.values()) == pytest.approx(first_new_update - last_update - its_own_time)


READY = {"step": 0, "warmup_s": 0.5, "state_hash": "00", "components": {}}
COMMIT = {"file": "ckpt", "bytes": 8, "state_hash": "00"}


def test_runbook_says_where_an_incident_s_time_lost_went() -> None:
    """The runbook's work-replayed section lists the cost by cause."""
    incident = Incident("j-1", "j", IncidentKind.CRASH, 0.0, 1, "killed", replayed_steps=[6, 7])
    incident.time_lost_s, incident.cost_s = 2.0, {"lost": 0.3, "backoff": 0.5, "replay": 1.2}
    text = render_runbook(incident)
    assert "Where that time went: lost 0.30 s, backoff 0.50 s, replay 1.20 s." in text


def test_marks_of_parsed_lines_prefers_blocked_s_and_skips_malformed_lines() -> None:
    """A background commit counts what held training (blocked_s), not its write time."""
    lines = [
        encode("ready", READY, 1.0),
        "not an event\n",
        encode("checkpoint", {**COMMIT, "step": 2, "seconds": 1.5, "blocked_s": 0.001}, 2.0),
        encode("checkpoint", {**COMMIT, "step": 4, "seconds": 0.25}, 3.0),
        encode("preempted", {"step": 4, "reason": "SIGTERM"}, 3.5),
    ]
    found = marks_of(parse_line(line) for line in lines)
    assert found == (
        Mark("ready", 1.0, 0, 0.0),
        Mark("checkpoint", 2.0, 2, 0.001),
        Mark("checkpoint", 3.0, 4, 0.25),
    )


def test_job_traces_reads_attempt_folders_and_caches_finished_ones(tmp_path: Path) -> None:
    """Launch time from exit.json (ended less duration); an unchanged attempt is not re-read."""
    folder = tmp_path / "jobs" / "j" / "attempts" / "1"
    folder.mkdir(parents=True)
    (folder / "events.jsonl").write_text(encode("ready", READY, 101.0))
    exit_record = {"exit_status": -9, "duration_s": 4.0, "ended": 104.5, "stopped_by": None}
    (folder / "exit.json").write_text(json.dumps(exit_record))
    traces = goodput.JobTraces()
    [trace] = traces.traces(tmp_path / "jobs" / "j")
    assert (trace.launched, trace.ended, trace.marks[0].kind) == (100.5, 104.5, "ready")
    assert traces.traces(tmp_path / "jobs" / "j")[0] is trace


def test_job_traces_reads_a_growing_events_file_from_where_it_stopped(tmp_path: Path) -> None:
    """A running attempt: appended events are added; a line still being written waits."""
    folder = tmp_path / "attempts" / "1"
    folder.mkdir(parents=True)
    (folder / "job.json").write_text("{}")
    events = folder / "events.jsonl"
    events.write_text(encode("ready", READY, 1.0))
    traces = goodput.JobTraces()
    assert [m.kind for m in traces.traces(tmp_path)[0].marks] == ["ready"]
    line = encode("checkpoint", {**COMMIT, "step": 2, "seconds": 0.5}, 2.0)
    with events.open("a") as stream:
        stream.write(line[:20])
    assert len(traces.traces(tmp_path)[0].marks) == 1
    with events.open("a") as stream:
        stream.write(line[20:])
    [trace] = traces.traces(tmp_path)
    assert trace.marks == (Mark("ready", 1.0), Mark("checkpoint", 2.0, 2, 0.5))
    assert trace.ended is None


def test_render_goodput_names_the_share_and_the_largest_cause_first() -> None:
    """The detail view's two lines."""
    found = account(0.0, [Trace(1, 4.0, 10.0, None, (Mark("ready", 5.0), *steps(1, 3, 5.5)))], 10)
    lines = render_goodput(found.as_record())
    assert lines[0] == "goodput: 2.0 % of 0:00:10 (3 new updates, 0 replayed)"  # 0.5 s compile
    assert lines[1].startswith("badput: replay")
    assert render_goodput(None) == []


def final_hash(events: list[dict[str, Any]]) -> str:
    """The completed event's state hash."""
    [done] = [e for e in events if e["event"] == "completed"]
    digest: str = done["state_hash"]
    return digest


def metric_text(answer: Any) -> str:
    """The exposition text of a ``metrics`` answer."""
    return answer if isinstance(answer, str) else str(answer.get("text", answer))


SOAK_FLOOR = 0.80
"""The goodput the short soak must keep: 60 s of updates, a SIGKILL every 15 s."""


@pytest.mark.slow
def test_soak_sigkilled_every_15_s_completes_exactly_and_reports_goodput(
    worker: Runner, tmp_path: Path, compile_cache: Path
) -> None:
    """A 60 s linreg job under crash_every_s = 15: it completes, its final state equals an
    uninterrupted run's, and status, metrics and incidents report goodput above the floor."""
    run = {"steps": 600, "checkpoint_every": 5, "keep_checkpoints": 2}
    reference = worker(job(tmp_path / "ref.toml", "ref", run=run), tmp_path / "ref")
    assert reference.exit_status == 0
    faults = {"crash_every_s": 15.0, "step_delay_s": 0.1, "every_attempt": True}
    text = linreg_job("soak", run=run, faults=faults, supervision={"max_restarts": 20})
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        daemon.drop("soak.toml", text)
        status = daemon.wait("soak", timeout=240)
        metrics = daemon.ask("metrics")
        incidents = daemon.incidents("soak")
        last = daemon.events("soak", status["attempt"])
    assert status["state"] == "completed"
    assert status["attempt"] >= 4  # crashed at 15, 30, 45 s (and perhaps 60)
    assert final_hash(last) == kinds(reference, "completed")[0]["state_hash"]
    found = status["goodput"]
    assert found["new_updates"] == 600
    assert found["replayed_updates"] >= 1
    assert found["goodput"] >= SOAK_FLOOR, found
    assert found["badput_s"]["replay"] > 0
    assert found["badput_s"]["startup"] > 0
    [ratio] = [
        float(line.split()[-1])
        for line in metric_text(metrics).splitlines()
        if line.startswith('jobwarden_goodput_ratio{job="soak"}')
    ]
    assert ratio == pytest.approx(found["goodput"], abs=1e-3)
    crashes = [i for i in incidents if i["kind"] == "crash"]
    assert crashes
    assert all(i["status"] == "verified" for i in crashes)
    assert all(i["cost_s"].get("lost", -1) >= 0 for i in crashes)
