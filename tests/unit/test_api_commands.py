"""The control handlers of `api.arguments`, `api.commands` and `api.examine`, called directly.

Each handler is given the `Rig` as its `View` (a real table, incident log
and root on tmp_path, jobs taken in as intake takes them) and its arguments
as a request would carry them; every `ControlError` branch is reached once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from jobwarden.daemon.api import arguments, commands, examine
from jobwarden.daemon.api.lifecycle import Lifecycle
from jobwarden.daemon.incidents.records import Incident
from jobwarden.daemon.supervise.policy import IncidentKind
from jobwarden.daemon.view import View
from jobwarden.protocol import MAX_INT, PROTOCOL_VERSION, ControlError
from jobwarden.states import RESUMABLE, JobState
from tests.unit.rig import Rig, play

S = JobState


def refused(call: Callable[[], Any]) -> tuple[str, str]:
    """The code and message of the `ControlError` ``call()`` raises."""
    with pytest.raises(ControlError) as caught:
        call()
    return caught.value.code, caught.value.message


async def refused_async(call: Callable[[], Awaitable[Any]]) -> tuple[str, str]:
    """The code and message of the `ControlError` awaiting ``call()`` raises."""
    with pytest.raises(ControlError) as caught:
        await call()
    return caught.value.code, caught.value.message


def an_incident(rig: Rig, job_id: str) -> str:
    """Open one incident for ``job_id`` (with its runbook) and return its id."""
    record = rig.table.get(job_id)
    assert record is not None
    number = len(record.incidents) + 1
    incident = Incident(
        id=f"{job_id}-{number}",
        job=job_id,
        kind=IncidentKind.CRASH,
        opened=time.time(),
        attempt=1,
        symptom="Attempt 1 exited with status 1.",
    )
    rig.incidents.open(record, incident, "incident.detected")
    return incident.id


def write_attempt(rig: Rig, job_id: str, number: int, name: str, data: bytes) -> None:
    """Put ``data`` in a file of one attempt's folder, as the launcher keeps stdout."""
    folder = rig.root.job(job_id) / "attempts" / str(number)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


# ---- the View itself


def test_the_rig_offers_every_member_of_the_view(tmp_path: Path) -> None:
    """Every member the handlers may use (`View`) is there, so no test passes by omission."""

    async def scenario(rig: Rig) -> None:
        members = [name for name in vars(View) if not name.startswith("_")]
        assert "table" in members
        assert [name for name in members if not hasattr(rig, name)] == []
        assert callable(rig.is_live)
        assert sorted(commands.handlers(rig, Lifecycle(rig))) == sorted(
            [
                "status",
                "incidents",
                "runbook",
                "events",
                "checkpoints",
                "submit",
                "resume",
                "metrics",
                "version",
                "shutdown",
                "stop",
                "cancel",
                "restart",
                "remove",
                "archive_checkpoint",
                "signal",
                "archived",
                "rejected",
                "tail",
                "maintail",
                "inspect",
                "verify",
            ]
        )

    play(tmp_path, scenario)


# ---- arguments


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "no job None"),
        ({"job": 7}, "no job 7"),
        ({"job": None}, "no job None"),
        ({"job": "ghost"}, "no job 'ghost'"),
        ({"job": "x" * 200}, "no job '" + "x" * 79),
    ],
)
def test_a_job_that_is_not_known_is_refused(
    tmp_path: Path, args: dict[str, Any], message: str
) -> None:
    """job_record: a missing, non-string or unknown id is no_such_job, its repr cut to 80."""

    async def scenario(rig: Rig) -> None:
        rig.submit("known")
        assert refused(lambda: arguments.job_record(rig, args)) == (
            "control.no_such_job",
            message,
        )

    play(tmp_path, scenario)


