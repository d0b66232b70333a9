"""``[run] async_commit``: the write in the background, the contract unchanged.

Real worker processes and a real wardend: the checkpoint event after the file
is durable, a SIGKILL in the middle of a background commit, SIGTERM with a
commit in flight, the stall watch through a long background commit, and the
final state of an asynchronous run equal to a synchronous one's, bit for bit.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jobwarden.checkpoint import format
from jobwarden.checkpoint.store import file_name
from jobwarden.worker.command import worker_argv
from tests.conftest import Runner
from tests.daemon import Daemon, linreg_job
from tests.helpers import AttemptResult, job, kinds
from tests.test_restore import continues_exactly

ASYNC = {"async_commit": True}


def final_arrays(result: AttemptResult) -> dict[str, np.ndarray]:
    """The arrays of the checkpoint the completed event names."""
    return dict(format.read(Path(kinds(result, "completed")[0]["file"])).arrays)


def test_async_final_state_equals_a_synchronous_runs_bit_for_bit(
    worker: Runner, tmp_path: Path
) -> None:
    """mlp of a few MiB: every state hash, every checkpoint and the final arrays are equal."""
    train = {"width": 384, "depth": 2, "seed": 2}
    run = {"steps": 12, "checkpoint_every": 3, "keep_checkpoints": 8}
    sync = worker(job(tmp_path / "s.toml", "s", "mlp", train=train, run=run), tmp_path / "s")
    both = {**run, **ASYNC}
    background = worker(job(tmp_path / "a.toml", "a", "mlp", train=train, run=both), tmp_path / "a")
    assert (sync.exit_status, background.exit_status) == (0, 0)
    hashes = [[e["state_hash"] for e in kinds(r, "progress")] for r in (sync, background)]
    assert hashes[0] == hashes[1]
    commits = [kinds(r, "checkpoint") for r in (sync, background)]
    assert [c["step"] for c in commits[0]] == [c["step"] for c in commits[1]] == [3, 6, 9, 12]
    assert [c["state_hash"] for c in commits[0]] == [c["state_hash"] for c in commits[1]]
    assert [c["background"] for c in commits[1]] == [True] * 4
    assert [c["background"] for c in commits[0]] == [False] * 4
    expected, found = final_arrays(sync), final_arrays(background)
    assert sorted(expected) == sorted(found)
    for path, array in expected.items():
        assert array.dtype == found[path].dtype
        assert array.tobytes() == found[path].tobytes(), path


def read_event(stream: Any) -> dict[str, Any]:
    """The next event line of a worker's stdout."""
    line = stream.readline()
    assert line, "the worker's stdout ended"
    event: dict[str, Any] = json.loads(line)
    return event


def test_checkpoint_event_comes_after_the_file_is_durable_and_training_went_on(
    tmp_path: Path, compile_cache: Path
) -> None:
    """With each commit slowed before its replace, every checkpoint event finds its file in
    place and valid, and later updates were reported before it (the write did not block)."""
    ck = tmp_path / "ck"
    spec = job(
        tmp_path / "j.toml",
        run={"steps": 24, "checkpoint_every": 6, "keep_checkpoints": 8, **ASYNC},
        faults={"commit_delay_s": 0.4, "step_delay_s": 0.05},
    )
    argv = worker_argv(spec, ck, compile_cache)
    seen: list[dict[str, Any]] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        while not seen or seen[-1]["event"] != "completed":
            event = read_event(proc.stdout)
            if event["event"] == "checkpoint":
                path = Path(event["file"])
                assert path.name == file_name(event["step"])
                assert format.read(path).manifest.state_hash == event["state_hash"]
            seen.append(event)
    assert proc.returncode == 0
    order = [(e["event"], e.get("step")) for e in seen if e["event"] in ("progress", "checkpoint")]
    for index, (kind, step) in enumerate(order):
        if kind == "checkpoint" and step < 24:
            later = [s for k, s in order[:index] if k == "progress" and s > step]
            assert later, f"no update after {step} was reported before its checkpoint event"
    commits = [e for e in seen if e["event"] == "checkpoint"]
    assert [e["step"] for e in commits] == [6, 12, 18, 24]
    assert all(e["seconds"] >= 0.4 for e in commits)
    assert max(e["blocked_s"] for e in commits[:3]) < 0.2  # 0.3 s of updates between commits


