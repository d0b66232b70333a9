"""The lifecycle handlers (`api.lifecycle`): stop, cancel, restart, remove, signal, rejected.

Called directly on a `Lifecycle` over the `Rig`: jobs that rest are records
moved through legal transitions, jobs that run have a real `JobSupervisor`
and a scripted attempt, so a stop really stops and a cancel really waits
for the worker to commit.  Each refusal, in each state it applies to, and
the ``all: true`` selections.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from jobwarden.daemon.api import lifecycle
from jobwarden.daemon.api.lifecycle import Lifecycle
from jobwarden.protocol import ControlError
from jobwarden.states import RESUMABLE, TERMINAL, JobState
from tests.scripted import Exit
from tests.unit.rig import Rig, play

S = JobState
RESTING = sorted(RESUMABLE, key=lambda s: s.value)
NOT_SETTLED = [S.QUEUED, S.STARTING, S.RUNNING, S.STALLED, S.RECOVERING, S.PREEMPTED]


@pytest.fixture(autouse=True)
def quick_follow_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel or restart waiting for its job to rest looks every millisecond."""
    monkeypatch.setattr(lifecycle, "POLL_S", 0.001)


def refused(call: Any) -> tuple[str, str]:
    """The code and message of the `ControlError` ``call()`` raises."""
    with pytest.raises(ControlError) as caught:
        call()
    return caught.value.code, caught.value.message


def outcome(answer: dict[str, Any]) -> list[tuple[str, bool, str | None]]:
    """(job, ok, error code) of each result of a multi-job answer."""
    return [
        (r["job"], r["ok"], r["error"]["code"] if not r["ok"] else None) for r in answer["results"]
    ]


# ---- selecting jobs


@pytest.mark.parametrize(
    "args",
    [{}, {"jobs": []}, {"jobs": "a"}, {"jobs": [1]}, {"jobs": ["a"] * 1001}, {"all": 1}],
)
@pytest.mark.parametrize("command", ["cancel", "restart", "remove"])
def test_a_selection_that_is_not_a_list_of_1_to_1000_ids_is_refused(
    tmp_path: Path, args: dict[str, Any], command: str
) -> None:
    """jobs must be a list of 1 to 1000 strings, or all: true (true itself, not 1)."""

    async def scenario(rig: Rig) -> None:
        handler = Lifecycle(rig).handlers()[command]
        assert refused(lambda: handler(args)) == (
            "control.bad_request",
            "jobs must be a list of 1 to 1000 job ids (or all: true)",
        )

    play(tmp_path, scenario)


def test_a_thousand_names_are_taken(tmp_path: Path) -> None:
    """The bound is inclusive: 1000 names, each answered (here: unknown)."""

    async def scenario(rig: Rig) -> None:
        names = [f"j{i}" for i in range(1000)]
        answer = Lifecycle(rig).handlers()["cancel"]({"jobs": names})
        assert len(answer["results"]) == 1000

    play(tmp_path, scenario)


def test_restart_all_is_refused(tmp_path: Path) -> None:
    """restart takes named jobs only: all: true is bad_request."""

    async def scenario(rig: Rig) -> None:
        rig.job_in("a", S.FAILED)
        assert refused(lambda: Lifecycle(rig).handlers()["restart"]({"all": True})) == (
            "control.bad_request",
            "all: not for this command",
        )
        assert rig.table.get("a").state is S.FAILED

    play(tmp_path, scenario)


def test_unknown_and_repeated_names_are_answered_once_each(tmp_path: Path) -> None:
    """An unknown name is its own failure and hides nothing; a name given twice counts once."""

    async def scenario(rig: Rig) -> None:
        rig.job_in("a", S.FAILED)
        answer = Lifecycle(rig).handlers()["cancel"]({"jobs": ["ghost", "a", "a"]})
        assert outcome(answer) == [("ghost", False, "control.no_such_job"), ("a", True, None)]
        assert answer["results"][0]["error"]["message"] == "no job 'ghost'"
        assert rig.table.get("a").state is S.CANCELLED

    play(tmp_path, scenario)