def test_a_known_job_is_found(tmp_path: Path) -> None:
    """job_record returns the table's own record."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("known")
        assert arguments.job_record(rig, {"job": "known"}) is record

    play(tmp_path, scenario)


@pytest.mark.parametrize(
    ("args", "expected"),
    [({}, 5), ({"n": 1}, 1), ({"n": 10}, 10), ({"n": 7}, 7)],
)
def test_an_integer_argument_within_its_bounds_is_taken(
    args: dict[str, Any], expected: int
) -> None:
    """int_arg: the default when absent, and both bounds inclusive."""
    assert arguments.int_arg(args, "n", 5, 1, 10) == expected


@pytest.mark.parametrize("value", [0, 11, -1, True, False, 1.0, "3", None, [1]])
def test_an_integer_argument_out_of_bounds_or_of_another_type_is_refused(value: Any) -> None:
    """int_arg: below, above, a bool, a float, a string, null or a list is bad_request naming
    the argument and its bounds."""
    assert refused(lambda: arguments.int_arg({"n": value}, "n", 5, 1, 10)) == (
        "control.bad_request",
        f"n must be an integer from 1 to 10, not {value!r:.40}",
    )


def test_the_default_upper_bound_is_the_largest_64_bit_integer() -> None:
    """int_arg takes 2^63-1 and refuses 2^63."""
    assert arguments.int_arg({"n": MAX_INT}, "n", 0, 0) == MAX_INT
    assert refused(lambda: arguments.int_arg({"n": MAX_INT + 1}, "n", 0, 0))[0] == (
        "control.bad_request"
    )


# ---- resume


@pytest.mark.parametrize("state", sorted(set(JobState) - RESUMABLE, key=lambda s: s.value))
def test_resume_of_a_job_that_is_not_resting_is_refused(tmp_path: Path, state: JobState) -> None:
    """resume applies to preempted, failed or escalated jobs only: bad_state otherwise."""

    async def scenario(rig: Rig) -> None:
        rig.job_in("job", state)
        assert refused(lambda: commands.resume(rig, {"job": "job"})) == (
            "control.bad_state",
            f"job job is {state.value}; resume applies to preempted, failed or escalated jobs",
        )
        assert list(rig.queue) == []

    play(tmp_path, scenario)


@pytest.mark.parametrize("state", sorted(RESUMABLE, key=lambda s: s.value))
def test_resume_of_a_resting_job_queues_it_with_its_restarts_reset(
    tmp_path: Path, state: JobState
) -> None:
    """A preempted, failed or escalated job is queued again, restarts back to 0."""

    async def scenario(rig: Rig) -> None:
        record = rig.job_in("job", state)
        record.restarts = 3
        assert commands.resume(rig, {"job": "job"}) == {"job": "job", "state": "queued"}
        assert (record.state, record.restarts, list(rig.queue)) == (S.QUEUED, 0, ["job"])

    play(tmp_path, scenario)


def test_resume_of_an_unknown_job_is_refused(tmp_path: Path) -> None:
    """resume names a job that must exist."""

    async def scenario(rig: Rig) -> None:
        assert refused(lambda: commands.resume(rig, {"job": "ghost"}))[0] == "control.no_such_job"

    play(tmp_path, scenario)


# ---- incidents and runbook


def test_incidents_of_an_empty_table_and_of_one_job(tmp_path: Path) -> None:
    """No jobs: no incidents; with a job argument only that job's; an unknown job refused."""

    async def scenario(rig: Rig) -> None:
        assert commands.incidents(rig, {}) == []
        rig.submit("a")
        rig.submit("b")
        first = an_incident(rig, "a")
        assert [i["id"] for i in commands.incidents(rig, {"job": "a"})] == [first]
        assert commands.incidents(rig, {"job": "b"}) == []
        assert [i["id"] for i in commands.incidents(rig, {})] == [first]
        assert refused(lambda: commands.incidents(rig, {"job": "c"}))[0] == "control.no_such_job"

    play(tmp_path, scenario)