@pytest.mark.slow
def test_crash_in_a_background_commit_leaves_the_previous_checkpoint_in_use(
    reference: AttemptResult, worker: Runner, tmp_path: Path
) -> None:
    """SIGKILL between the pending file's fsync and its replace, on the commit thread: step 2
    stays the newest, and the resume from it continues the uninterrupted run exactly."""
    ck = tmp_path / "ck"
    crashed = worker(
        job(tmp_path / "c.toml", "commit", run=ASYNC, faults={"crash_in_commit": 4}), ck
    )
    assert crashed.exit_status == -9
    assert sorted(p.name for p in ck.glob("ckpt-*")) == [file_name(2), file_name(4) + ".pending"]
    assert [e["step"] for e in kinds(crashed, "checkpoint")] == [2]
    resumed = worker(job(tmp_path / "r.toml", "commit", run=ASYNC), ck)
    restored = kinds(resumed, "restored")[0]
    assert restored["step"] == 2
    assert restored["skipped"][0]["code"] == "checkpoint.pending"
    assert continues_exactly(reference, resumed)


def test_sigterm_waits_for_the_commit_in_flight_then_commits_and_exits_75(
    tmp_path: Path, compile_cache: Path
) -> None:
    """SIGTERM while step 10's slow commit is in flight: it completes, then the current step
    is committed, then ``preempted``; both files are in place, nothing pending."""
    ck = tmp_path / "ck"
    spec = job(
        tmp_path / "j.toml",
        run={"steps": 60, "checkpoint_every": 10, "keep_checkpoints": 5, **ASYNC},
        faults={"commit_delay_s": 1.5, "step_delay_s": 0.05},
    )
    seen: list[dict[str, Any]] = []
    with subprocess.Popen(
        worker_argv(spec, ck, compile_cache), stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        while not (seen and seen[-1]["event"] == "progress" and seen[-1]["step"] == 12):
            seen.append(read_event(proc.stdout))
        assert not (ck / file_name(10)).exists()  # still in flight
        proc.send_signal(signal.SIGTERM)
        seen += [json.loads(line) for line in proc.stdout]
    assert proc.returncode == 75
    tail = [(e["event"], e.get("step")) for e in seen if e["event"] in ("checkpoint", "preempted")]
    stopped = next(s for k, s in tail if k == "preempted")
    assert tail == [("checkpoint", 10), ("checkpoint", stopped), ("preempted", stopped)]
    assert stopped >= 12
    assert sorted(p.name for p in ck.glob("ckpt-*")) == [file_name(10), file_name(stopped)]
    assert [e["background"] for e in seen if e["event"] == "checkpoint"] == [True, False]


@pytest.mark.slow
def test_stall_watch_through_a_long_background_commit(tmp_path: Path, compile_cache: Path) -> None:
    """A 2 s commit under a 1.5 s commit watch: the asynchronous job trains on and fails only
    where its drill says; the same job committing synchronously stalls in its commit phase; a
    training thread that hangs while a commit is in flight is still caught, in its steps."""
    run = {"steps": 40, "checkpoint_every": 10, "keep_checkpoints": 5}
    slow = {"commit_delay_s": 2.0, "step_delay_s": 0.3}
    sup = {"stall_timeout_s": 1.5, "commit_timeout_s": 1.5, "max_restarts": 0}
    jobs = {
        "bg": linreg_job(
            "bg", run={**run, **ASYNC}, faults={**slow, "fail_after": 25}, supervision=sup
        ),
        "sync": linreg_job("sync", run=run, faults={**slow, "fail_after": 25}, supervision=sup),
        "hang": linreg_job(
            "hang",
            run={**run, **ASYNC},
            faults={**slow, "stall_at": 12, "stall_seconds": 60},
            supervision=sup,
        ),
    }
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        for name, text in jobs.items():
            daemon.drop(f"{name}.toml", text)
        kinds_of = {}
        for name in jobs:
            daemon.wait(name, ("failed",), timeout=120)
            kinds_of[name] = [
                (i["kind"], i["details"].get("phase")) for i in daemon.incidents(name)
            ]
        bg_events = daemon.events("bg", 1)
    assert kinds_of == {
        "bg": [("crash", None)],
        "sync": [("stall", "commit")],
        "hang": [("stall", "step")],
    }
    commits = [e["step"] for e in bg_events if e["event"] == "checkpoint"]
    assert commits == [10, 20]
    last = [e["step"] for e in bg_events if e["event"] == "progress"][-1]
    assert last == 25
