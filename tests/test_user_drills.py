"""wardenctl drill --job FILE: the drills on a user's own job, and what they say when it fails."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from jobwarden.control.drill.context import DrillParams, final_check
from jobwarden.control.drill.jobs import DrillJobError, default_job, load_job_file
from jobwarden.control.drill.plan import DrillPlanError, FaultPoints, checkpoint_steps, plan
from jobwarden.control.drill.setup import prepare
from jobwarden.events import Event
from jobwarden.jobfile import RunSection

WARDENCTL = [sys.executable, "-m", "jobwarden.control.cli"]
ALL = ["crash", "stall", "duplicate-writer", "corrupt", "incompatible"]

PROGRAM = '''
"""Momentum SGD on a line, in a batch order drawn once; with --clock, drawn from the clock."""

import sys
import time

import numpy as np

import jobwarden.sdk as jw

EXAMPLES, BATCH = 32, 4
xs = np.linspace(-1, 1, EXAMPLES, dtype=np.float32)
ys = 3 * xs - 0.5
seed = time.time_ns() if "--clock" in sys.argv else 7  # the clock: the mistake

with jw.attach(config={"rate": 0.1, "seed": 7}, sources=[__file__], data={"x": xs, "y": ys}) as run:
    import jax
    import jax.numpy as jnp

    order = np.random.default_rng(seed).permutation(EXAMPLES)
    x, y = jnp.asarray(xs), jnp.asarray(ys)

    @jax.jit
    def update(state, batch):
        loss, grads = jax.value_and_grad(
            lambda p: jnp.mean((p["w"] * x[batch] + p["b"] - y[batch]) ** 2)
        )(state["params"])
        velocity = jax.tree_util.tree_map(lambda v, g: 0.9 * v + g, state["opt_state"], grads)
        params = jax.tree_util.tree_map(lambda p, v: p - 0.1 * v, state["params"], velocity)
        return {**state, "params": params, "opt_state": velocity}, loss

    zeros = {"w": jnp.zeros(()), "b": jnp.zeros(())}
    state = run.restore({"params": zeros, "opt_state": zeros, "data": {"index": 0}})
    jax.block_until_ready(update(state, jnp.arange(BATCH)))  # compile before the first step
    for step in run.steps(state):
        index = state["data"]["index"]
        start = (index * BATCH) % EXAMPLES
        state, loss = update(state, jnp.asarray(order[start : start + BATCH]))
        state = {**state, "data": {"index": index + 1}}
        run.progress(step, state, loss=float(loss))
'''


def drill(*args: str) -> subprocess.CompletedProcess[str]:
    """Run wardenctl drill with ``args``."""
    return subprocess.run(
        [*WARDENCTL, "drill", *args], capture_output=True, text=True, timeout=600, check=False
    )


def write_job(path: Path, text: str) -> Path:
    """A job file with ``text`` (dedented)."""
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def command_job(folder: Path, job_id: str, *argv: str, **extra: Any) -> Path:
    """A command job running ``argv`` (a program in ``folder`` and its arguments) with this
    Python."""
    lines = [
        f'id = "{job_id}"',
        f"command = {json.dumps([sys.executable, *argv])}",
        f'workdir = "{folder}"',
        *(f"{key} = {json.dumps(value)}" for key, value in extra.items()),
    ]
    return write_job(folder / f"{job_id}.toml", "\n".join(lines) + "\n")


MLP_JOB = """
    id = "my-mlp"
    task = "mlp"

    [train]
    width = 24
    examples = 64
    batch_size = 16
    learning_rate = 0.002

    [run]
    steps = 10
    checkpoint_every = 3
    keep_checkpoints = 4
