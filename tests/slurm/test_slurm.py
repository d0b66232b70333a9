"""wardend --launcher slurm on a real single-node Slurm: every attempt is a Slurm job."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from jobwarden.daemon.launch.slurm.state import SlurmJob
from jobwarden.proof import verify
from jobwarden.protocol import ControlError
from tests.daemon import Daemon, linreg_job
from tests.helpers import AttemptResult, job, run_worker, wait_until
from tests.slurm.cluster import Cluster

pytestmark = pytest.mark.slow
LONG_RUN = {"steps": 40, "checkpoint_every": 5}
SLOW = {"step_delay_s": 0.2}  # the first attempt only: about 8 s, stopped long before its end


@pytest.fixture(scope="module")
def long_reference(tmp_path_factory: pytest.TempPathFactory, compile_cache: Path) -> AttemptResult:
    """The uninterrupted run of LONG_RUN, on this box without Slurm."""
    base = tmp_path_factory.mktemp("slurm-long-reference")
    spec = job(base / "ref.toml", "ref", run=LONG_RUN)
    result = run_worker(spec, base / "checkpoints", base / "run", compile_cache)
    assert result.exit_status == 0
    return result


@pytest.fixture
def wardend(slurm: Cluster, tmp_path: Path, compile_cache: Path) -> Any:
    """A wardend whose attempts are Slurm jobs of the session's cluster."""
    options = ("--slurm-partition", "debug", "--slurm-extra=--comment=jobwarden-test")
    with Daemon(tmp_path / "root", compile_cache, "--launcher", "slurm", *options) as daemon:
        yield daemon


def slurm_record(daemon: Daemon, cluster: Cluster, job_id: str, attempt: int) -> SlurmJob:
    """What Slurm says of the job that ran ``attempt``."""
    folder = daemon.job_folder(job_id) / "attempts" / str(attempt)
    slurm_job = json.loads((folder / "slurm.json").read_text())["slurm_job"]
    return wait_until(
        lambda: SlurmJob.from_show(cluster.run("scontrol", "-o", "show", "job", slurm_job)),
        lambda found: found.phase.value in ("ended", "requeued"),
        timeout=30,
        what=f"Slurm job {slurm_job} ended",
    )


def test_a_job_completes_as_one_slurm_job(wardend: Daemon, slurm: Cluster) -> None:
    """One attempt, one Slurm job named after it, COMPLETED; its events kept by the daemon;
    the daemon's partition and sbatch options and the job's [slurm] time limit applied."""
    wardend.drop("ok.toml", linreg_job("ok", slurm={"time_limit": "10"}))
    status = wardend.wait("ok", timeout=90)
    ended = slurm_record(wardend, slurm, "ok", 1)
    shown = slurm.run("scontrol", "-o", "show", "job", ended.job_id)
    kinds = [e["event"] for e in wardend.events("ok", 1)]
    assert (status["state"], status["attempt"], ended.state) == ("completed", 1, "COMPLETED")
    assert "JobName=jw-ok-1 " in shown
    for field in ("Partition=debug ", "TimeLimit=00:10:00 ", "Comment=jobwarden-test "):
        assert field in shown
    assert (kinds[0], kinds[-1], kinds.count("progress")) == ("started", "completed", 8)


def test_a_crash_is_resubmitted_and_its_replay_verified(wardend: Daemon, slurm: Cluster) -> None:
    """fail_after 3: a second Slurm job resumes from step 2 and update 3 is verified."""
    wardend.drop("crash.toml", linreg_job("crash", faults={"fail_after": 3}))
    status = wardend.wait("crash", timeout=120)
    (incident,) = wardend.incidents("crash")
    first, second = (slurm_record(wardend, slurm, "crash", n) for n in (1, 2))
    assert (status["state"], status["attempt"]) == ("completed", 2)
    assert (incident["kind"], incident["status"], incident["recovery_point"]["step"]) == (
        "crash",
        "verified",
        2,
    )
    assert (first.state, first.exit_code, second.state) == ("FAILED", 10, "COMPLETED")
    assert first.job_id != second.job_id