@pytest.mark.parametrize(
    "name", [None, 3, "", "job", "job-", "job-x", "ghost-1", "job-2", "../job-1"]
)
def test_a_runbook_that_does_not_exist_is_refused(tmp_path: Path, name: Any) -> None:
    """runbook: not a string, not <job>-<n>, an unknown job or a number never opened:
    no_such_incident."""

    async def scenario(rig: Rig) -> None:
        rig.submit("job")
        an_incident(rig, "job")
        assert refused(lambda: commands.runbook(rig, {"incident": name})) == (
            "control.no_such_incident",
            f"no incident {name!r:.80}",
        )

    play(tmp_path, scenario)


def test_a_runbook_is_read_with_its_path(tmp_path: Path) -> None:
    """runbook job-1 gives the rendered runbook and where it is."""

    async def scenario(rig: Rig) -> None:
        rig.submit("my-job")
        incident = an_incident(rig, "my-job")
        answer = commands.runbook(rig, {"incident": incident})
        path = rig.root.job("my-job") / "incidents" / "my-job-1.md"
        assert (answer["incident"], answer["path"]) == ("my-job-1", str(path))
        assert answer["text"].startswith("# Incident my-job-1: crash of job my-job\n")

    play(tmp_path, scenario)


# ---- events


@pytest.mark.parametrize(
    ("args", "name"),
    [({"attempt": 0}, "attempt"), ({"offset": -1}, "offset"), ({"attempt": "1"}, "attempt")],
)
def test_events_with_a_bad_cursor_are_refused(
    tmp_path: Path, args: dict[str, Any], name: str
) -> None:
    """events: attempt from 1, offset from 0, both integers."""

    async def scenario(rig: Rig) -> None:
        rig.submit("job")
        code, message = refused(lambda: commands.events(rig, {"job": "job", **args}))
        assert (code, message.split(" ")[0]) == ("control.bad_request", name)

    play(tmp_path, scenario)


def test_events_of_a_job_with_no_attempt_are_empty(tmp_path: Path) -> None:
    """A queued job has no lines yet: nothing, and a cursor at the start of attempt 1."""

    async def scenario(rig: Rig) -> None:
        rig.submit("job")
        assert commands.events(rig, {"job": "job"}) == {
            "events": [],
            "cursor": {"attempt": 1, "offset": 0},
            "state": "queued",
        }

    play(tmp_path, scenario)


def test_events_run_across_attempts_and_stop_at_an_unfinished_line(tmp_path: Path) -> None:
    """Complete lines only, a malformed one flagged, then on into the next attempt; the
    cursor points at the unfinished line, so a later request reads it once it is whole."""

    async def scenario(rig: Rig) -> None:
        record = rig.job_in("job", S.RUNNING)
        record.attempt = 2
        write_attempt(rig, "job", 1, "events.jsonl", b'{"event": "ready"}\nnot json\n')
        write_attempt(rig, "job", 2, "events.jsonl", b'{"event": "started"}\n{"event": "pro')
        answer = commands.events(rig, {"job": "job"})
        assert [(e["attempt"], e["event"]) for e in answer["events"]] == [
            (1, "ready"),
            (1, "malformed"),
            (2, "started"),
        ]
        assert answer["events"][1]["line"] == "not json"
        assert answer["cursor"] == {"attempt": 2, "offset": len(b'{"event": "started"}\n')}
        write_attempt(rig, "job", 2, "events.jsonl", b'{"event": "started"}\n{"event": "p"}\n')
        more = commands.events(rig, {"job": "job", **answer["cursor"]})
        assert [e["event"] for e in more["events"]] == ["p"]

    play(tmp_path, scenario)