# ---- stop


@pytest.mark.parametrize("state", list(JobState))
def test_stop_of_one_job_that_has_no_worker_is_refused(tmp_path: Path, state: JobState) -> None:
    """stop job: in every state, a job no supervisor holds is not_running naming its state;
    an unknown one no_such_job."""

    async def scenario(rig: Rig) -> None:
        rig.job_in("idle", state)
        stop = Lifecycle(rig).handlers()["stop"]
        assert refused(lambda: stop({"job": "ghost"}))[0] == "control.no_such_job"
        assert refused(lambda: stop({"job": "idle"})) == (
            "control.not_running",
            f"job idle is {state.value}; nothing to stop",
        )

    play(tmp_path, scenario)


def test_stop_of_a_running_job_preempts_it(tmp_path: Path) -> None:
    """stop job: the worker gets SIGTERM, commits, and the job waits preempted."""

    async def scenario(rig: Rig) -> None:
        record, attempt = await rig.live("busy", supervision={"stop_grace_s": 3})
        answer = Lifecycle(rig).handlers()["stop"]({"job": "busy"})
        assert answer == {"job": "busy", "stopping": True, "pid": attempt.pid, "grace_s": 3.0}
        await rig.until_settled("busy")
        assert (record.state, attempt.received) == (S.PREEMPTED, ["stop(3)", "SIGTERM"])

    play(tmp_path, scenario)


def test_stop_of_several_jobs_answers_each(tmp_path: Path) -> None:
    """stop jobs: the running one is stopped, the resting one is not_running, both answered."""

    async def scenario(rig: Rig) -> None:
        await rig.live("busy")
        rig.job_in("resting", S.FAILED)
        answer = Lifecycle(rig).handlers()["stop"]({"jobs": ["busy", "resting"]})
        assert outcome(answer) == [("busy", True, None), ("resting", False, "control.not_running")]
        assert (answer["results"][0]["state"], answer["results"][0]["stopping"]) == (
            "running",
            True,
        )

    play(tmp_path, scenario)


def test_stop_all_takes_only_the_jobs_a_supervisor_holds(tmp_path: Path) -> None:
    """stop all: every held job, and no resting one."""

    async def scenario(rig: Rig) -> None:
        rig.job_in("queued", S.QUEUED)
        rig.job_in("resting", S.ESCALATED)
        await rig.live("one")
        await rig.live("two")
        answer = Lifecycle(rig).handlers()["stop"]({"all": True})
        assert outcome(answer) == [("one", True, None), ("two", True, None)]
        await rig.until(lambda: rig.settled == ["one", "two"] or rig.settled == ["two", "one"])
        assert [rig.table.get(j).state for j in ("one", "two")] == [S.PREEMPTED, S.PREEMPTED]

    play(tmp_path, scenario)


def test_stop_all_with_nothing_held_answers_no_result(tmp_path: Path) -> None:
    """stop all on a daemon with nothing running: an empty list, not a refusal."""

    async def scenario(rig: Rig) -> None:
        rig.job_in("resting", S.PREEMPTED)
        assert Lifecycle(rig).handlers()["stop"]({"all": True}) == {"results": []}

    play(tmp_path, scenario)


# ---- cancel


@pytest.mark.parametrize("state", sorted(TERMINAL, key=lambda s: s.value))
def test_cancel_of_a_finished_job_is_refused(tmp_path: Path, state: JobState) -> None:
    """cancel of a completed or cancelled job: bad_state, the job unchanged."""

    async def scenario(rig: Rig) -> None:
        rig.job_in("done", state)
        answer = Lifecycle(rig).handlers()["cancel"]({"jobs": ["done"]})
        assert outcome(answer) == [("done", False, "control.bad_state")]
        assert answer["results"][0]["error"]["message"] == f"job done is {state.value} already"

    play(tmp_path, scenario)


