"""wardend end to end: jobs dropped into a real daemon's spool, real workers, real recovery."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.checkpoint import format
from jobwarden.proof import verify
from jobwarden.testfaults import ENV, Fault
from jobwarden.worker.command import worker_argv
from tests.daemon import ANY_STATE, Daemon, linreg_job
from tests.helpers import AttemptResult, job, kinds, run_worker, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def daemon(tmp_path: Path, compile_cache: Path) -> Iterator[Daemon]:
    """A running wardend on a fresh root, sharing the session's compilation cache."""
    with Daemon(tmp_path / "root", compile_cache) as running:
        yield running


def final_arrays(path: Path) -> dict[str, bytes]:
    """The raw bytes of every leaf of a checkpoint file."""
    return {p: a.tobytes() for p, a in format.read(path).arrays.items()}


def reference_final(reference: AttemptResult) -> dict[str, bytes]:
    """The uninterrupted default run's final state."""
    return final_arrays(Path(kinds(reference, "completed")[0]["file"]))


def newest(folder: Path) -> Path:
    """The newest committed checkpoint file in a directory."""
    return sorted(folder.glob("ckpt-*.safetensors"))[-1]


def test_crash_is_recovered_verified_and_completes_exactly(
    daemon: Daemon, reference: AttemptResult
) -> None:
    """fail after 3 -> incident -> resumed from 2 -> update 3 verified against the log -> done."""
    daemon.drop("crash.toml", linreg_job("crash", faults={"fail_after": 3}))
    status = daemon.wait("crash")
    assert status["state"] == "completed"
    assert status["attempt"] == 2
    (incident,) = daemon.incidents("crash")
    assert incident["kind"] == "crash"
    assert incident["status"] == "verified"
    assert incident["boundary"]["last_logged_step"] == 3
    assert incident["boundary"]["checkpoint_step"] == 2
    assert incident["recovery_point"]["step"] == 2
    assert incident["replayed_steps"] == [3]
    checks = incident["verification"]["checks"]
    assert [(c["what"], c["step"], c["ok"]) for c in checks] == [
        ("restored state", 2, True),
        ("update", 3, True),
    ]
    failed_log = {
        e["step"]: e["state_hash"] for e in daemon.events("crash", 1) if e["event"] == "progress"
    }
    assert checks[1]["logged"] == failed_log[3] == checks[1]["found"]
    assert final_arrays(newest(daemon.root / "checkpoints" / "crash")) == reference_final(reference)
    runbook = (daemon.job_folder("crash") / "incidents" / "crash-1.md").read_text()
    for section in (
        "Symptom",
        "Evidence preserved",
        "Failure boundary",
        "Recovery point",
        "Action",
        "Work replayed",
        "Verification",
        "Outcome",
        "Prevention",
    ):
        assert f"## {section}\n" in runbook
    assert "First replayed update, step 3" in runbook
    records = [
        json.loads(line) for line in (daemon.root / "incidents.jsonl").read_text().splitlines()
    ]
    assert {r["event"] for r in records} >= {"incident.detected", "incident.verified"}
    assert all(r["incident"] == "crash-1" for r in records)
    assert status["replayed_updates"] == 1


def test_stall_is_detected_dumped_and_recovered(daemon: Daemon, reference: AttemptResult) -> None:
    """A 60 s stall before update 6, timeout 2 s: caught within 2.25 s, stack dumped, resumed."""
    daemon.drop(
        "stall.toml",
        linreg_job(
            "stall", faults={"stall_at": 5, "stall_seconds": 60}, supervision={"stall_timeout_s": 2}
        ),
    )
    status = daemon.wait("stall", timeout=60)
    assert status["state"] == "completed"
    (incident,) = daemon.incidents("stall")
    assert incident["kind"] == "stall"
    details = incident["details"]
    assert 2.0 <= details["gap_s"] <= 2.25
    assert details["last_event"]["event"] == "stall_injected"
    assert details["last_progress"]["step"] == 5
    assert "before_update" in details["stack_dump"]
    assert details["psutil_status"] in ("sleeping", "disk-sleep")
    assert details["cpu_during_gap"]["percent"] < 20
    assert incident["recovery_point"]["step"] == 4
    assert incident["status"] == "verified"
    assert [c["step"] for c in incident["verification"]["checks"]] == [4, 5]
    history = [h["to"] for h in status["history"]]
    assert history[:5] == ["queued", "starting", "running", "stalled", "recovering"]
    assert final_arrays(newest(daemon.root / "checkpoints" / "stall")) == reference_final(reference)


