"""The job lifecycle through a real daemon and wardenctl: cancel, remove, restart, signal,
retention, status --all, rejected requests, and inspect and verify through the socket."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.protocol import ControlError
from tests.daemon import ANY_STATE, Daemon, ctl, linreg_job
from tests.helpers import wait_until

SLOW = {"steps": 3000, "checkpoint_every": 100}
SLOW_FAULTS = {"step_delay_s": 0.01}  # the first attempt only: about 30 s, stopped long before


def running_past(daemon: Daemon, job: str, step: int = 20) -> dict[str, object]:
    """Wait until the job runs past ``step``; its status."""
    return wait_until(
        lambda: daemon.state(job),
        lambda s: s["state"] == "running" and s["step"] >= step,
        timeout=90,
        what=f"job {job} running past step {step}",
        retry=(ControlError,),
    )


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, compile_cache: Path) -> Iterator[Daemon]:
    """One daemon running one job at a time, so a second job stays queued."""
    root = tmp_path_factory.mktemp("lifecycle") / "root"
    with Daemon(root, compile_cache, "--max-concurrent", "1") as daemon:
        yield daemon


@pytest.mark.slow
def test_cancel_queued_at_once_and_running_after_a_commit(live: Daemon) -> None:
    """cancel: a queued job is cancelled at once; a running one commits, then is cancelled."""
    live.drop("hold.toml", linreg_job("hold", run=SLOW, faults=SLOW_FAULTS))
    running_past(live, "hold")
    live.drop("waiting.toml", linreg_job("waiting"))
    assert live.wait("waiting", ANY_STATE)["state"] == "queued"
    cancelled = ctl(live, "cancel", "waiting")
    assert cancelled.returncode == 0, cancelled.stderr
    assert "waiting: cancelled" in cancelled.stdout
    waiting = live.state("waiting")
    assert (waiting["state"], waiting["attempt"]) == ("cancelled", 0)
    stopping = ctl(live, "cancel", "hold")
    assert stopping.returncode == 0, stopping.stderr
    assert "then cancel" in stopping.stdout
    hold = live.wait("hold", ("cancelled",), timeout=60)
    assert [h["to"] for h in hold["history"]][-2:] == ["preempted", "cancelled"]
    assert hold["newest_checkpoint_step"] == hold["step"]
    exit_record = json.loads((live.job_folder("hold") / "attempts/1/exit.json").read_text())
    assert exit_record["stopped_by"] == "operator"
    again = ctl(live, "cancel", "hold", "nobody")
    assert again.returncode == 1
    assert "hold: ERROR control.bad_state" in again.stdout
    assert "nobody: ERROR control.no_such_job" in again.stdout
    assert ctl(live, "cancel", "nobody").returncode == 4


@pytest.mark.slow
def test_remove_archives_whole_and_frees_the_id(live: Daemon, tmp_path: Path) -> None:
    """remove moves a settled job's folder to archive/, status --all shows it, the id is free."""
    live.wait("hold", ("cancelled",))
    kept = sorted(p.name for p in live.job_folder("hold").rglob("*"))
    removed = ctl(live, "remove", "hold")
    assert removed.returncode == 0, removed.stderr
    [folder] = (live.root / "archive").glob("hold-*")
    assert folder.name in removed.stdout
    assert not live.job_folder("hold").exists()
    assert kept == sorted(p.name for p in folder.rglob("*") if p.name != "archived.json")
    note = json.loads((folder / "archived.json").read_text())
    assert (note["state"], note["reason"]) == ("cancelled", "removed by operator")
    assert ctl(live, "status", "hold").returncode == 4
    every = json.loads(ctl(live, "status", "--all", "--json").stdout)
    assert [(r["id"], r["state"]) for r in every["archived"]] == [("hold", "cancelled")]
    assert "hold" not in [r["id"] for r in every["jobs"]]
    text = ctl(live, "status", "--all").stdout
    assert "cancelled (archived)" in text
    assert f"archive/{folder.name}" in text
    spec = tmp_path / "hold.toml"
    spec.write_text(linreg_job("hold", "hold-fresh"))  # its old checkpoint is at a later step
    resubmitted = ctl(live, "submit", str(spec))
    assert resubmitted.returncode == 0, resubmitted.stdout + resubmitted.stderr
    assert live.wait("hold")["state"] == "completed"
    assert ctl(live, "archive", "hold").returncode == 0
    assert len(list((live.root / "archive").glob("hold-*"))) == 2