@pytest.mark.parametrize("state", [S.QUEUED, *RESTING])
def test_cancel_of_a_job_no_supervisor_holds_is_at_once(tmp_path: Path, state: JobState) -> None:
    """A queued, preempted, failed or escalated job is cancelled there and then."""

    async def scenario(rig: Rig) -> None:
        record = rig.job_in("idle", state)
        record.resume_on_start = True
        answer = Lifecycle(rig).handlers()["cancel"]({"jobs": ["idle"]})
        assert answer == {
            "results": [{"job": "idle", "ok": True, "state": "cancelled", "cancelling": False}]
        }
        step = "" if state is S.QUEUED else " at step 0"
        assert record.reason == f"cancelled by operator{step} (was {state.value})"
        assert rig.saved_state("idle")["resume_on_start"] is False

    play(tmp_path, scenario)


def test_cancel_of_a_running_job_waits_for_its_commit(tmp_path: Path) -> None:
    """A running job is preempted first and cancelled once it rests; a second cancel meanwhile
    says it is already under way."""

    async def scenario(rig: Rig) -> None:
        record, attempt = await rig.live("busy")
        life = Lifecycle(rig)
        first = life.handlers()["cancel"]({"jobs": ["busy"]})["results"][0]
        again = life.handlers()["cancel"]({"jobs": ["busy"]})["results"][0]
        assert (first["cancelling"], first["stopping"], first["pid"]) == (True, True, attempt.pid)
        assert (again["cancelling"], again["already"]) == (True, True)
        await rig.until(lambda: record.state is S.CANCELLED)
        assert rig.states(record)[-2:] == ["preempted", "cancelled"]
        assert attempt.received == ["stop(30)", "SIGTERM"]
        assert life.pending == {}

    play(tmp_path, scenario)


