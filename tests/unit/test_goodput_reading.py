"""Goodput without an events file read on the loop: live events tallied, old files read by a
thread (the answer meanwhile names the attempt being read), each summary saved once."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from jobwarden.daemon.api import status
from jobwarden.daemon.incidents import goodput
from jobwarden.daemon.incidents.records import IncidentLog
from jobwarden.events import encode
from jobwarden.states import JobState
from tests.scripted import Exit, Stderr
from tests.unit.rig import Rig, play

HASH = "ab" * 32
READY = {"step": 0, "warmup_s": 0.5, "state_hash": HASH, "components": {}}


def long_attempt(folder: Path, updates: int, launched: float) -> None:
    """An ended attempt's folder, its files written afresh: ready, ``updates`` progress
    events with a commit every 100 updates, completed, and its exit.json."""
    folder.mkdir(parents=True, exist_ok=True)
    at = launched + 1.0
    lines = [encode("ready", READY, at)]
    for step in range(1, updates + 1):
        at += 0.01
        progress = {"step": step, "loss": 0.5, "examples": step, "update_s": 0.01}
        lines.append(encode("progress", {**progress, "state_hash": HASH}, at))
        if step % 100 == 0:
            commit = {"step": step, "file": "f", "bytes": 8, "seconds": 0.004}
            lines.append(
                encode("checkpoint", {**commit, "state_hash": HASH, "blocked_s": 0.002}, at)
            )
    lines.append(encode("completed", {"step": updates, "state_hash": HASH}, at + 0.01))
    (folder / "events.jsonl").write_text("".join(lines))
    ended = at + 0.5
    exit_record = {"exit_status": 0, "duration_s": ended - launched, "ended": ended}
    (folder / "exit.json").write_text(json.dumps({**exit_record, "stopped_by": None}))


def whole_file_goodput(job_folder: Path, history: list[dict[str, object]], now: float) -> dict:
    """The goodput of the whole files, by the accounting over every mark (the reference)."""
    return goodput.JobTraces().goodput(job_folder, history, now).as_record()


def same(found: dict, expected: dict) -> None:
    """Equal counts, and times equal to the microsecond (the sums are taken in another order)."""
    assert {k: found[k] for k in ("new_updates", "replayed_updates")} == {
        k: expected[k] for k in ("new_updates", "replayed_updates")
    }
    assert found["productive_s"] == pytest.approx(expected["productive_s"], abs=1e-3)
    for cause, seconds in expected["badput_s"].items():
        assert found["badput_s"][cause] == pytest.approx(seconds, abs=1e-3), cause


def test_status_of_a_file_never_followed_answers_at_once_and_a_thread_reads_it(
    tmp_path: Path,
) -> None:
    """A finished job the daemon never followed (its 20,000 updates written before it
    started): ``status JOB`` and the metrics answer before the file is read, naming attempt 1
    as still being read; a thread reads it, the goodput then equals the whole file's
    accounting, and its summary is saved so that a new daemon reads no events file again."""

    async def scenario(rig: Rig) -> None:
        record = rig.job_in("long", JobState.COMPLETED)
        job_folder = rig.root.job("long")
        long_attempt(job_folder / "attempts" / "1", 20_000, time.time() - 400.0)
        detail = status.status(rig, {"job": "long"})
        assert detail["goodput"]["reading"] == [1]
        assert detail["goodput"]["goodput"] is None
        text = rig.metrics_text()
        assert 'jobwarden_goodput_reading{job="long"} 1.0' in text
        assert 'jobwarden_goodput_ratio{job="long"}' not in text
        await rig.until(lambda: not rig.incidents.traces.reading)
        found = status.status(rig, {"job": "long"})["goodput"]
        assert found["reading"] == []
        now = float(record.history[-1]["time"])
        same(found, whole_file_goodput(job_folder, record.history, now))
        assert found["new_updates"] == 20_000
        assert rig.incidents.traces.reads == 1
        saved = json.loads((job_folder / "attempts" / "1" / "goodput.json").read_text())
        assert (saved["count"], saved["fixed"][:2]) == (20_000, [0, 0])
        assert len((job_folder / "attempts" / "1" / "goodput.json").read_bytes()) < 64_000
        again = IncidentLog(rig.root)  # a restarted daemon: the summary, no read
        restarted = again.traces.goodput(job_folder, record.history, time.time()).as_record()
        assert (restarted, again.traces.reads, again.traces.reading) == (found, 0, {})
        again.close()

    play(tmp_path, scenario)


def test_a_followed_job_s_goodput_comes_from_its_events_without_reading_its_file(
    tmp_path: Path,
) -> None:
    """A crash after update 5 and a verified recovery, followed live: the goodput and the
    incident's cost come from the events as they arrived (no events file is read), equal
    the whole files' accounting, and each ended attempt's summary is saved."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("crash")
        work = rig.worker(record)
        rig.launcher.plan(
            "crash",
            [*work.start(), *work.updates(1, 5), Stderr("Traceback ...\n"), Exit(1)],
            work.run(at=4),
        )
        await rig.launched(record)
        await rig.until_settled("crash")
        job_folder = rig.root.job("crash")
        now = time.time()
        found = status.status(rig, {"job": "crash"})["goodput"]
        assert found["reading"] == []
        same(found, whole_file_goodput(job_folder, record.history, now))
        assert (found["new_updates"], found["replayed_updates"]) == (8, 1)
        [incident] = rig.incident_records("crash")
        first, second = goodput.JobTraces().traces(job_folder)
        live = (job_folder / "attempts" / "2" / "job.json").stat().st_mtime  # when it was costed
        costed = goodput.Trace(2, live, None, None, second.marks)
        assert incident["cost_s"] == goodput.failure_cost([first, costed], 1)
        assert incident["cost_s"]["lost"] >= 0
        assert rig.incidents.traces.reads == 0
        for number in (1, 2):
            assert (job_folder / "attempts" / str(number) / "goodput.json").is_file()

    play(tmp_path, scenario)


