"""Real worker processes: the lesson's drill, its exercise, crashes, preemption and the mlp task."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from jobwarden.checkpoint import format
from jobwarden.proof import verify
from jobwarden.worker.command import worker_argv
from tests.conftest import Runner
from tests.helpers import AttemptResult, job, kinds


def proven(reference: AttemptResult, *attempts: AttemptResult) -> verify.Report:
    """Verify attempts (in order) against a reference run folder."""
    candidate = verify.Run("candidate", [list(a.events()) for a in attempts], 0)
    return verify.verify(verify.load_run(reference.folder), candidate)


def test_default_task_is_the_lesson_bit_for_bit(reference: AttemptResult) -> None:
    """Every loss and the final params equal an independent transcription of the lesson."""
    x = jnp.linspace(-1.0, 1.0, 64)
    y = 2 * x + 1

    def update(params, velocity, key):  # type: ignore[no-untyped-def]
        key, sample = jax.random.split(key)
        indices = jax.random.choice(sample, 64, (8,), replace=False)
        loss, grad = jax.value_and_grad(
            lambda p: jnp.mean((p[0] * x[indices] + p[1] - y[indices]) ** 2)
        )(params)
        velocity = 0.8 * velocity + grad
        return params - 0.04 * velocity, velocity, key, loss

    params, velocity, key = jnp.zeros(2), jnp.zeros(2), jax.random.PRNGKey(3)
    losses = []
    for _ in range(8):
        params, velocity, key, loss = jax.jit(update)(params, velocity, key)
        losses.append(float(loss))
    assert losses == [e["loss"] for e in kinds(reference, "progress")]
    final = format.read(Path(kinds(reference, "checkpoint")[-1]["file"]))
    assert final.arrays["params"].tolist() == params.tolist()
    assert final.arrays["opt_state/velocity"].tolist() == velocity.tolist()
    assert final.arrays["key"].tolist() == key.tolist()


@pytest.mark.slow
def test_lesson_drill_restores_step_2_and_replays_3_to_8(
    reference: AttemptResult, lesson_drill: tuple[AttemptResult, AttemptResult]
) -> None:
    """Fail after update 3: the resume restores step 2, replays 3..8 and verify proves it."""
    failed, resumed = lesson_drill
    assert failed.exit_status == 10
    assert kinds(failed, "failed")[0]["code"] == "worker.injected_failure"
    assert resumed.exit_status == 0
    assert [e["step"] for e in kinds(resumed, "restored")] == [2]
    assert [e["step"] for e in kinds(resumed, "progress")] == [3, 4, 5, 6, 7, 8]
    report = proven(reference, failed, resumed)
    assert report.proven, verify.render(report)
    assert report.replayed_steps == [3, 4, 5, 6, 7, 8]
    ref_final = format.read(Path(kinds(reference, "completed")[0]["file"]))
    res_final = format.read(Path(kinds(resumed, "completed")[0]["file"]))
    assert ref_final.arrays.keys() == res_final.arrays.keys()
    assert all(
        ref_final.arrays[p].tobytes() == res_final.arrays[p].tobytes() for p in ref_final.arrays
    )


@pytest.mark.slow
def test_lesson_exercise_seed_9_every_3_fail_after_5(worker: Runner, tmp_path: Path) -> None:
    """The exercise: seed 9, checkpoint every 3, fail after 5 -> restored at 3, exact."""
    train, run = {"seed": 9}, {"checkpoint_every": 3}
    ref = worker(job(tmp_path / "ref.toml", "ref", train=train, run=run), tmp_path / "ref-ck")
    ck = tmp_path / "ck"
    failed = worker(
        job(tmp_path / "f.toml", "ex", train=train, run=run, faults={"fail_after": 5}), ck
    )
    resumed = worker(job(tmp_path / "r.toml", "ex", train=train, run=run), ck)
    assert [e["step"] for e in kinds(resumed, "restored")] == [3]
    assert [e["step"] for e in kinds(resumed, "progress")] == [4, 5, 6, 7, 8]
    report = proven(ref, failed, resumed)
    assert report.proven, verify.render(report)
    ref_final = format.read(Path(kinds(ref, "completed")[0]["file"]))
    res_final = format.read(Path(kinds(resumed, "completed")[0]["file"]))
    assert all(
        ref_final.arrays[p].tobytes() == res_final.arrays[p].tobytes() for p in ref_final.arrays
    )


@pytest.mark.slow
def test_hard_crash_after_update_resumes_exactly(
    reference: AttemptResult, worker: Runner, tmp_path: Path
) -> None:
    """A SIGKILL after update 5 leaves step 4 committed; the resume replays 5..8 exactly."""
    ck = tmp_path / "ck"
    crashed = worker(job(tmp_path / "c.toml", "crash", faults={"crash_after": 5}), ck)
    assert crashed.exit_status == -signal.SIGKILL
    assert not kinds(crashed, "failed")
    resumed = worker(job(tmp_path / "r.toml", "crash"), ck)
    assert [e["step"] for e in kinds(resumed, "restored")] == [4]
    assert proven(reference, crashed, resumed).proven


@pytest.mark.slow
def test_sigterm_commits_the_current_step_and_resumes_exactly(
    compile_cache: Path, worker: Runner, tmp_path: Path
) -> None:
    """SIGTERM mid-run: the in-flight update finishes, that step is committed, resume is exact."""
    run = {"steps": 200, "checkpoint_every": 50}
    ref = worker(job(tmp_path / "ref.toml", "ref", run=run), tmp_path / "ref-ck")
    ck = tmp_path / "ck"
    spec = job(tmp_path / "slow.toml", "slow", run=run, faults={"step_delay_s": 0.01})
    folder = tmp_path / "preempted"
    folder.mkdir()
    with subprocess.Popen(
        worker_argv(spec, ck, compile_cache),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if '"progress"' in line and json.loads(line)["step"] >= 7:
                proc.send_signal(signal.SIGTERM)
                break
        lines += proc.stdout.readlines()
        status = proc.wait(timeout=60)
    (folder / "events.jsonl").write_text("".join(lines))
    preempted = AttemptResult(folder, status)
    assert status == 75
    stop = kinds(preempted, "preempted")[0]["step"]
    assert 7 <= stop < 50
    assert kinds(preempted, "checkpoint")[-1]["step"] == stop
    resumed = worker(job(tmp_path / "resume.toml", "slow", run=run), ck)
    assert [e["step"] for e in kinds(resumed, "restored")] == [stop]
    report = proven(ref, preempted, resumed)
    assert report.proven, verify.render(report)


@pytest.mark.slow
def test_mlp_of_a_few_mib_resumes_exactly_at_every_step(worker: Runner, tmp_path: Path) -> None:
    """The optax mlp task, ~3 MiB of nested state, interrupted and resumed, equals the reference."""
    train = {"width": 512, "depth": 2, "seed": 1}
    run = {"steps": 6, "checkpoint_every": 2}
    ref = worker(job(tmp_path / "ref.toml", "ref", "mlp", train=train, run=run), tmp_path / "r")
    assert ref.exit_status == 0
    size = kinds(ref, "checkpoint")[0]["bytes"]
    assert 2 * 2**20 < size < 8 * 2**20
    ck = tmp_path / "ck"
    failed = worker(
        job(tmp_path / "f.toml", "m", "mlp", train=train, run=run, faults={"fail_after": 3}), ck
    )
    resumed = worker(job(tmp_path / "r.toml", "m", "mlp", train=train, run=run), ck)
    assert [e["step"] for e in kinds(resumed, "restored")] == [2]
    report = proven(ref, failed, resumed)
    assert report.proven, verify.render(report)
    leaves = [
        leaf.path for leaf in format.read(Path(kinds(ref, "completed")[0]["file"])).manifest.leaves
    ]
    assert "opt_state/0/mu/params/layer01/w" in leaves or any("/mu/" in p for p in leaves)


def test_stall_fault_hangs_and_sigusr1_dumps_every_thread(
    compile_cache: Path, tmp_path: Path
) -> None:
    """stall_at hangs after N updates; SIGUSR1 makes the worker print every thread's stack."""
    spec = job(tmp_path / "s.toml", "stall", faults={"stall_at": 2, "stall_seconds": 30})
    with subprocess.Popen(
        worker_argv(spec, tmp_path / "ck", compile_cache),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        assert proc.stderr is not None
        for line in proc.stdout:
            if '"stall_injected"' in line:
                break
        proc.send_signal(signal.SIGUSR1)
        stderr = ""
        deadline = time.monotonic() + 20
        while "before_update" not in stderr and time.monotonic() < deadline:
            if select.select([proc.stderr], [], [], 0.5)[0]:
                stderr += os.read(proc.stderr.fileno(), 65536).decode()
        proc.kill()
        proc.communicate(timeout=30)
    assert "Current thread" in stderr or "Thread 0x" in stderr
    assert "before_update" in stderr