def test_cancel_during_a_restart_backoff_cancels_with_no_new_attempt(tmp_path: Path) -> None:
    """A job waiting its restart backoff is held but has no worker: the backoff is called off
    (preempted) and the job cancelled."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("waiting", supervision={"restart_backoff_s": 60})
        work = rig.worker(record)
        rig.launcher.plan("waiting", [*work.start(), Exit(1)], [*work.start(), Exit(1)])
        supervisor = await rig.launched(record)
        await rig.until(lambda: record.restarts == 2 and supervisor.attempt is None)
        answer = Lifecycle(rig).handlers()["cancel"]({"jobs": ["waiting"]})["results"][0]
        assert (answer["cancelling"], answer["stopping"]) == (True, False)
        await rig.until(lambda: record.state is S.CANCELLED)
        assert rig.states(record)[-2:] == ["preempted", "cancelled"]
        assert len(rig.launcher.attempts) == 2

    play(tmp_path, scenario)


def test_cancel_all_takes_every_job_not_finished(tmp_path: Path) -> None:
    """cancel all: queued and resting jobs, never a completed or cancelled one."""

    async def scenario(rig: Rig) -> None:
        rig.job_in("done", S.COMPLETED)
        rig.job_in("gone", S.CANCELLED)
        rig.job_in("queued", S.QUEUED)
        rig.job_in("failed", S.FAILED)
        answer = Lifecycle(rig).handlers()["cancel"]({"all": True})
        assert outcome(answer) == [("queued", True, None), ("failed", True, None)]
        assert [r.state for r in rig.table] == [S.COMPLETED, S.CANCELLED, S.CANCELLED, S.CANCELLED]

    play(tmp_path, scenario)


# ---- restart


@pytest.mark.parametrize("state", sorted(set(JobState) - RESUMABLE, key=lambda s: s.value))
def test_restart_of_a_job_that_neither_runs_nor_rests_is_refused(
    tmp_path: Path, state: JobState
) -> None:
    """restart of a job no supervisor holds that is not preempted, failed or escalated
    (queued, completed, cancelled...): bad_state naming what it applies to."""

    async def scenario(rig: Rig) -> None:
        rig.job_in("job", state)
        answer = Lifecycle(rig).handlers()["restart"]({"jobs": ["job"]})
        assert outcome(answer) == [("job", False, "control.bad_state")]
        assert answer["results"][0]["error"]["message"] == (
            f"job job is {state.value}; restart applies to running, preempted, failed or "
            "escalated jobs"
        )
        assert list(rig.queue) == []

    play(tmp_path, scenario)


@pytest.mark.parametrize("state", RESTING)
def test_restart_of_a_resting_job_queues_it_at_once(tmp_path: Path, state: JobState) -> None:
    """A preempted, failed or escalated job is queued again there and then."""

    async def scenario(rig: Rig) -> None:
        record = rig.job_in("job", state)
        answer = Lifecycle(rig).handlers()["restart"]({"jobs": ["job"]})
        assert answer == {
            "results": [{"job": "job", "ok": True, "state": "queued", "restarting": False}]
        }
        assert (record.state, list(rig.queue)) == (S.QUEUED, ["job"])

    play(tmp_path, scenario)


def test_restart_of_a_running_job_stops_it_then_queues_it(tmp_path: Path) -> None:
    """A running job is preempted, then queued again once it rests."""

    async def scenario(rig: Rig) -> None:
        record, attempt = await rig.live("busy")
        answer = Lifecycle(rig).handlers()["restart"]({"jobs": ["busy"]})["results"][0]
        assert (answer["restarting"], answer["stopping"]) == (True, True)
        await rig.until(lambda: record.state is S.QUEUED)
        assert rig.states(record)[-2:] == ["preempted", "queued"]
        assert (list(rig.queue), attempt.received) == (["busy"], ["stop(30)", "SIGTERM"])

    play(tmp_path, scenario)


# ---- remove and archived


@pytest.mark.parametrize("state", NOT_SETTLED)
def test_remove_of_a_job_that_is_not_settled_is_refused(tmp_path: Path, state: JobState) -> None:
    """remove applies to completed, cancelled, failed or escalated jobs: the folder stays."""

    async def scenario(rig: Rig) -> None:
        rig.job_in("job", state)
        answer = Lifecycle(rig).handlers()["remove"]({"jobs": ["job"]})
        assert outcome(answer) == [("job", False, "control.bad_state")]
        assert (rig.root.job("job").is_dir(), "job" in rig.table) == (True, True)

    play(tmp_path, scenario)


def test_remove_of_a_running_job_is_refused(tmp_path: Path) -> None:
    """A job a supervisor holds is not removed, whatever it is doing."""

    async def scenario(rig: Rig) -> None:
        await rig.live("busy")
        answer = Lifecycle(rig).handlers()["remove"]({"jobs": ["busy"]})
        assert answer["results"][0]["error"]["message"] == (
            "job busy is running; remove applies to completed, cancelled, failed or escalated "
            "jobs (cancel it first)"
        )

    play(tmp_path, scenario)


def test_a_job_removed_for_its_replacement_is_archived_as_replaced(tmp_path: Path) -> None:
    """remove with replacing (what submit --replace sends): the archive's reason says
    replaced, not removed by operator."""

    async def scenario(rig: Rig) -> None:
        rig.job_in("old", S.COMPLETED)
        life = Lifecycle(rig)
        answer = life.handlers()["remove"]({"jobs": ["old"], "replacing": True})["results"][0]
        archived = rig.root.path / "archive" / answer["archived"]
        assert json.loads((archived / "archived.json").read_text())["reason"] == (
            "replaced (wardenctl submit --replace)"
        )

    play(tmp_path, scenario)


def test_remove_archives_a_settled_job_whole_and_frees_its_id(tmp_path: Path) -> None:
    """remove: the folder moves into archive/ with its note, the id leaves the table, and
    archived lists it."""

    async def scenario(rig: Rig) -> None:
        rig.job_in("old", S.COMPLETED)
        life = Lifecycle(rig)
        answer = life.handlers()["remove"]({"jobs": ["old"]})["results"][0]
        archived = rig.root.path / "archive" / answer["archived"]
        assert (answer["ok"], answer["state"], "old" in rig.table) == (True, "completed", False)
        assert json.loads((archived / "archived.json").read_text())["reason"] == (
            "removed by operator"
        )
        assert rig.root.job("old").exists() is False
        [row] = await life.handlers()["archived"]({})
        assert (row["id"], row["state"], row["folder"]) == ("old", "completed", archived.name)

    play(tmp_path, scenario)


def test_remove_all_takes_every_settled_job_no_supervisor_holds(tmp_path: Path) -> None:
    """remove all: completed, cancelled, failed and escalated jobs; not queued or preempted."""

    async def scenario(rig: Rig) -> None:
        for state in (S.COMPLETED, S.CANCELLED, S.FAILED, S.ESCALATED, S.QUEUED, S.PREEMPTED):
            rig.job_in(state.value, state)
        answer = Lifecycle(rig).handlers()["remove"]({"all": True})
        assert [r["job"] for r in answer["results"]] == [
            "completed",
            "cancelled",
            "failed",
            "escalated",
        ]
        assert sorted(rig.table.records) == ["preempted", "queued"]

    play(tmp_path, scenario)


def checkpoint_dir(rig: Rig, name: str) -> Path:
    """A checkpoint directory ``name`` holding one file, as a worker leaves it."""
    directory = rig.root.checkpoints / name
    directory.mkdir(parents=True)
    (directory / "ckpt-0000000008.safetensors").write_bytes(b"committed")
    return directory


def test_remove_fresh_archives_the_checkpoint_directory_with_the_job(tmp_path: Path) -> None:
    """remove with fresh: the job's checkpoint directory moves into its archive folder, noted."""

    async def scenario(rig: Rig) -> None:
        rig.job_in("old", S.COMPLETED)
        directory = checkpoint_dir(rig, "old")
        life = Lifecycle(rig)
        args = {"jobs": ["old"], "replacing": True, "fresh": True}
        answer = life.handlers()["remove"](args)["results"][0]
        archived = rig.root.path / "archive" / answer["archived"]
        assert answer["checkpoint_archived"] == f"{archived.name}/checkpoint"
        assert directory.exists() is False
        assert (archived / "checkpoint" / "ckpt-0000000008.safetensors").read_bytes() == (
            b"committed"
        )
        note = json.loads((archived / "archived.json").read_text())
        assert note["checkpoint"] == {"name": "old", "from": str(directory), "to": "checkpoint"}

    play(tmp_path, scenario)