def test_events_of_a_plain_program_are_its_output_lines(tmp_path: Path) -> None:
    """A plain program's output.log lines come as {"event": "output", "line"}."""

    async def scenario(rig: Rig) -> None:
        rig.job_in("plain", S.RUNNING, command=["/usr/bin/true"], sdk=False)
        write_attempt(rig, "plain", 1, "output.log", b'epoch 1\n{"event": "ready"}\n')
        answer = commands.events(rig, {"job": "plain"})
        assert answer["events"] == [
            {"attempt": 1, "event": "output", "line": "epoch 1"},
            {"attempt": 1, "event": "output", "line": '{"event": "ready"}'},
        ]

    play(tmp_path, scenario)


# ---- checkpoints, inspect, verify


def test_checkpoints_of_a_job_with_none_is_an_empty_list(tmp_path: Path) -> None:
    """checkpoints reads the job's directory in a thread: none yet, nothing listed."""

    async def scenario(rig: Rig) -> None:
        rig.submit("job")
        assert await commands.checkpoints(rig, {"job": "job"}) == []
        assert refused(lambda: commands.checkpoints(rig, {"job": "x"}))[0] == "control.no_such_job"

    play(tmp_path, scenario)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"step": -1}, ("control.bad_request", "step must be an integer from 0 to")),
        ({"step": True}, ("control.bad_request", "step must be an integer from 0 to")),
        ({"values": "yes"}, ("control.bad_request", "values must be a boolean")),
        ({}, ("control.no_such_checkpoint", "no committed checkpoint in")),
        ({"step": 4}, ("control.no_such_checkpoint", "no checkpoint of step 4 in")),
    ],
)
def test_inspect_refusals(tmp_path: Path, args: dict[str, Any], expected: tuple[str, str]) -> None:
    """inspect: a bad step or values argument, or no checkpoint where one is asked for."""

    async def scenario(rig: Rig) -> None:
        rig.submit("job")
        (rig.root.checkpoints / "job").mkdir()
        code, message = await refused_async(
            lambda: examine.inspect_job(rig, {"job": "job", **args})
        )
        assert (code, message[: len(expected[1])]) == expected

    play(tmp_path, scenario)


def test_verify_refusals(tmp_path: Path) -> None:
    """verify: an unknown job or reference is no_such_job; a job with no events unverifiable."""

    async def scenario(rig: Rig) -> None:
        rig.submit("job")
        rig.submit("reference")
        ghost = await refused_async(
            lambda: examine.verify_job(rig, {"job": "x", "reference": "job"})
        )
        no_reference = await refused_async(lambda: examine.verify_job(rig, {"job": "job"}))
        empty = await refused_async(
            lambda: examine.verify_job(rig, {"job": "job", "reference": "reference"})
        )
        assert (ghost, no_reference) == (
            ("control.no_such_job", "no job 'x'"),
            ("control.no_such_job", "no job None"),
        )
        assert (empty[0], empty[1].startswith(str(rig.root.job("reference")))) == (
            "control.unverifiable",
            True,
        )

    play(tmp_path, scenario)


# ---- submit


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        (None, "x", "name and content must be strings"),
        ("a.toml", None, "name and content must be strings"),
        ("a/b.toml", "x", "name: must be a plain file name (no '/')"),
        ("..", "x", "name: must be a plain file name (no '/')"),
        (".hidden.toml", "x", "name: must not start with '.'"),
        ("job.yaml", "x", "name: must end in .toml or .json"),
        ("j" * 124 + ".toml", "x", "name: over 128 bytes"),
        ("bad\x01name.toml", "x", "control characters"),
    ],
)
def test_a_submit_whose_name_is_not_plain_is_refused(
    tmp_path: Path, name: Any, content: Any, problem: str
) -> None:
    """submit: strings only, a plain *.toml or *.json name of at most 128 bytes; nothing is
    dropped into the spool."""

    async def scenario(rig: Rig) -> None:
        code, message = await refused_async(
            lambda: commands.submit(rig, {"name": name, "content": content})
        )
        assert (code, problem in message) == ("control.bad_request", True)
        assert list(rig.root.incoming.iterdir()) == []

    play(tmp_path, scenario)