"""


class TestPlan:
    """Where the faults go, from the job's own steps and checkpoint cadence."""

    def test_the_default_job_keeps_the_lessons_fault_points(self) -> None:
        """8 steps, a commit every 2: fail after 3, stall at 5, corrupt after 5, pause at 2."""
        expected = FaultPoints(8, 2, fail_after=3, stall_at=5, corrupt_after=5, pause_at=2)
        assert expected == plan(8, 2, 8, ALL)

    def test_faults_fall_between_the_jobs_own_commits(self) -> None:
        """10 steps, a commit every 3: the crash between 3 and 6, the stall between 6 and 9."""
        points = plan(10, 3, 4, ALL)
        assert (points.fail_after, points.stall_at, points.corrupt_after) == (4, 7, 7)
        assert (points.restore_point(4), points.restore_point(7)) == (3, 6)

    def test_named_fault_points_win(self) -> None:
        """--fail-after 5 with a commit every 3: the crash restores 3; corrupt keeps its own."""
        points = plan(8, 3, 3, ["crash", "corrupt"], fail_after=5)
        assert (points.fail_after, points.corrupt_after) == (5, 7)

    def test_commit_steps_include_the_last(self) -> None:
        """Every checkpoint_every-th update, and the last one."""
        assert checkpoint_steps(10, 4) == [4, 8, 10]

    def test_a_job_without_a_commit_before_its_end_is_refused(self) -> None:
        """checkpoint_every >= steps: nothing to restore, every drill is refused."""
        with pytest.raises(DrillPlanError, match="no update between a commit and its last"):
            plan(8, 8, 3, ["crash"])

    def test_the_corrupt_drill_needs_two_commits_and_two_kept(self) -> None:
        """One commit before the end, one checkpoint kept: both problems named at once."""
        with pytest.raises(DrillPlanError) as caught:
            plan(8, 4, 1, ["corrupt"])
        assert len(caught.value.problems) == 2
        assert "two commits" in caught.value.problems[0]
        assert "keep_checkpoints >= 2 (found 1)" in caught.value.problems[1]

    def test_a_named_fault_outside_the_run_is_refused(self) -> None:
        """--fail-after before the first commit or at the last update is refused."""
        for given in (1, 8):
            with pytest.raises(DrillPlanError, match="--fail-after"):
                plan(8, 2, 3, ["crash"], fail_after=given)


class TestDrillJob:
    """The drilled job's copies change only what the drill must."""

    def test_a_copy_changes_only_id_checkpoint_and_faults(self, tmp_path: Path) -> None:
        """The user's [train], [run] and [supervision] are copied as written, with every
        update's state hashed (hash_every = 1)."""
        path = write_job(tmp_path / "job.toml", MLP_JOB + "[faults]\nfail_after = 2\n")
        job = load_job_file(path)
        copy = json.loads(job.text("x-1", "x-ck", faults={"stall_at": 4}))
        original = dict(job.document)
        run = {**original["run"], "hash_every": 1}
        expected = {**original, "id": "x-1", "checkpoint": "x-ck", "run": run}
        assert {**expected, "faults": {"stall_at": 4}} == copy
        assert "faults" not in json.loads(job.text("x-2", "x-2"))

    def test_the_incompatible_drill_changes_the_learning_rate(self, tmp_path: Path) -> None:
        """mlp's learning_rate 0.002 becomes 0.0025; the default job's 0.04 becomes 0.05."""
        change = load_job_file(write_job(tmp_path / "job.toml", MLP_JOB)).change
        assert change is not None
        assert (change.field, change.old, change.new) == ("learning_rate", 0.002, 0.0025)
        default = default_job("linreg", 3, 8, 2).change
        assert default is not None
        assert (default.old, default.new) == (0.04, 0.05)

    def test_a_programs_own_run_is_learned_later(self, tmp_path: Path) -> None:
        """A command job without [run] steps: unknown until its reference says, then written."""
        job = load_job_file(command_job(tmp_path, "mine", "train.py"))
        assert job.run is None
        learned = job.learned(RunSection(steps=12, checkpoint_every=4, keep_checkpoints=10))
        assert json.loads(learned.text("a", "a"))["run"]["steps"] == 12
        assert learned.change is not None
        assert learned.change.field == "xla_flags"

    def test_a_job_that_refuses_to_resume_cannot_be_drilled(self, tmp_path: Path) -> None:
        """[run] resume = "never": refused before any daemon, naming the policy."""
        text = MLP_JOB.replace("steps = 10", 'steps = 10\n    resume = "never"')
        path = write_job(tmp_path / "job.toml", text)
        with pytest.raises(DrillJobError, match="resume = 'never'"):
            prepare(["crash"], path, DrillParams())

    def test_a_program_without_the_sdk_cannot_be_drilled(self, tmp_path: Path) -> None:
        """sdk = false: refused, saying why exactness cannot be checked."""
        with pytest.raises(DrillJobError) as caught:
            load_job_file(command_job(tmp_path, "plain", "train.py", sdk=False))
        assert "sdk = false" in caught.value.problems[0]
        assert "no state hashes" in caught.value.problems[0]