def test_remove_without_fresh_keeps_the_checkpoint_directory(tmp_path: Path) -> None:
    """remove alone: the checkpoint directory stays for a job that resumes it."""

    async def scenario(rig: Rig) -> None:
        rig.job_in("old", S.COMPLETED)
        directory = checkpoint_dir(rig, "old")
        answer = Lifecycle(rig).handlers()["remove"]({"jobs": ["old"]})["results"][0]
        assert (answer["checkpoint_archived"], directory.is_dir()) == (None, True)

    play(tmp_path, scenario)


def test_remove_fresh_of_a_checkpoint_another_job_names_is_refused(tmp_path: Path) -> None:
    """Two jobs of one checkpoint: remove fresh of one is refused, both stay as they were."""

    async def scenario(rig: Rig) -> None:
        rig.job_in("one", S.COMPLETED, checkpoint="both")
        rig.job_in("two", S.COMPLETED, checkpoint="both")
        directory = checkpoint_dir(rig, "both")
        life = Lifecycle(rig)
        [result] = life.handlers()["remove"]({"jobs": ["two"], "fresh": True})["results"]
        assert result["error"] == {
            "code": "control.bad_state",
            "message": "checkpoint 'both' is also the checkpoint of job one: remove that job "
            "first (with --fresh to archive the directory with it)",
        }
        assert (directory.is_dir(), sorted(rig.table.records)) == (True, ["one", "two"])

    play(tmp_path, scenario)