def test_duplicate_writers_are_refused_and_touch_nothing(
    daemon: Daemon, tmp_path: Path, compile_cache: Path
) -> None:
    """A second job on a live job's checkpoint, and a worker started by hand, are both refused."""
    daemon.drop(
        "owner.toml",
        linreg_job(
            "owner",
            "shared",
            faults={"stall_at": 2, "stall_seconds": 120},
            supervision={"stall_timeout_s": 120, "stop_grace_s": 1},
        ),
    )
    daemon.wait("owner", ("running",))
    ck = daemon.root / "checkpoints" / "shared"
    wait_until(
        (ck / "ckpt-0000000002.safetensors").exists, timeout=30, what="owner's step-2 checkpoint"
    )
    before = {p.name: p.read_bytes() for p in ck.rglob("*") if p.is_file()}
    daemon.drop("second.toml", linreg_job("second", "shared"))
    second = daemon.wait("second", ("escalated",), timeout=30)
    (incident,) = daemon.incidents("second")
    assert incident["kind"] == "duplicate_writer"
    assert "owner" in incident["symptom"]
    spec = tmp_path / "hand.toml"
    spec.write_text(linreg_job("owner", "shared"))
    hand = subprocess.run(
        worker_argv(spec, ck, compile_cache),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert hand.returncode == 11
    refusal = json.loads(hand.stdout.splitlines()[-1])
    assert refusal["code"] == "writer.locked"
    assert refusal["holder_pid"] == daemon.state("owner")["pid"]
    after = {p.name: p.read_bytes() for p in ck.rglob("*") if p.is_file()}
    assert after == before
    assert second["attempt"] == 0


BAD_REQUESTS: dict[str, bytes] = {
    "syntax.toml": b'id = "x\n',
    "syntax.json": b'{"id": "x", ',
    "types.toml": b'id = "types"\ntask = "linreg"\n[train]\nseed = "three"\n',
    "unknown.toml": b'id = "unknown"\ntask = "linreg"\ncolour = "red"\n',
    "range.toml": b'id = "range"\ntask = "linreg"\n[train]\nbatch_size = 0\n',
    "nan.toml": b'id = "nan"\ntask = "linreg"\n[train]\nlearning_rate = nan\n',
    "task.toml": b'id = "task"\ntask = "resnet"\n',
    "slash.toml": b'id = "slash"\ntask = "linreg"\ncheckpoint = "a/b"\n',
    "dotdot.toml": b'id = "dotdot"\ntask = "linreg"\ncheckpoint = ".."\n',
    "big.toml": b'id = "big"\ntask = "linreg"\n' + b"#" * 300_000 + b"\n",
    "dup.toml": b'id = "good"\ntask = "linreg"\n',
}


def test_bad_requests_are_rejected_with_their_errors_while_good_jobs_complete(
    daemon: Daemon, tmp_path: Path
) -> None:
    """Every invalid case lands in rejected/ beside an error file; the good jobs still run."""
    daemon.drop("good.toml", linreg_job("good", run={"steps": 2}))
    daemon.wait("good", ("queued", "starting", "running", "completed"), timeout=30)
    for name, data in BAD_REQUESTS.items():
        daemon.drop(name, data)
    target = tmp_path / "elsewhere.toml"
    target.write_text(linreg_job("linked"))
    os.symlink(target, daemon.root / "spool" / "incoming" / "link.toml")
    os.mkfifo(daemon.root / "spool" / "tmp" / "fifo.toml")
    os.rename(
        daemon.root / "spool" / "tmp" / "fifo.toml",
        daemon.root / "spool" / "incoming" / "fifo.toml",
    )
    daemon.drop("good2.json", json.dumps({"id": "good2", "task": "linreg", "run": {"steps": 2}}))
    assert daemon.wait("good")["state"] == "completed"
    assert daemon.wait("good2")["state"] == "completed"
    rejected = daemon.root / "spool" / "rejected"
    expected = {
        **dict.fromkeys(BAD_REQUESTS, ""),
        "link.toml": "symbolic link",
        "fifo.toml": "not a regular file",
    }
    expected.update(
        {
            "syntax.toml": "syntax",
            "syntax.json": "syntax",
            "types.toml": "train.seed",
            "unknown.toml": "colour: unknown field",
            "range.toml": "train.batch_size",
            "nan.toml": "finite",
            "task.toml": "unknown task 'resnet'",
            "slash.toml": "checkpoint:",
            "dotdot.toml": "checkpoint:",
            "big.toml": "over the",
            "dup.toml": "duplicate job id 'good'",
        }
    )
    # The daemon writes a request's error file, then moves the request beside it
    # (crash-safe: it is in the spool, or rejected with its error): wait for both.
    wait_until(
        lambda: [n for n in expected if not os.path.lexists(rejected / n)],
        lambda missing: len(list(rejected.glob("*.error.json"))) >= len(expected) and not missing,
        timeout=10,
        what=f"{len(expected)} requests and their error files in {rejected}",
    )
    for name, needle in expected.items():
        error = json.loads((rejected / f"{name}.error.json").read_text())
        assert any(needle in problem for problem in error["problems"]), (name, error)
        assert (rejected / name).is_symlink() or (rejected / name).exists()
    assert (rejected / "big.toml").read_bytes() == BAD_REQUESTS["big.toml"]
    assert os.readlink(rejected / "link.toml") == str(target)
    assert not list((daemon.root / "spool" / "incoming").iterdir())
    assert not list((daemon.root / "spool" / "claimed").iterdir())


LONG_RUN = {"steps": 120, "checkpoint_every": 25}


@pytest.fixture(scope="module")
def long_reference(tmp_path_factory: pytest.TempPathFactory, compile_cache: Path) -> AttemptResult:
    """The uninterrupted run of LONG_RUN, shared by the restart tests."""
    base = tmp_path_factory.mktemp("long-reference")
    spec = job(base / "ref.toml", "ref", run=LONG_RUN)
    result = run_worker(spec, base / "checkpoints", base / "run", compile_cache)
    assert result.exit_status == 0
    return result


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_daemon_stopped_mid_job_resumes_it_exactly_after_a_restart(
    tmp_path: Path, compile_cache: Path, long_reference: AttemptResult, sig: int
) -> None:
    """SIGTERM or kill -9 of wardend mid-job, then a restart: the job completes exactly."""
    wardend = Daemon(tmp_path / "root", compile_cache).start()
    try:
        # The delay is the first attempt's only: it keeps the job mid-run while wardend stops.
        wardend.drop("long.toml", linreg_job("long", run=LONG_RUN, faults={"step_delay_s": 0.02}))
        wardend.wait("long", ("running",))
        running = wait_until(
            lambda: wardend.state("long"),
            lambda status: status["step"] >= 30,
            timeout=60,
            what="job long past step 30",
        )
    finally:
        status = wardend.stop(sig)
    assert status == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
    pid = running["pid"]
    wait_until(lambda: not _alive(pid), timeout=10, what=f"the orphaned worker {pid} exiting")
    with Daemon(tmp_path / "root", compile_cache) as again:
        done = again.wait("long", timeout=90)
        assert done["state"] == "completed"
        incident = again.incidents("long")[-1]
        assert incident["kind"] == "daemon_restart"
    attempts = sorted((tmp_path / "root" / "jobs" / "long" / "attempts").iterdir())
    assert len(attempts) == 2
    report = verify.verify(
        verify.load_run(long_reference.folder), verify.load_run(tmp_path / "root" / "jobs" / "long")
    )
    assert report.proven, verify.render(report)
    for folder in attempts:
        codes = [
            e.get("code")
            for e in map(json.loads, (folder / "events.jsonl").read_text().splitlines())
            if e.get("event") == "failed"
        ]
        assert "writer.locked" not in codes
    writer = json.loads((tmp_path / "root" / "checkpoints" / "long" / "writer.json").read_text())
    assert writer["generation"] == 2
    restored, logged = incident["recovery_point"]["step"], incident["boundary"]["last_logged_step"]
    if sig == signal.SIGTERM:
        # The worker logged the step it committed: the restored state is checked against the log.
        assert (incident["status"], restored) == ("verified", logged), incident["verification"]
    else:
        # kill -9: the orphan finished its update and committed it, but that update's event went
        # to the dead daemon's pipe. The restored step is past the log, so nothing can be
        # compared; the comparison with the reference above is the proof.
        assert incident["status"] == "unverified", incident["verification"]
        assert restored > logged


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_hundred_requests_at_once_are_all_accounted_for(daemon: Daemon) -> None:
    """100 files renamed in at once: every one completed or rejected, none lost."""
    names = []
    for index in range(100):
        if index % 4 == 0:
            text = linreg_job(f"burst{index:03d}", run={"steps": 2})
        else:
            text = f'id = "burst{index:03d}"\ntask = "linreg"\n[run]\nsteps = -{index}\n'
        names.append(f"burst{index:03d}.toml")
        tmp = daemon.root / "spool" / "tmp" / names[-1]
        tmp.write_text(text)
    for name in names:
        os.rename(daemon.root / "spool" / "tmp" / name, daemon.root / "spool" / "incoming" / name)
    good = [f"burst{i:03d}" for i in range(0, 100, 4)]
    for job_id in good:
        assert daemon.wait(job_id, timeout=240)["state"] == "completed"
    rejected = {p.name for p in (daemon.root / "spool" / "rejected").glob("*.toml")}
    assert rejected == {n for i, n in enumerate(names) if i % 4}
    assert len(daemon.ask("status")["jobs"]) == 25


def test_a_second_daemon_on_the_same_root_is_refused_naming_the_holder(daemon: Daemon) -> None:
    """One daemon per root: the second exits 73 and names the pid that holds the root."""
    assert daemon.proc is not None
    second = subprocess.run(
        [sys.executable, "-m", "jobwarden.daemon", "--root", str(daemon.root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert second.returncode == 73
    assert f"another wardend (pid {daemon.proc.pid}) already runs on {daemon.root}" in second.stderr
    assert daemon.ask("version")["pid"] == daemon.proc.pid


def test_memory_limit_stops_the_worker_and_is_an_incident(
    tmp_path: Path, compile_cache: Path
) -> None:
    """A worker over max_rss_mb is stopped; with no restarts left the job fails, recorded."""
    with Daemon(tmp_path / "root", compile_cache, "--sample-interval", "0.1") as daemon:
        daemon.drop(
            "fat.toml",
            linreg_job(
                "fat",
                faults={"step_delay_s": 0.5},
                supervision={"max_rss_mb": 20, "max_restarts": 0, "stop_grace_s": 2},
            ),
        )
        status = daemon.wait("fat", timeout=60)
        (incident,) = daemon.incidents("fat")
    assert status["state"] == "failed"
    assert incident["kind"] == "rss_limit"
    assert "max_rss_mb" in " ".join(incident["prevention"])
    measured = re.search(r"its resident memory, ([0-9.]+) MB, passed", incident["symptom"])
    assert measured, incident["symptom"]
    assert float(measured.group(1)) > 20
    assert "[supervision] max_rss_mb = 20" in incident["symptom"]
    exit_record = json.loads(
        (daemon.job_folder("fat") / "attempts" / "1" / "exit.json").read_text()
    )
    assert exit_record["stopped_by"] == "rss"


def test_queue_is_fifo_and_respects_max_concurrent(tmp_path: Path, compile_cache: Path) -> None:
    """With --max-concurrent 1, jobs start in arrival order and never overlap."""
    with Daemon(tmp_path / "root", compile_cache, "--max-concurrent", "1") as daemon:
        for name in ("first", "second", "third"):
            daemon.drop(f"{name}.toml", linreg_job(name, run={"steps": 2}))
            daemon.wait(name, ANY_STATE, timeout=30)
        spans = []
        for name in ("first", "second", "third"):
            history = daemon.wait(name)["history"]
            started = next(h["time"] for h in history if h["to"] == "starting")
            ended = next(h["time"] for h in history if h["to"] == "completed")
            spans.append((started, ended))
    assert spans == sorted(spans)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


def test_malformed_worker_output_is_kept_and_the_job_still_completes(
    tmp_path: Path, compile_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Garbage and oversized stdout lines are kept in events.jsonl, counted, never fatal."""
    monkeypatch.setenv(ENV, Fault.GARBAGE_ON_STDOUT.value)
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        daemon.drop("noisy.toml", linreg_job("noisy"))
        assert daemon.wait("noisy")["state"] == "completed"
        metrics = daemon.ask("metrics")["text"]
    kept = (daemon.job_folder("noisy") / "attempts" / "1" / "events.jsonl").read_bytes()
    assert kept.startswith(b"this is not an event\n")
    assert b"x" * (2 << 20) in kept
    assert b'"step": "three"' in kept
    assert "jobwarden_malformed_event_lines_total 3.0" in metrics