@pytest.mark.slow
def test_stop_and_cancel_several_names_and_all(live: Daemon) -> None:
    """stop A B and cancel all act on each job and report each; remove refuses a live job."""
    live.drop("one.toml", linreg_job("one", run=SLOW, faults=SLOW_FAULTS))
    live.drop("two.toml", linreg_job("two", run=SLOW, faults=SLOW_FAULTS))
    running_past(live, "one")
    assert live.state("two")["state"] == "queued"
    refused = ctl(live, "remove", "one")
    assert refused.returncode == 1
    assert "cancel it first" in refused.stdout
    stopped = ctl(live, "stop", "one", "two")
    assert stopped.returncode == 1  # two is queued: nothing to stop
    assert "one: stopping" in stopped.stdout
    assert "two: ERROR control.not_running" in stopped.stdout
    live.wait("one", ("preempted",), timeout=60)
    everything = ctl(live, "cancel", "all", "--json")
    assert everything.returncode == 0, everything.stdout
    named = {r["job"] for r in json.loads(everything.stdout)["results"]}
    assert {"one", "two"} <= named
    assert live.wait("two", ("cancelled",))["attempt"] <= 1
    assert live.wait("one", ("cancelled",))["state"] == "cancelled"
    assert ctl(live, "stop", "all").stdout.strip() == "no job to stop"
    assert ctl(live, "remove", "all").returncode == 0
    assert {"one", "two"}.isdisjoint(r["id"] for r in live.ask("status")["jobs"])


@pytest.mark.slow
def test_restart_and_signal(live: Daemon) -> None:
    """restart stops a job (it commits) and resumes it; signal USR1 dumps the worker's stack."""
    live.drop("again.toml", linreg_job("again", run=SLOW, faults=SLOW_FAULTS))
    status = running_past(live, "again")
    dump = ctl(live, "signal", "again", "USR1")
    assert dump.returncode == 0, dump.stderr
    assert f"pid {status['pid']}" in dump.stdout
    stderr = live.job_folder("again") / "attempts/1/stderr.log"
    wait_until(
        stderr.read_text, lambda t: "most recent call first" in t, timeout=20, what="a stack dump"
    )
    assert ctl(live, "signal", "again", "KILL").returncode == 1
    restarted = ctl(live, "restart", "again")
    assert restarted.returncode == 0, restarted.stderr
    done = live.wait("again", ("completed",), timeout=120)
    assert done["attempt"] == 2
    moves = [h["to"] for h in done["history"]]
    assert moves[-4:] == ["preempted", "queued", "starting", "running"] or "preempted" in moves
    second = live.events("again", 2)
    first = live.events("again", 1)
    preempted = next(e for e in first if e["event"] == "preempted")
    assert next(e for e in second if e["event"] == "restored")["step"] == preempted["step"]
    assert ctl(live, "signal", "again", "USR1").returncode == 1  # nothing runs now
    assert ctl(live, "restart", "again").returncode == 1  # completed: nothing to restart


@pytest.mark.slow
def test_escalated_job_removed_then_replaced(live: Daemon, tmp_path: Path) -> None:
    """After remove of an escalated job status exits 0; submit --replace starts one fresh."""
    live.drop("base.toml", linreg_job("base", "shared"))
    live.wait("base")
    changed = tmp_path / "inc.toml"
    changed.write_text(linreg_job("inc", "shared", train={"learning_rate": 0.05}))
    assert ctl(live, "submit", str(changed)).returncode == 0
    assert live.wait("inc")["state"] == "escalated"
    assert ctl(live, "status").returncode == 3
    runbook = ctl(live, "runbook", "inc-1").stdout
    assert "wardenctl remove inc" in runbook
    assert "submit --replace" in runbook
    assert ctl(live, "remove", "inc").returncode == 0
    assert ctl(live, "status").returncode == 0
    assert ctl(live, "submit", str(changed)).returncode == 0
    assert live.wait("inc")["state"] == "escalated"
    fresh = tmp_path / "fresh.toml"
    fresh.write_text(linreg_job("inc", "fresh", train={"learning_rate": 0.05}))
    replaced = ctl(live, "submit", "--replace", str(fresh))
    assert replaced.returncode == 0, replaced.stderr
    assert "archived as inc-" in replaced.stderr
    assert live.wait("inc")["state"] == "completed"
    assert ctl(live, "status").returncode == 0


def archive_of(daemon: Daemon, stderr: str) -> Path:
    """The archive folder a ``submit --replace`` names on its stderr."""
    name = re.search(r"archived as (\S+)", stderr)
    assert name, stderr
    return daemon.root / "archive" / name.group(1)