def test_archive_checkpoint_moves_a_directory_no_job_names(tmp_path: Path) -> None:
    """archive_checkpoint: the directory goes to archive/checkpoints/, which archived skips."""

    async def scenario(rig: Rig) -> None:
        directory = checkpoint_dir(rig, "left")
        life = Lifecycle(rig)
        answer = life.handlers()["archive_checkpoint"]({"checkpoint": "left"})
        assert answer["archived"].startswith("checkpoints/left-")
        kept = rig.root.path / "archive" / answer["archived"] / "ckpt-0000000008.safetensors"
        assert (kept.read_bytes(), directory.exists()) == (b"committed", False)
        assert await life.handlers()["archived"]({}) == []
        again = life.handlers()["archive_checkpoint"]({"checkpoint": "left"})
        assert again == {"checkpoint": "left", "archived": None}

    play(tmp_path, scenario)


@pytest.mark.parametrize("name", [None, 3, "", "..", "a/b", "x" * 65])
def test_archive_checkpoint_of_no_checkpoint_name_is_refused(tmp_path: Path, name: Any) -> None:
    """archive_checkpoint takes a checkpoint name as a job file gives it, nothing else."""

    async def scenario(rig: Rig) -> None:
        handler = Lifecycle(rig).handlers()["archive_checkpoint"]
        assert refused(lambda: handler({"checkpoint": name})) == (
            "control.bad_request",
            "checkpoint: a checkpoint name as a job file gives it",
        )

    play(tmp_path, scenario)


def test_archive_checkpoint_a_job_names_is_refused(tmp_path: Path) -> None:
    """A checkpoint directory a job in the table names stays where it is."""

    async def scenario(rig: Rig) -> None:
        rig.job_in("held", S.FAILED)
        directory = checkpoint_dir(rig, "held")
        handler = Lifecycle(rig).handlers()["archive_checkpoint"]
        assert refused(lambda: handler({"checkpoint": "held"}))[0] == "control.bad_state"
        assert directory.is_dir()

    play(tmp_path, scenario)


def test_archived_of_a_root_with_no_archive_is_empty(tmp_path: Path) -> None:
    """archived before anything was removed: an empty list."""

    async def scenario(rig: Rig) -> None:
        assert await Lifecycle(rig).handlers()["archived"]({}) == []

    play(tmp_path, scenario)


# ---- signal


@pytest.mark.parametrize("name", ["KILL", "SIGKILL", "9", 15, None, "SIGFOO", "SIGSIGTERM"])
def test_a_signal_that_is_not_allowed_is_refused(tmp_path: Path, name: Any) -> None:
    """signal: only the listed names (never KILL), before anything is sent."""

    async def scenario(rig: Rig) -> None:
        _, attempt = await rig.live("busy")
        code, message = refused(
            lambda: Lifecycle(rig).handlers()["signal"]({"job": "busy", "signal": name})
        )
        assert (code, message.startswith("signal must be one of CONT, HUP, INT,")) == (
            "control.bad_request",
            True,
        )
        assert attempt.received == []

    play(tmp_path, scenario)


@pytest.mark.parametrize(("name", "sent"), [("usr1", "SIGUSR1"), ("SIGUSR2", "SIGUSR2")])
def test_an_allowed_signal_reaches_the_live_worker(tmp_path: Path, name: str, sent: str) -> None:
    """signal: any case, with or without SIG, goes to the worker and names what was sent."""

    async def scenario(rig: Rig) -> None:
        _, attempt = await rig.live("busy")
        answer = Lifecycle(rig).handlers()["signal"]({"job": "busy", "signal": name})
        assert answer == {"job": "busy", "signal": sent, "pid": attempt.pid}
        assert attempt.received == [sent]

    play(tmp_path, scenario)


