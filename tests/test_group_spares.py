"""Group spares through a real wardend: a 2-process dp_mlp job's restart-all handed to N
members joined ahead of need, a group with a lost member discarded whole, a cancel."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from jobwarden.control.harness import job_text
from tests.daemon import ANY_STATE, Daemon, ctl
from tests.helpers import wait_until
from tests.test_program_spares import gone, naming
from tests.test_warm_spare import log_records, open_under

pytestmark = pytest.mark.slow

SLOW = {"step_delay_s": 1.5}
"""1.5 s per update of attempt 1: 30 s before update 20, time for the group to be ready on
a loaded machine (its members prepare in 5 to 20 s)."""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One wardend for the module; each test its own job."""
    base = tmp_path_factory.mktemp("groups")
    with Daemon(base / "root", base / "cache") as running:
        yield running


def drop(daemon: Daemon, job: str, steps: int, **faults: Any) -> None:
    """A 2-process dp_mlp job, a checkpoint every 4 updates, attempt 1 slowed down."""
    run = {"steps": steps, "checkpoint_every": 4, "processes": 2}
    sections = {"run": run, "faults": {**SLOW, **faults}, "supervision": {"stall_timeout_s": 60}}
    daemon.drop(f"{job}.toml", job_text(job, job, task="dp_mlp", **sections))
    daemon.wait(job, ANY_STATE, timeout=30)


def group_ready(daemon: Daemon, job: str, nth: int = 1) -> list[int]:
    """The member pids of the job's ``nth`` group that reported ready."""
    ready = wait_until(
        lambda: [r for r in log_records(daemon, "spare.ready") if r.get("job") == job],
        lambda found: len(found) >= nth,
        timeout=120,
        what="a group spare ready",
    )
    pids: list[int] = ready[nth - 1]["pids"]
    return pids


def member_events(daemon: Daemon, job: str, attempt: int) -> list[list[dict[str, Any]]]:
    """Each member's events of ``attempt`` (events.jsonl, events.1.jsonl)."""
    folder = daemon.attempt_folder(job, attempt)
    return [
        [json.loads(line) for line in (folder / name).read_text().splitlines() if line.strip()]
        for name in ("events.jsonl", "events.1.jsonl")
    ]


def started_pids(daemon: Daemon, job: str, attempt: int) -> list[int]:
    """Each member's pid in its ``started`` event of ``attempt``."""
    return [
        next(e["pid"] for e in events if e["event"] == "started")
        for events in member_events(daemon, job, attempt)
    ]


def members_record(daemon: Daemon, job: str, attempt: int) -> dict[str, Any]:
    """The attempt's members.json."""
    path = daemon.attempt_folder(job, attempt) / "members.json"
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def test_a_member_crash_is_recovered_on_the_group_spare_verified_per_member(
    daemon: Daemon,
) -> None:
    """Member 1 killed after update 20: attempt 2 is the waiting group, each member handed its
    files, the replay verified in each member, both ending in one state."""
    drop(daemon, "grp", 40, crash_after=20, process=1)
    group = group_ready(daemon, "grp")
    checkpoints = daemon.root / "checkpoints"
    assert [open_under(pid, checkpoints) for pid in group] == [[], []]
    assert daemon.state("grp")["attempt"] == 1, "attempt 1 failed before the group was ready"
    status = daemon.wait("grp", timeout=180)
    handed = [r for r in log_records(daemon, "spare.handed") if r.get("job") == "grp"]
    (incident,) = daemon.incidents("grp")
    members = members_record(daemon, "grp", 2)["members"]
    finals = [[e for e in m if e["event"] == "completed"] for m in member_events(daemon, "grp", 2)]
    assert (status["state"], status["attempt"]) == ("completed", 2)
    assert sorted((r["attempt"], r["process"], r["pid"]) for r in handed) == [
        (2, 0, group[0]),
        (2, 1, group[1]),
    ]
    assert started_pids(daemon, "grp", 2) == group
    assert [e["event"] for e in member_events(daemon, "grp", 2)[0]][:3] == [
        "started",
        "restored",
        "ready",
    ]
    folder = daemon.attempt_folder("grp", 2)
    assert sorted(p.name for p in folder.glob("stderr*.log")) == ["stderr.1.log", "stderr.log"]
    assert (incident["kind"], incident["status"]) == ("crash", "verified")
    checks = incident["verification"]["checks"]
    assert [c["ok"] for c in checks] == [True] * len(checks) != []
    assert [(m["replay_ok"], m["exit_status"]) for m in members] == [(True, 0), (True, 0)]
    assert members[1]["replay_checks"] > 0
    assert finals[0][-1]["state_hash"] == finals[1][-1]["state_hash"]
    wait_until(lambda: all(gone(pid) for pid in group), timeout=10, what="the members gone")


@pytest.mark.parametrize(("job", "signum"), [("lost", signal.SIGKILL), ("hung", signal.SIGSTOP)])
def test_a_group_with_a_member_lost_while_waiting_is_discarded_and_recovery_is_cold(
    daemon: Daemon, job: str, signum: int
) -> None:
    """One member of the waiting group SIGKILLed (or stopped): the whole group goes, and a
    member failure of the job just after restarts it cold, still verified."""
    drop(daemon, job, 60)
    group = group_ready(daemon, job)
    os.kill(group[1], signum)
    job_member = wait_until(
        lambda: started_pids(daemon, job, 1) if daemon.state(job)["step"] else None,
        timeout=60,
        what="attempt 1 under way",
    )
    os.kill(job_member[1], signal.SIGKILL)
    status = daemon.wait(job, timeout=240)
    handed = [r for r in log_records(daemon, "spare.handed") if r.get("job") == job]
    (incident,) = daemon.incidents(job)
    assert (status["state"], status["attempt"]) == ("completed", 2)
    dropped = log_records(daemon, "spare.died") + log_records(daemon, "spare.discarded")
    assert handed == []
    assert [r for r in dropped if r.get("job") == job] != []
    assert not set(started_pids(daemon, job, 2)) & set(group)
    assert incident["status"] == "verified"
    assert members_record(daemon, job, 2)["members"][1]["replay_ok"]
    assert all(gone(pid) for pid in group)


def test_a_job_cancelled_while_its_group_waits_leaves_no_process(daemon: Daemon) -> None:
    """wardenctl cancel: the members and the waiting group, with every tree, are gone."""
    drop(daemon, "gone", 60)
    group = group_ready(daemon, "gone")
    folders = list((daemon.job_folder("gone") / "spares").iterdir())
    answer = ctl(daemon, "cancel", "gone")
    assert answer.returncode == 0, answer.stderr
    status = daemon.wait("gone", timeout=60)
    wait_until(lambda: all(gone(pid) for pid in group), timeout=10, what="the group gone")
    assert [naming(folder) for folder in folders] == [[]] * len(folders) != []
    attempt = daemon.attempt_folder("gone", 1)
    wait_until(lambda: naming(attempt) == [], timeout=10, what="the members gone")
    assert status["state"] == "cancelled"
