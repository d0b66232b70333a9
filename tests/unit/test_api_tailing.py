"""The ``tail`` and ``maintail`` handlers (`api.tailing`): refusals, empty jobs, cursors.

Attempt files are written where the launcher keeps them; a job's own
attempts come from the scripted launcher where the test needs a real run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobwarden.daemon.api import tailing
from jobwarden.protocol import ControlError
from jobwarden.states import JobState
from tests.scripted import Exit
from tests.unit.rig import Rig, play

S = JobState


def write(path: Path, data: bytes) -> Path:
    """Append ``data`` to ``path`` (its folder made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as stream:
        stream.write(data)
    return path


def attempt_file(rig: Rig, job_id: str, number: int, name: str) -> Path:
    """A file of one attempt's folder."""
    return rig.root.job(job_id) / "attempts" / str(number) / name


@pytest.mark.parametrize(
    ("args", "code"),
    [
        ({"job": "ghost"}, "control.no_such_job"),
        ({"lines": 0}, "control.bad_request"),
        ({"lines": 10_001}, "control.bad_request"),
        ({"attempt": -1}, "control.bad_request"),
        ({"attempt": 2}, "control.no_such_attempt"),
        ({"stream": "stdout"}, "control.bad_request"),
        ({"daemon": "yes"}, "control.bad_request"),
        ({"worker": False, "daemon": False}, "control.bad_request"),
        ({"worker": 0}, "control.bad_request"),
        ({"kinds": "failed"}, "control.bad_request"),
        ({"kinds": [""]}, "control.bad_request"),
        ({"kinds": ["x"] * 33}, "control.bad_request"),
        ({"cursor": "end"}, "control.bad_request"),
        ({"cursor": {"offset": -1}}, "control.bad_request"),
        ({"cursor": {"log": True}}, "control.bad_request"),
    ],
)
def test_tail_refusals(tmp_path: Path, args: dict[str, Any], code: str) -> None:
    """tail: unknown job, lines outside 1..10000, a negative attempt or one past the job's,
    an unknown stream, a non-boolean or no source, malformed kinds, a malformed cursor."""

    async def scenario(rig: Rig) -> None:
        rig.job_in("job", S.RUNNING)
        with pytest.raises(ControlError) as caught:
            await tailing.tail(rig, {"job": "job", **args})
        assert caught.value.code == code

    play(tmp_path, scenario)


def test_no_such_attempt_names_how_many_there_are(tmp_path: Path) -> None:
    """tail --attempt past the job's attempts says how many it has."""

    async def scenario(rig: Rig) -> None:
        rig.submit("job")
        with pytest.raises(ControlError) as caught:
            await tailing.tail(rig, {"job": "job", "attempt": 1})
        assert caught.value.message == "job job has 0 attempt(s)"

    play(tmp_path, scenario)


@pytest.mark.parametrize("stream", ["events", "stderr"])
def test_tail_of_a_job_with_no_attempts_is_empty(tmp_path: Path, stream: str) -> None:
    """A queued job: no lines, and a cursor at the start of attempt 1."""

    async def scenario(rig: Rig) -> None:
        rig.submit("job")
        answer = await tailing.tail(rig, {"job": "job", "stream": stream})
        assert answer == {
            "lines": [],
            "cursor": {"attempt": 1, "offset": 0, "log": 0, "incidents": 0},
            "state": "queued",
            "attempts": 0,
        }

    play(tmp_path, scenario)


def test_tail_merges_events_and_the_daemons_records_and_follows_on(tmp_path: Path) -> None:
    """The last lines of every attempt, the daemon's records for the job (and not another
    job's) in time order; a follow-up from the cursor gives only what came after."""

    async def scenario(rig: Rig) -> None:
        record = rig.job_in("job", S.RUNNING)
        record.attempt = 2
        record.submitted -= 100  # its records below were logged before the request
        events_1 = attempt_file(rig, "job", 1, "events.jsonl")
        write(events_1, b'{"event": "ready", "time": 10.0}\n')
        write(attempt_file(rig, "job", 2, "events.jsonl"), b'{"event": "ready", "time": 30.0}\n')
        mine = {"event": "job.transition", "job": "job", "time": 20.0 + record.submitted}
        theirs = {"event": "job.transition", "job": "other", "time": 21.0 + record.submitted}
        write(rig.root.log, (json.dumps(mine) + "\n" + json.dumps(theirs) + "\n").encode())
        answer = await tailing.tail(rig, {"job": "job"})
        assert [(line.get("attempt"), line["event"]) for line in answer["lines"]] == [
            (1, "ready"),
            (2, "ready"),
            (None, "job.transition"),
        ]
        assert answer["lines"][-1]["origin"] == "wardend"
        assert answer["cursor"]["attempt"] == 2
        write(attempt_file(rig, "job", 2, "events.jsonl"), b'{"event": "progress"}\nnot json\n')
        more = await tailing.tail(rig, {"job": "job", "cursor": answer["cursor"]})
        assert [line["event"] for line in more["lines"]] == ["progress", "malformed"]

    play(tmp_path, scenario)


def test_tail_of_one_attempt_and_of_its_stderr(tmp_path: Path) -> None:
    """attempt N reads that attempt alone; stream stderr its stderr.log, as text lines."""

    async def scenario(rig: Rig) -> None:
        record = rig.job_in("job", S.RUNNING)
        record.attempt = 2
        write(attempt_file(rig, "job", 1, "events.jsonl"), b'{"event": "one"}\n')
        write(attempt_file(rig, "job", 2, "events.jsonl"), b'{"event": "two"}\n')
        write(attempt_file(rig, "job", 1, "stderr.log"), b"Traceback\nValueError: x\n")
        first = await tailing.tail(rig, {"job": "job", "attempt": 1, "daemon": False})
        assert [line["event"] for line in first["lines"]] == ["one"]
        stderr = await tailing.tail(rig, {"job": "job", "attempt": 1, "stream": "stderr"})
        assert stderr["lines"] == [
            {"attempt": 1, "line": "Traceback"},
            {"attempt": 1, "line": "ValueError: x"},
        ]
        limited = await tailing.tail(rig, {"job": "job", "lines": 1, "daemon": False})
        assert [line["event"] for line in limited["lines"]] == ["two"]

    play(tmp_path, scenario)


def test_tail_of_a_real_run_shows_its_incident_records(tmp_path: Path) -> None:
    """After a crash and a verified recovery, the tail holds both attempts' events and the
    incident's records (detected, verified), cut to their fields."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("crash")
        work = rig.worker(record)
        rig.launcher.plan("crash", [*work.start(), *work.updates(1, 3), Exit(1)], work.run(at=2))
        await rig.launched(record)
        await rig.until_settled("crash")
        answer = await tailing.tail(rig, {"job": "crash", "lines": 100})
        incidents = [line for line in answer["lines"] if "incident" in line]
        assert [line["event"] for line in incidents][:1] == ["incident.detected"]
        assert "incident.verified" in [line["event"] for line in incidents]
        assert {line["attempt"] for line in answer["lines"] if "attempt" in line} == {1, 2}
        assert answer["attempts"] == 2

    play(tmp_path, scenario)


@pytest.mark.parametrize("args", [{"lines": 0}, {"lines": 10_001}, {"cursor": -1}, {"cursor": "0"}])
def test_maintail_refusals(tmp_path: Path, args: dict[str, Any]) -> None:
    """maintail: lines within 1..10000, a cursor that is a byte offset."""

    async def scenario(rig: Rig) -> None:
        with pytest.raises(ControlError) as caught:
            await tailing.maintail(rig, args)
        assert caught.value.code == "control.bad_request"

    play(tmp_path, scenario)


def test_maintail_of_a_missing_log_then_from_a_cursor(tmp_path: Path) -> None:
    """No log yet: no records at offset 0; then the last records, then what follows."""

    async def scenario(rig: Rig) -> None:
        assert await tailing.maintail(rig, {}) == {"records": [], "cursor": 0}
        write(rig.root.log, b'{"event": "a", "time": 1.0}\n{"event": "b", "time": 2.0}\nnot\n')
        answer = await tailing.maintail(rig, {"lines": 2})
        assert [r["event"] for r in answer["records"]] == ["b", "malformed"]
        write(rig.root.log, b'{"event": "c", "time": 3.0}\n')
        more = await tailing.maintail(rig, {"cursor": answer["cursor"]})
        assert [r["event"] for r in more["records"]] == ["c"]

    play(tmp_path, scenario)