@pytest.mark.slow
def test_replace_warns_of_a_finished_or_other_config_checkpoint(
    live: Daemon, tmp_path: Path
) -> None:
    """submit --replace warns when the new job resumes the end of the run or another config."""
    same = tmp_path / "ended.toml"
    same.write_text(linreg_job("ended"))
    assert ctl(live, "submit", str(same)).returncode == 0
    live.wait("ended")
    replaced = ctl(live, "submit", "--replace", str(same))
    assert replaced.returncode == 0, replaced.stderr
    assert (
        "wardenctl submit: warning: job ended resumes checkpoint 'ended' at step 8, the end "
        "of its run (steps = 8): the job completes at once, training nothing; submit "
        "--replace --fresh to start from step 0" in replaced.stderr
    )
    assert live.wait("ended")["state"] == "completed"
    changed = tmp_path / "changed.toml"
    changed.write_text(linreg_job("ended", train={"learning_rate": 0.05}))
    answer = ctl(live, "submit", "--replace", "--json", str(changed))
    [warning] = json.loads(answer.stdout)["warnings"]
    assert warning.startswith(
        "job ended resumes checkpoint 'ended' at step 8, whose training config differs: "
        "learning_rate (saved 0.04, requested 0.05); a restore refuses it and the job escalates"
    )
    assert warning in answer.stderr
    assert live.wait("ended")["state"] == "escalated"


@pytest.mark.slow
def test_replace_fresh_archives_the_checkpoints_and_starts_at_step_0(
    live: Daemon, tmp_path: Path
) -> None:
    """submit --replace --fresh: the old checkpoints move to the archive, the new job of
    another config trains from step 0 to completion, and no warning is printed."""
    live.drop("anew.toml", linreg_job("anew"))
    live.wait("anew")
    changed = tmp_path / "anew.toml"
    changed.write_text(linreg_job("anew", train={"learning_rate": 0.05}))
    fresh = ctl(live, "submit", "--replace", "--fresh", str(changed))
    assert fresh.returncode == 0, fresh.stderr
    assert "warning" not in fresh.stderr
    folder = archive_of(live, fresh.stderr)
    assert f"its checkpoints archived as {folder.name}/checkpoint" in fresh.stderr
    kept = sorted(p.name for p in (folder / "checkpoint").glob("ckpt-*"))
    assert kept[-1] == "ckpt-0000000008.safetensors"
    assert json.loads((folder / "archived.json").read_text())["checkpoint"]["name"] == "anew"
    assert live.wait("anew")["state"] == "completed"
    events = live.events("anew", 1)
    assert "restored" not in [e["event"] for e in events]
    assert next(e["step"] for e in events if e["event"] == "progress") == 1


@pytest.mark.slow
def test_fresh_first_submit_archives_a_checkpoint_left_by_remove(
    live: Daemon, tmp_path: Path
) -> None:
    """remove keeps the checkpoints; submit --fresh of that id archives them alone and the
    job starts from step 0; status --all lists the job, not the directory."""
    spec = tmp_path / "left.toml"
    spec.write_text(linreg_job("left"))
    assert ctl(live, "submit", str(spec)).returncode == 0
    live.wait("left")
    assert ctl(live, "remove", "left").returncode == 0
    assert (live.root / "checkpoints" / "left").is_dir()
    fresh = ctl(live, "submit", "--fresh", str(spec))
    assert fresh.returncode == 0, fresh.stderr
    [alone] = (live.root / "archive" / "checkpoints").glob("left-*")
    assert f"checkpoint 'left' archived as checkpoints/{alone.name}" in fresh.stderr
    assert (alone / "ckpt-0000000008.safetensors").is_file()
    assert live.wait("left")["state"] == "completed"
    assert "restored" not in [e["event"] for e in live.events("left", 1)]
    every = json.loads(ctl(live, "status", "--all", "--json").stdout)["archived"]
    assert [r.get("error") for r in every] == [None] * len(every)
    assert "left" in [r["id"] for r in every]


@pytest.mark.slow
def test_fresh_is_refused_while_another_job_names_the_checkpoint(
    live: Daemon, tmp_path: Path
) -> None:
    """submit --replace --fresh of a job sharing its checkpoint: refused, nothing archived."""
    live.drop("first.toml", linreg_job("first", "common"))
    live.wait("first")
    spec = tmp_path / "second.toml"
    spec.write_text(linreg_job("second", "common"))
    assert ctl(live, "submit", str(spec)).returncode == 0
    live.wait("second")
    refused = ctl(live, "submit", "--replace", "--fresh", str(spec))
    assert refused.returncode == 1
    assert "checkpoint 'common' is also the checkpoint of job first" in refused.stderr
    assert live.state("second")["state"] == "completed"
    assert (live.root / "checkpoints" / "common").is_dir()