def test_a_submit_of_exactly_128_bytes_is_taken_in(tmp_path: Path) -> None:
    """The name bound is inclusive: a 128-byte name is accepted and queued."""

    async def scenario(rig: Rig) -> None:
        name = "j" * 123 + ".toml"
        content = 'id = "bound"\ntask = "linreg"\n'
        answer = await commands.submit(rig, {"name": name, "content": content})
        assert answer == {"accepted": True, "job": "bound", "state": "queued", "warnings": []}
        assert (list(rig.queue), rig.stats.intake_accepted) == (["bound"], 1)

    play(tmp_path, scenario)


def test_a_submit_that_does_not_validate_is_rejected_with_its_problems(tmp_path: Path) -> None:
    """An invalid request is answered accepted: false, with its problems and where it is kept."""

    async def scenario(rig: Rig) -> None:
        answer = await commands.submit(rig, {"name": "bad.toml", "content": 'id = "bad"\n'})
        assert (answer["accepted"], answer["file"]) == (False, "bad.toml")
        assert answer["problems"] != []
        assert Path(answer["kept_at"]).parent == rig.root.rejected
        assert (rig.stats.intake_rejected, "bad" in rig.table) == (1, False)

    play(tmp_path, scenario)


def test_a_submit_while_the_daemon_stops_is_busy(tmp_path: Path) -> None:
    """Once the intake is closed, submit takes nothing in: control.busy."""

    async def scenario(rig: Rig) -> None:
        await rig.intake_queue.close()
        content = 'id = "late"\ntask = "linreg"\n'
        assert await refused_async(
            lambda: commands.submit(rig, {"name": "late.toml", "content": content})
        ) == ("control.busy", "the request was not taken in (daemon stopping)")

    play(tmp_path, scenario)


# ---- version, shutdown, metrics


def test_version_names_the_root_and_its_spool(tmp_path: Path) -> None:
    """version: the protocol and where a writer drops requests."""

    async def scenario(rig: Rig) -> None:
        answer = commands.version(rig)
        assert (answer["protocol"], answer["root"]) == (PROTOCOL_VERSION, str(rig.root.path))
        assert answer["spool"] == {
            "tmp": str(rig.root.spool_tmp),
            "incoming": str(rig.root.incoming),
            "rejected": str(rig.root.rejected),
        }

    play(tmp_path, scenario)


def test_shutdown_sets_the_stop_and_names_the_live_jobs(tmp_path: Path) -> None:
    """shutdown: the daemon's stop is set; the answer lists only jobs with a live worker."""

    async def scenario(rig: Rig) -> None:
        await rig.live("b")
        await rig.live("a")
        rig.job_in("resting", S.PREEMPTED)
        assert commands.shutdown(rig) == {"stopping": True, "live": ["a", "b"]}
        assert rig.stopping.is_set()

    play(tmp_path, scenario)


def test_metrics_of_a_table_count_jobs_by_state(tmp_path: Path) -> None:
    """metrics renders the Prometheus text from the View alone."""

    async def scenario(rig: Rig) -> None:
        rig.job_in("failed", S.FAILED)
        text = commands.handlers(rig, Lifecycle(rig))["metrics"]({})["text"]
        assert 'jobwarden_jobs{state="failed"} 1.0' in text
        assert 'jobwarden_jobs{state="running"} 0.0' in text

    play(tmp_path, scenario)


def test_a_request_file_kept_for_a_job_is_its_own_bytes(tmp_path: Path) -> None:
    """The rig takes jobs in as intake does: request, job.json and state.json in the folder."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("kept", run={"steps": 4})
        folder = rig.root.job("kept")
        assert json.loads((folder / "request.json").read_text())["run"]["steps"] == 4
        assert json.loads((folder / "job.json").read_text())["run"]["steps"] == 4
        assert (rig.saved_state("kept")["state"], record.job.run.steps) == ("queued", 4)

    play(tmp_path, scenario)