def test_stop_commits_through_sigterm_and_resume_continues_exactly(
    wardend: Daemon, long_reference: AttemptResult
) -> None:
    """wardenctl stop: the worker commits on SIGTERM, preempted; resume: the reference run."""
    wardend.drop("long.toml", linreg_job("long", run=LONG_RUN, faults=SLOW))
    wait_until(
        lambda: wardend.state("long"),
        lambda status: (status["step"] or 0) >= 7,
        timeout=90,
        what="job long past step 7",
        retry=(ControlError,),
    )
    shown = wardend.state("long")["process_status"]
    wardend.ask("stop", job="long")
    stopped = wardend.wait("long", ("preempted",), timeout=60)
    preempted = [e for e in wardend.events("long", 1) if e["event"] == "preempted"]
    wardend.ask("resume", job="long")
    done = wardend.wait("long", timeout=90)
    report = verify.verify(
        verify.load_run(long_reference.folder), verify.load_run(wardend.job_folder("long"))
    )
    assert shown.startswith("slurm ")
    assert " R" in shown
    assert (stopped["state"], len(preempted), done["state"]) == ("preempted", 1, "completed")
    assert report.proven, verify.render(report)


def test_slurm_requeue_of_a_running_attempt_is_a_preemption(
    wardend: Daemon, slurm: Cluster
) -> None:
    """scontrol requeue: the attempt ends as preempted, Slurm's rerun is cancelled, and the
    next attempt (a new Slurm job) resumes and is verified."""
    wardend.drop("rq.toml", linreg_job("rq", run=LONG_RUN, faults=SLOW))
    wait_until(
        lambda: wardend.state("rq"),
        lambda status: (status["step"] or 0) >= 6,
        timeout=90,
        what="job rq past step 6",
        retry=(ControlError,),
    )
    first = json.loads((wardend.job_folder("rq") / "attempts" / "1" / "slurm.json").read_text())[
        "slurm_job"
    ]
    slurm.run("scontrol", "requeue", first)
    done = wardend.wait("rq", timeout=120)
    incidents = wardend.incidents("rq")
    requeued = SlurmJob.from_show(slurm.run("scontrol", "-o", "show", "job", first))
    assert (done["state"], done["attempt"]) == ("completed", 2)
    assert [(i["kind"], i["status"]) for i in incidents] == [("preemption", "verified")]
    assert (requeued.state, requeued.restarts) == ("CANCELLED", 1)


def test_a_killed_daemon_adopts_its_running_slurm_job(
    slurm: Cluster, tmp_path: Path, compile_cache: Path, long_reference: AttemptResult
) -> None:
    """kill -9 of wardend while attempt 1 runs: the restarted daemon follows the same Slurm
    job by its recorded id (no second one is submitted) and the job completes exactly."""
    daemon = Daemon(tmp_path / "root", compile_cache, "--launcher", "slurm")
    with daemon:
        daemon.drop("adopt.toml", linreg_job("adopt", run=LONG_RUN, faults=SLOW))
        wait_until(
            lambda: daemon.state("adopt"),
            lambda status: (status["step"] or 0) >= 5,
            timeout=90,
            what="job adopt past step 5",
            retry=(ControlError,),
        )
        daemon.stop(signal.SIGKILL)
        daemon.start()
        done = daemon.wait("adopt", timeout=90)
        incidents = daemon.incidents("adopt")
    listed = slurm.run("scontrol", "-o", "show", "job").splitlines()
    submitted = [line for line in listed if "JobName=jw-adopt-" in line]
    report = verify.verify(
        verify.load_run(long_reference.folder), verify.load_run(daemon.job_folder("adopt"))
    )
    log = (daemon.root / "wardend.log").read_text().splitlines()
    adopted = [json.loads(line) for line in log if '"attempt.adopted"' in line]
    assert [r["attempt"] for r in adopted] == [1]
    assert (done["state"], done["attempt"], incidents) == ("completed", 1, [])
    assert len(submitted) == 1
    assert "JobState=COMPLETED" in submitted[0]
    assert report.proven, verify.render(report)


def test_a_stall_is_cancelled_and_its_recovery_verified(wardend: Daemon, slurm: Cluster) -> None:
    """The worker hangs after update 3: no progress for 3 s, its stacks are dumped and the
    Slurm job ended through scancel, a new one resumes from step 2, update 3 verified."""
    faults = {"stall_at": 3, "stall_seconds": 120}
    wardend.drop("hang.toml", linreg_job("hang", faults=faults, supervision={"stall_timeout_s": 3}))
    status = wardend.wait("hang", timeout=120)
    (incident,) = wardend.incidents("hang")
    first, second = (slurm_record(wardend, slurm, "hang", n) for n in (1, 2))
    assert (status["state"], status["attempt"]) == ("completed", 2)
    assert (incident["kind"], incident["status"], incident["recovery_point"]["step"]) == (
        "stall",
        "verified",
        2,
    )
    assert (first.state, second.state) == ("CANCELLED", "COMPLETED")
    dump = wardend.job_folder("hang") / "attempts" / "1" / "stack-dump.txt"
    assert "in before_update" in dump.read_text()  # SIGUSR1 reached the worker by scancel