class TestFinalCheck:
    """How a drill compares the two runs' ends: checkpoint files, or for an external
    checkpointer the completed events' state hashes."""

    @staticmethod
    def run(checkpoints: str, final_hash: str, file: str = "") -> list[Event]:
        """The started and completed events of one run."""
        return [
            Event("started", {"checkpoints": checkpoints}),
            Event("completed", {"step": 9, "state_hash": final_hash, "file": file}),
        ]

    def test_an_external_checkpointer_is_compared_by_its_final_state_hash(self) -> None:
        """Equal hashes pass, a different one fails, and the check says what it compared."""
        same = final_check(self.run("external", "aa"), self.run("external", "aa"))
        other = final_check(self.run("external", "aa"), self.run("external", "bb"))
        assert (same.ok, other.ok) == (True, False)
        assert "state hashes" in same.name
        assert other.observed == {"reference_state_hash": "aa", "resumed_state_hash": "bb"}

    def test_jobwardens_checkpoints_are_compared_by_their_files(self, tmp_path: Path) -> None:
        """Equal hashes do not make up for final checkpoint files that cannot be read."""
        missing = str(tmp_path / "ckpt-00000009.safetensors")
        check = final_check(
            self.run("jobwarden", "aa", missing), self.run("jobwarden", "aa", missing)
        )
        assert (check.name, check.ok) == ("final checkpoints are equal", False)


def test_drilling_a_program_without_the_sdk_is_refused(tmp_path: Path) -> None:
    """drill crash --job FILE with sdk = false: exit 2 naming why, before any daemon starts."""
    job = command_job(tmp_path, "plain", "train.py", sdk=False)
    done = drill("crash", "--job", str(job), "--out", str(tmp_path / "out"))
    assert (done.returncode, done.stdout) == (2, "")
    assert f"cannot drill {job}" in done.stderr
    assert "sdk = false" in done.stderr
    assert "cannot tell whether it resumes exactly" in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_default_jobs_options_are_refused_with_a_job_file(tmp_path: Path) -> None:
    """--seed and --steps shape the default job; with --job they are a usage error."""
    job = write_job(tmp_path / "job.toml", MLP_JOB)
    done = drill("crash", "--job", str(job), "--seed", "4", "--steps", "20")
    assert done.returncode == 2
    assert "--seed, --steps shape the default job" in done.stderr


