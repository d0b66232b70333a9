"""The pinned runtime's bits do not depend on how many CPUs the process may use.

XLA's CPU client sizes its thread pools to the CPUs a process may use (``NPROC``
overrides it), and shares some reductions among the pool's threads in parts that
depend on its size, even with one intra-op thread: without the pinned pool, a
column sum gives other bits in a process allowed one CPU than in one allowed two,
and a long contraction other bits with a pool of eight (a machine of eight CPUs)
than with two.  Real JAX processes, each started fresh (the pool is sized as JAX
starts).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jobwarden.proof import verify
from jobwarden.runtime import PINNED_ENV, PINNED_XLA_FLAGS, runtime_identity
from jobwarden.worker.command import worker_argv
from tests.helpers import AttemptResult, job, kinds

PROGRAM = textwrap.dedent(
    """
    import json, os, sys
    cpus = json.loads(sys.argv[1])
    if cpus:
        os.sched_setaffinity(0, cpus)
    import jax, jax.numpy as jnp, numpy as np, xxhash
    x = jax.random.normal(jax.random.key(0), (1024, 1024))
    column_sums = np.asarray(jax.jit(lambda a: a.sum(axis=0))(x))
    tall, wide = jax.random.normal(jax.random.key(1), (8192, 64)), jnp.ones((64, 256))
    contraction = np.asarray(jax.jit(lambda a, b: a.T @ (a @ b))(tall, wide))
    pool = [
        name for name in os.listdir("/proc/self/task")
        if open(f"/proc/self/task/{name}/comm").read().strip() == "tf_XLAEigen"
    ]
    print(json.dumps({"bits": xxhash.xxh3_64(column_sums.tobytes()).hexdigest(),
                      "long": xxhash.xxh3_64(contraction.tobytes()).hexdigest(),
                      "pool": len(pool)}))
    """
)


def pinned_env(nproc: str | None = PINNED_ENV["NPROC"]) -> dict[str, str]:
    """This environment with the pins, the pool's size ``nproc`` (None: not set)."""
    env = {name: value for name, value in os.environ.items() if name != "NPROC"}
    env.update({name: value for name, value in PINNED_ENV.items() if name != "NPROC"})
    env["XLA_FLAGS"] = " ".join(PINNED_XLA_FLAGS)
    if nproc is not None:
        env["NPROC"] = nproc
    return env