@pytest.mark.parametrize("state", list(JobState))
def test_a_signal_to_a_job_no_supervisor_holds_is_refused(tmp_path: Path, state: JobState) -> None:
    """signal: in every state, a job with no supervisor has no worker to signal."""

    async def scenario(rig: Rig) -> None:
        rig.job_in("idle", state)
        send = Lifecycle(rig).handlers()["signal"]
        assert refused(lambda: send({"job": "idle", "signal": "TERM"})) == (
            "control.not_running",
            f"job idle is {state.value}; no worker runs",
        )

    play(tmp_path, scenario)


def test_a_signal_to_a_job_with_no_worker_is_refused(tmp_path: Path) -> None:
    """signal of an unknown job, of a resting one, or of one waiting its restart backoff."""

    async def scenario(rig: Rig) -> None:
        send = Lifecycle(rig).handlers()["signal"]
        rig.job_in("resting", S.FAILED)
        record = rig.submit("waiting", supervision={"restart_backoff_s": 60})
        work = rig.worker(record)
        rig.launcher.plan("waiting", [*work.start(), Exit(1)], [*work.start(), Exit(1)])
        supervisor = await rig.launched(record)
        await rig.until(lambda: record.restarts == 2 and supervisor.attempt is None)
        assert refused(lambda: send({"job": "ghost", "signal": "TERM"}))[0] == (
            "control.no_such_job"
        )
        assert refused(lambda: send({"job": "resting", "signal": "TERM"})) == (
            "control.not_running",
            "job resting is failed; no worker runs",
        )
        assert refused(lambda: send({"job": "waiting", "signal": "TERM"})) == (
            "control.not_running",
            "job waiting is recovering; no worker runs",
        )
        assert signal.SIGTERM.name not in [r for a in rig.launcher.attempts for r in a.received]

    play(tmp_path, scenario)


# ---- rejected


@pytest.mark.parametrize("lines", [0, 10_001, "5", True])
def test_rejected_with_lines_out_of_bounds_is_refused(tmp_path: Path, lines: Any) -> None:
    """rejected: lines from 1 to 10,000."""

    async def scenario(rig: Rig) -> None:
        with pytest.raises(ControlError) as caught:
            await Lifecycle(rig).handlers()["rejected"]({"lines": lines})
        assert caught.value.code == "control.bad_request"

    play(tmp_path, scenario)


def test_rejected_lists_the_newest_error_files_last(tmp_path: Path) -> None:
    """rejected: each error file's problems, newest last, cut to lines; an error file that
    cannot be read, or is no object, is listed with that problem."""

    async def scenario(rig: Rig) -> None:
        rejected = rig.root.rejected
        for name, received in (("b.toml", 20), ("a.toml", 10), ("c.toml", 30)):
            record = {"file": name, "received": received, "problems": [f"{name} is bad"]}
            (rejected / f"{name}.error.json").write_text(json.dumps(record))
        (rejected / "d.toml.error.json").write_text("{not json")
        (rejected / "e.toml.error.json").write_text("[1]")
        handler = Lifecycle(rig).handlers()["rejected"]
        answer = await handler({"lines": 3})
        assert answer["count"] == 5
        assert [r["file"] for r in answer["rejected"]] == ["a.toml", "b.toml", "c.toml"]
        assert answer["rejected"][-1]["kept_at"] == str(rejected / "c.toml")
        everything = await handler({})
        problems = {r["file"]: r["problems"][0] for r in everything["rejected"]}
        assert problems["d.toml"].startswith("error file unreadable: ")
        assert problems["e.toml"] == "error file is not an object"

    play(tmp_path, scenario)


def test_rejected_of_an_empty_spool_is_empty(tmp_path: Path) -> None:
    """No rejection yet: a count of 0 and an empty list."""

    async def scenario(rig: Rig) -> None:
        assert await Lifecycle(rig).handlers()["rejected"]({}) == {"count": 0, "rejected": []}

    play(tmp_path, scenario)