@pytest.mark.slow
def test_inspect_and_verify_through_the_socket(live: Daemon) -> None:
    """inspect JOB [STEP] and verify JOB REFERENCE answer through the daemon."""
    live.drop("origin.toml", linreg_job("origin", "origin"))  # its own: tests share a daemon
    live.wait("origin")
    newest = json.loads(ctl(live, "inspect", "origin", "--json").stdout)
    assert (newest["verdict"]["ok"], newest["step"]) == (True, 8)
    older = ctl(live, "inspect", "origin", "4")
    assert older.returncode == 0, older.stderr
    assert "step: 4" in older.stdout
    assert ctl(live, "inspect", "origin", "5").returncode == 4
    missing = ctl(live, "inspect", "no/such/ckpt-0000000004.safetensors")
    assert (missing.returncode, "no such file" in missing.stderr) == (2, True)
    assert "REFUSED" not in missing.stdout
    live.drop("copy.toml", linreg_job("copy", "copy", faults={"fail_after": 3}))
    assert live.wait("copy")["state"] == "completed"
    proven = ctl(live, "verify", "copy", "origin")
    assert proven.returncode == 0, proven.stdout + proven.stderr
    assert "PROVEN" in proven.stdout
    record = json.loads(ctl(live, "verify", "copy", "origin", "--json").stdout)
    assert record["proven"] is True
    assert record["restored_steps"] == [2]
    assert ctl(live, "verify", "copy", "nobody").returncode == 4
    assert ctl(live, "verify", "copy", "some/file.jsonl").returncode == 2


@pytest.mark.slow
def test_rejected_lists_problems_newest_last(live: Daemon) -> None:
    """wardenctl rejected lists each rejected request with its problems, newest last."""
    live.drop("first-bad.toml", 'id = "x"\ntask = "linreg"\n[train]\nmomentum = 2\n')
    wait_until(
        lambda: ctl(live, "rejected", "--json").stdout,
        lambda out: "first-bad.toml" in out,
        timeout=20,
        what="the first rejection",
    )
    live.drop("second-bad.toml", "not toml at all [")
    data = wait_until(
        lambda: json.loads(ctl(live, "rejected", "--json").stdout),
        lambda d: d["count"] >= 2,
        timeout=20,
        what="two rejections",
    )
    names = [r["submitted_as"] for r in data["rejected"]]
    assert names.index("first-bad.toml") < names.index("second-bad.toml")
    assert any("momentum" in p for p in data["rejected"][names.index("first-bad.toml")]["problems"])
    text = ctl(live, "rejected", "-n", "1").stdout
    assert "second-bad.toml" in text
    assert "first-bad.toml" not in text


@pytest.mark.slow
def test_keep_finished_archives_the_oldest(tmp_path: Path, compile_cache: Path) -> None:
    """--keep-finished 1 archives the older completed job; a failed one is left for a person."""
    with Daemon(tmp_path / "root", compile_cache, "--keep-finished", "1") as daemon:
        daemon.drop("a.toml", linreg_job("a", "a"))
        daemon.wait("a")
        daemon.drop("b.toml", linreg_job("b", "b"))
        daemon.wait("b")
        wait_until(
            lambda: [r["id"] for r in daemon.ask("status")["jobs"]],
            lambda ids: ids == ["b"],
            timeout=10,
            what="only b left in the table",
        )
        archived = daemon.ask("archived")
        assert [(r["id"], r["archived_reason"]) for r in archived] == [
            ("a", "retention: --keep-finished 1")
        ]
        assert (Path(daemon.root / "archive" / archived[0]["folder"]) / "state.json").is_file()
    assert daemon.stop(signal.SIGTERM) == 0


@pytest.mark.slow
def test_keep_finished_days_archives_by_age(tmp_path: Path, compile_cache: Path) -> None:
    """--keep-finished-days: a completed job settled longer ago than that is archived; one
    that failed stays for a person, however old."""
    days = 2 / 86400  # two seconds
    with Daemon(tmp_path / "root", compile_cache, "--keep-finished-days", f"{days!r}") as daemon:
        daemon.drop("done.toml", linreg_job("done", "done"))
        daemon.drop(
            "bad.toml",
            linreg_job("bad", "bad", faults={"fail_after": 1}, supervision={"max_restarts": 0}),
        )
        daemon.wait("done")
        daemon.wait("bad")
        wait_until(
            lambda: [r["id"] for r in daemon.ask("status")["jobs"]],
            lambda ids: ids == ["bad"],
            timeout=20,
            what="the completed job archived by its age",
        )
        (archived,) = daemon.ask("archived")
        assert archived["id"] == "done"
        assert archived["archived_reason"].startswith("retention: --keep-finished-days ")
    assert daemon.stop(signal.SIGTERM) == 0