def run_all(runs: dict[str, tuple[dict[str, str], list[int]]]) -> dict[str, dict[str, object]]:
    """Each named run of `PROGRAM` (environment, CPUs allowed), side by side."""
    started = {
        name: subprocess.Popen(
            [sys.executable, "-c", PROGRAM, json.dumps(cpus)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (env, cpus) in runs.items()
    }
    found = {}
    for name, process in started.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err[-2000:]
        found[name] = json.loads(out.strip().splitlines()[-1])
    return found


def test_the_pinned_bits_are_the_same_on_one_cpu_and_on_two() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("SKIPPED LOUDLY: this process may use one CPU only; the test compares 1 and 2")
    found = run_all(
        {
            "pinned, one cpu": (pinned_env(), cpus[:1]),
            "pinned, two cpus": (pinned_env(), cpus[:2]),
            "unpinned, one cpu": (pinned_env(None), cpus[:1]),
            "unpinned, two cpus": (pinned_env(None), cpus[:2]),
            "a pool of one, two cpus": (pinned_env("1"), cpus[:2]),
            "a pool of eight, two cpus": (pinned_env("8"), cpus[:2]),
        }
    )
    assert found["pinned, one cpu"]["pool"] == found["pinned, two cpus"]["pool"] == 2
    for bits in ("bits", "long"):
        assert found["pinned, one cpu"][bits] == found["pinned, two cpus"][bits]
    # Before the pin, a process allowed two CPUs had the pinned bits ...
    assert found["unpinned, two cpus"]["pool"] == 2
    assert found["unpinned, two cpus"]["bits"] == found["pinned, two cpus"]["bits"]
    # ... and one allowed one CPU had a pool of one and other bits, as a pool of one has
    # anywhere: the hazard the pin removes is real on this runtime.
    assert found["unpinned, one cpu"]["pool"] == found["a pool of one, two cpus"]["pool"] == 1
    assert found["unpinned, one cpu"]["bits"] != found["pinned, one cpu"]["bits"]
    assert found["a pool of one, two cpus"]["bits"] == found["unpinned, one cpu"]["bits"]
    # A machine of eight CPUs had a pool of eight, and other bits of a long contraction.
    assert found["a pool of eight, two cpus"]["pool"] == 8
    assert found["a pool of eight, two cpus"]["long"] != found["pinned, two cpus"]["long"]


def test_the_pool_is_in_the_runtime_identity_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pinned pool and any other are recorded, so a checkpoint is resumed only under its
    own; unset (a run that gave up exactness, or one before the pin) or set empty (to
    resume such a checkpoint) records none."""
    monkeypatch.setenv("NPROC", PINNED_ENV["NPROC"])
    assert runtime_identity()["nproc"] == "2"
    monkeypatch.setenv("NPROC", "1")
    assert runtime_identity()["nproc"] == "1"
    monkeypatch.setenv("NPROC", "")
    assert "nproc" not in runtime_identity()
    monkeypatch.delenv("NPROC")
    assert "nproc" not in runtime_identity()


def run_on(cpus: set[int], job_file: Path, checkpoints: Path, folder: Path) -> AttemptResult:
    """The worker run to its end on ``job_file``, allowed only ``cpus`` (set by a small
    program that then becomes the worker: this process runs JAX, and must not fork)."""
    folder.mkdir(parents=True)
    narrow = "import os, sys; os.sched_setaffinity(0, %r); os.execv(sys.argv[1], sys.argv[1:])"
    argv = [sys.executable, "-c", narrow % sorted(cpus), *worker_argv(job_file, checkpoints)]
    with (folder / "events.jsonl").open("wb") as out, (folder / "stderr.log").open("wb") as err:
        status = subprocess.run(argv, stdout=out, stderr=err, timeout=300, check=False).returncode
    return AttemptResult(folder, status)


def mlp_jobs(tmp_path: Path) -> tuple[Path, Path]:
    """The mlp task wide enough that a pool of one gives other bits from the first update
    (8 updates, a checkpoint every 4), and the same job crashing after update 6."""
    train = {"width": 256, "batch_size": 1024, "examples": 1024}
    run = {"steps": 8, "checkpoint_every": 4}
    spec = job(tmp_path / "mlp.toml", "pool", "mlp", train=train, run=run)
    crash = job(tmp_path / "crash.toml", "pool", "mlp", train=train, run=run,
                faults={"crash_after": 6})  # fmt: skip
    return spec, crash


def replays_exactly(reference: AttemptResult, *attempts: AttemptResult) -> bool:
    """Whether the attempts, in order, prove every update of the uninterrupted run."""
    candidate = verify.Run("candidate", [list(a.events()) for a in attempts], 0)
    return verify.verify(verify.load_run(reference.folder), candidate).proven


def test_a_job_checkpointed_on_two_cpus_resumes_exactly_on_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mlp task (wide enough that a pool of one would give other bits) crashes on two
    CPUs and resumes on one: the replay equals the uninterrupted run's.  Without the pin
    (``NPROC`` empty) the same resume is refused, its runtime naming the pool."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("SKIPPED LOUDLY: this process may use one CPU only; the test compares 1 and 2")
    two, one = set(cpus[:2]), {cpus[0]}
    spec, crash = mlp_jobs(tmp_path)
    reference = run_on(two, spec, tmp_path / "reference", tmp_path / "runs/reference")
    assert reference.exit_status == 0
    crashed = run_on(two, crash, tmp_path / "ck", tmp_path / "runs/crashed")
    assert crashed.exit_status == -signal.SIGKILL
    shutil.copytree(tmp_path / "ck", tmp_path / "ck-unpinned")
    resumed = run_on(one, spec, tmp_path / "ck", tmp_path / "runs/resumed")
    assert resumed.exit_status == 0
    assert [e["step"] for e in kinds(resumed, "restored")] == [4]
    assert replays_exactly(reference, crashed, resumed)
    monkeypatch.setenv("NPROC", "")
    unpinned = run_on(one, spec, tmp_path / "ck-unpinned", tmp_path / "runs/unpinned")
    failed = kinds(unpinned, "failed")[0]
    assert (failed["code"], failed["fields"]["nproc"]) == ("checkpoint.runtime", ["2", None])


def test_a_pool_of_eight_is_exact_through_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator's ``NPROC=8`` (a big box's pool; here eight threads on this machine's
    CPUs): the crash drill's replay equals the uninterrupted run's, and its checkpoints
    record the pool."""
    monkeypatch.setenv("NPROC", "8")
    cpus = set(os.sched_getaffinity(0))
    spec, crash = mlp_jobs(tmp_path)
    reference = run_on(cpus, spec, tmp_path / "reference", tmp_path / "runs/reference")
    crashed = run_on(cpus, crash, tmp_path / "ck", tmp_path / "runs/crashed")
    resumed = run_on(cpus, spec, tmp_path / "ck", tmp_path / "runs/resumed")
    assert (reference.exit_status, crashed.exit_status, resumed.exit_status) == (
        0,
        -signal.SIGKILL,
        0,
    )
    assert kinds(resumed, "started")[0]["runtime"]["nproc"] == "8"
    assert replays_exactly(reference, crashed, resumed)
