"""A link planted under a job's folder is refused: the job is escalated naming it, never stuck.

Each test plants a symlink to a folder or file outside the root at a path
the daemon is about to write for a running job (its incident log, its
``incidents/`` folder, the folder of its next attempt) or for a request it is
about to take (the staging folder ``jobs/+intake-<id>``), with a real wardend
and real workers.  Nothing outside the root may change; the job must end
``escalated`` with the path named, and its slot must be free for the next job.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.daemon import Daemon, linreg_job
from tests.helpers import wait_until

pytestmark = pytest.mark.slow

FAILING = {"fail_after": 3, "step_delay_s": 0.3}
"""Attempt 1 fails after its third update, about a second after it is ready."""


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the root, holding one file, that a planted link points at."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "target").write_text("keep\n")
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def state_file(daemon: Daemon, job: str) -> dict[str, object]:
    """The job's persisted state.json."""
    saved: dict[str, object] = json.loads((daemon.job_folder(job) / "state.json").read_text())
    return saved


def plant_while_running(daemon: Daemon, job: str, name: str, target: Path) -> Path:
    """Drop a failing job, wait until attempt 1 runs, and plant a link at ``jobs/<id>/name``."""
    daemon.drop(f"{job}.toml", linreg_job(job, faults=FAILING))
    daemon.wait(job, ("running",), timeout=60)
    link = daemon.job_folder(job) / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return link


def assert_next_job_runs(daemon: Daemon) -> None:
    """With one slot, a job queued after the refused one completes: the slot was freed."""
    daemon.drop("next.toml", linreg_job("next", run={"steps": 2}))
    assert daemon.wait("next", timeout=90)["state"] == "completed"


@pytest.mark.parametrize(
    ("name", "to_file"),
    [
        ("incidents.jsonl", True),
        ("incidents", False),
        ("attempts/2", False),
        ("attempts/2/stderr.log", True),
    ],
    ids=["incident-log", "incidents-folder", "attempt-folder", "attempt-stderr"],
)
def test_a_link_under_a_running_job_escalates_it_naming_the_path(
    tmp_path: Path, compile_cache: Path, outside: Path, name: str, to_file: bool
) -> None:
    """The failure's incident or the next attempt meets the link: escalated, unsafe_path."""
    before = snapshot(outside)
    with Daemon(tmp_path / "root", compile_cache, "--max-concurrent", "1") as daemon:
        link = plant_while_running(
            daemon, "linked", name, outside / "target" if to_file else outside
        )
        status = daemon.wait("linked", timeout=60)
        assert status["state"] == "escalated"
        assert status["reason"].startswith("unsafe_path: ")
        assert str(link) in status["reason"]
        saved = state_file(daemon, "linked")
        assert str(link) in str(saved["error"])
        assert saved["pid"] is None
        log = (daemon.root / "wardend.log").read_text()
        assert '"job.unsafe_path"' in log
        assert str(link) in log
        lines = [json.loads(x) for x in (daemon.root / "incidents.jsonl").read_text().splitlines()]
        refusals = [x for x in lines if x["job"] == "linked" and x["kind"] == "unsafe_path"]
        assert refusals
        assert refusals[-1]["status"] == "escalated"
        assert refusals[-1]["evidence"]["path"] == str(link)
        if name != "incidents":  # the incidents folder is the link: no snapshot there
            kept = [i for i in daemon.incidents("linked") if i["kind"] == "unsafe_path"]
            assert [i["status"] for i in kept] == ["escalated"]
        assert_next_job_runs(daemon)
        assert link.is_symlink()
    assert snapshot(outside) == before


def test_a_link_at_the_staging_folder_rejects_the_request_naming_it(
    tmp_path: Path, compile_cache: Path, outside: Path
) -> None:
    """jobs/+intake-<id> is a link: the request is rejected once, kept, its error names it."""
    before = snapshot(outside)
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        link = daemon.root / "jobs" / "+intake-staged"
        link.symlink_to(outside)
        daemon.drop("staged.toml", linreg_job("staged"))
        rejected = daemon.root / "spool" / "rejected"
        error_file = wait_until(
            lambda: sorted(rejected.glob("*.error.json")),
            timeout=30,
            what="the request's error file",
        )
        assert [p.name for p in error_file] == ["staged.toml.error.json"]
        problems = json.loads(error_file[0].read_text())["problems"]
        assert any(str(link) in problem for problem in problems)
        wait_until(
            lambda: os.listdir(daemon.root / "spool" / "claimed"),
            lambda left: left == [],
            timeout=10,
            what="the claimed request moved to rejected",
        )
        assert (rejected / "staged.toml").read_text() == linreg_job("staged")
        assert not daemon.job_folder("staged").exists()
        time.sleep(2.5)  # two rescans (--rescan-interval 1): the refusal is not retried
        assert "spool.error" not in (daemon.root / "wardend.log").read_text()
        assert link.is_symlink()
    assert snapshot(outside) == before