def test_a_summary_is_set_aside_when_its_events_file_changed_and_a_stop_ends_a_read(
    tmp_path: Path,
) -> None:
    """A saved summary counts for the file it was made from: an events file replaced since
    (another length) is read again; a read under way when the daemon closes its incident
    log keeps and saves nothing."""

    async def scenario(rig: Rig) -> None:
        record = rig.job_in("long", JobState.COMPLETED)
        folder = rig.root.job("long") / "attempts" / "1"
        long_attempt(folder, 300, time.time() - 100.0)
        traces = rig.incidents.traces
        assert status.status(rig, {"job": "long"})["goodput"]["reading"] == [1]
        await rig.until(lambda: not traces.reading)
        assert status.status(rig, {"job": "long"})["goodput"]["new_updates"] == 300
        saved = (folder / "goodput.json").read_text()
        long_attempt(folder, 500, time.time() - 100.0)
        later = IncidentLog(rig.root)
        assert later.traces.goodput(rig.root.job("long"), record.history, time.time()).reading
        await rig.until(lambda: not later.traces.reading)
        found = later.traces.goodput(rig.root.job("long"), record.history, time.time())
        assert (found.reading, found.new_updates, later.traces.reads) == ((), 500, 1)
        assert (folder / "goodput.json").read_text() != saved
        (folder / "goodput.json").unlink()
        stopped = IncidentLog(rig.root)
        assert stopped.traces.goodput(rig.root.job("long"), record.history, time.time()).reading
        stopped.close()
        await rig.until(lambda: not stopped.traces.reading)
        assert (stopped.traces.tallies, (folder / "goodput.json").exists()) == ({}, False)
        later.close()

    play(tmp_path, scenario)


def test_an_attempt_without_an_events_file_is_left_out_as_before(tmp_path: Path) -> None:
    """A plain program's attempt has no events file: it is left out of the goodput at once
    (nothing to read), as the whole files' accounting leaves it out."""

    async def scenario(rig: Rig) -> None:
        record = rig.job_in("plain", JobState.COMPLETED)
        job_folder = rig.root.job("plain")
        folder = job_folder / "attempts" / "1"
        folder.mkdir(parents=True)
        (folder / "job.json").write_text("{}")
        ended = time.time() - 1.0
        exit_record = {"exit_status": 0, "duration_s": 5.0, "ended": ended, "stopped_by": None}
        (folder / "exit.json").write_text(json.dumps(exit_record))
        found = status.status(rig, {"job": "plain"})["goodput"]
        now = float(record.history[-1]["time"])
        assert found["reading"] == []
        same(found, whole_file_goodput(job_folder, record.history, now))
        assert found["badput_s"]["startup"] == 0.0
        assert rig.incidents.traces.reads == 0

    play(tmp_path, scenario)