def test_a_job_with_no_room_for_the_corrupt_drill_is_refused(tmp_path: Path) -> None:
    """steps 8, a commit every 4: the corrupt drill has nothing older to fall back to."""
    job = write_job(tmp_path / "job.toml", MLP_JOB.replace("steps = 10", "steps = 8"))
    text = job.read_text().replace("checkpoint_every = 3", "checkpoint_every = 4")
    job.write_text(text)
    done = drill("all", "--job", str(job), "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert "the corrupt drill needs two commits before the last update" in done.stderr


@pytest.mark.slow
def test_the_crash_drill_passes_on_a_users_mlp_job(tmp_path: Path, compile_cache: Path) -> None:
    """drill crash --job: an mlp of width 24 over 10 steps, failing between its own commits."""
    job = write_job(tmp_path / "job.toml", MLP_JOB)
    out = tmp_path / "out"
    done = drill(
        "crash",
        "--job",
        str(job),
        "--out",
        str(out),
        "--json",
        "--compile-cache",
        str(compile_cache),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    verdict = json.loads(done.stdout)
    assert (verdict["ok"], verdict["job_file"]) == (True, str(job))
    assert verdict["fault_points"]["fail_after"] == 4  # between the commits at 3 and 6
    assert (verdict["restored_step"], verdict["replayed_steps"]) == (3, list(range(4, 11)))
    assert (verdict["first_diverging_step"], verdict["component"], verdict["leaf"]) == (
        None,
        None,
        None,
    )
    jobs = sorted(p.name for p in (out / "root" / "jobs").iterdir())
    assert [name.split("-")[-1] for name in jobs] == ["crash", "reference"]
    assert all(name.startswith("my-mlp-crash-") for name in jobs)
    request = json.loads((out / "root" / "jobs" / jobs[0] / "job.json").read_text())
    assert (request["task"], request["train"]["width"], request["run"]["steps"]) == ("mlp", 24, 10)
    assert request["run"]["keep_checkpoints"] == 4
    book = next((out / "crash").glob("runbook-*.md")).read_text()
    assert f"job {jobs[0]}" in book
    assert "of task mlp" in book
    assert "linreg" not in book


@pytest.mark.slow
def test_every_drill_passes_on_an_sdk_program(tmp_path: Path, compile_cache: Path) -> None:
    """drill all --job on a command job whose program keeps its own [run] (8 steps, every 2)."""
    (tmp_path / "train.py").write_text(textwrap.dedent(PROGRAM).lstrip())
    job = command_job(tmp_path, "line-fit", "train.py")
    out = tmp_path / "out"
    done = drill(
        "all", "--job", str(job), "--out", str(out), "--json", "--compile-cache", str(compile_cache)
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    drills = {d["drill"]: d for d in json.loads(done.stdout)["drills"]}
    assert all(d["ok"] for d in drills.values())
    crash = drills["crash"]
    assert crash["fault_points"]["steps"] == 8  # learned from the reference's started event
    assert (crash["restored_step"], crash["replayed_steps"]) == (2, list(range(3, 9)))
    writer = json.loads((out / "duplicate-writer" / "refusals.json").read_text())
    assert writer["hand_started_worker"]["exit_status"] == 11
    refused = json.loads((out / "incompatible" / "refusals.json").read_text())
    assert refused["failed_event"]["code"] == "checkpoint.runtime"
    assert "xla_flags" in refused["failed_event"]["fields"]
    book = next((out / "crash").glob("runbook-*.md")).read_text()
    assert "line-fit-crash-" in book
    assert "of command `" in book
    assert "linreg" not in book


@pytest.mark.slow
def test_a_clock_seeded_program_fails_naming_step_and_component(
    tmp_path: Path, compile_cache: Path
) -> None:
    """Batch order from time.time_ns(): the drill fails at step 1, in params, down to a leaf."""
    (tmp_path / "train.py").write_text(textwrap.dedent(PROGRAM).lstrip())
    job = command_job(tmp_path, "clock", "train.py", "--clock")
    job.write_text(job.read_text() + "[run]\nsteps = 6\ncheckpoint_every = 2\n")
    out = tmp_path / "out"
    done = drill(
        "crash", "--job", str(job), "--out", str(out), "--compile-cache", str(compile_cache)
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    verdict = json.loads((out / "crash" / "verdict.json").read_text())
    assert verdict["ok"] is False
    assert (verdict["first_diverging_step"], verdict["component"]) == (1, "params")
    assert verdict["components"] == ["params", "opt_state"]
    assert verdict["leaf"] in ("params/b", "params/w")
    assert (verdict["diverged_in"], verdict["attempt"]) == ("update", 1)
    assert "not deterministic" in verdict["explanation"]
    assert (
        "the first attempt matched the reference until its fault (the run is deterministic)"
        in verdict["failed_checks"]
    )
    assert "first diverging step: 1 (update), component params, leaf params/" in done.stdout
