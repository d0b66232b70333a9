"""The SDK for programs as people write them: a script without the ``with`` block, a numpy
generator and the data position in the state, an external checkpointer's labels and saves."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import jobwarden.sdk as jw
from jobwarden.control.drill.divergence import first_difference
from jobwarden.jobfile import FaultSection
from jobwarden.proof import verify
from jobwarden.sdk.settings import RUN_FILE_ENV, RunFile
from tests.daemon import Daemon
from tests.helpers import AttemptResult, kinds

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent / "docs" / "sdk.md"


def nnx_recipe() -> str:
    """The program of docs/sdk.md's NNX recipe: the block after its marker."""
    text = DOCS.read_text()
    block = text[text.index("<!-- nnx-recipe -->") :]
    return block[block.index("```python\n") + 10 : block.index("\n```\n")] + "\n"


class Runner:
    """Runs a copy of a program as a user would, each attempt's stdout kept as its events."""

    def __init__(self, source: Path, base: Path, cache: Path) -> None:
        base.mkdir(exist_ok=True)
        self.program = Path(shutil.copy(source, base / "train.py"))
        self.base, self.cache, self.count = base, cache, 0

    def __call__(self, *args: str, run_file: RunFile | None = None) -> AttemptResult:
        """Run the program to its end (under ``run_file``, if given)."""
        self.count += 1
        folder = self.base / f"attempt-{self.count}"
        folder.mkdir()
        env = dict(os.environ, JOBWARDEN_COMPILE_CACHE=str(self.cache))
        env.pop(RUN_FILE_ENV, None)
        if run_file is not None:
            (folder / "run.json").write_text(run_file.model_dump_json(exclude_unset=True))
            env[RUN_FILE_ENV] = str(folder / "run.json")
        done = subprocess.run(
            [sys.executable, str(self.program), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        (folder / "events.jsonl").write_text(done.stdout)
        (folder / "stderr.log").write_text(done.stderr)
        return AttemptResult(folder, done.returncode)


def proven(reference: AttemptResult, *attempts: AttemptResult) -> verify.Report:
    """Verify attempts (in order) against the reference run."""
    candidate = verify.Run("candidate", [list(a.events()) for a in attempts], 0)
    return verify.verify(verify.Run("reference", [list(reference.events())], 0), candidate)


def stderr_of(result: AttemptResult) -> str:
    """The end of an attempt's stderr, for an assertion message."""
    return (result.folder / "stderr.log").read_text()[-3000:]


@pytest.fixture
def pure_jax(compile_cache: Path, tmp_path: Path) -> Runner:
    """tests/sdk_program.py, the pure-JAX example."""
    return Runner(HERE / "sdk_program.py", tmp_path / "user", compile_cache)


@pytest.fixture
def script(compile_cache: Path, tmp_path: Path) -> Runner:
    """tests/sdk_script.py, written top to bottom with `jw.start`."""
    return Runner(HERE / "sdk_script.py", tmp_path / "user", compile_cache)


@pytest.mark.slow
def test_a_numpy_generator_in_the_state_resumes_bit_exact(pure_jax: Runner, tmp_path: Path) -> None:
    """The pure-JAX example's numpy Generator carried by jw.rng_state: failed after 6 and run
    again, the restored generator draws what the uninterrupted one drew, proven update by update."""
    reference = pure_jax("--numpy-noise", "--checkpoint-dir", str(tmp_path / "ref"))
    assert reference.exit_status == 0, stderr_of(reference)
    ck = str(tmp_path / "ck")
    failed = pure_jax("--numpy-noise", "--checkpoint-dir", ck, "--fail-after", "6")
    assert failed.exit_status == 10, stderr_of(failed)
    resumed = pure_jax("--numpy-noise", "--checkpoint-dir", ck)
    assert resumed.exit_status == 0, stderr_of(resumed)
    restored = kinds(resumed, "restored")[0]
    assert (restored["step"], "np_rng" in restored["components"]) == (4, True)
    report = proven(reference, failed, resumed)
    assert report.proven, verify.render(report)


@pytest.mark.slow
def test_an_orbax_style_label_is_named_off_by_one(pure_jax: Runner, tmp_path: Path) -> None:
    """Own checkpoints labelled one less than their updates: the verdict says the label is off
    by one and which step to give run.restored(), not that the checkpoint lacks something."""
    reference = pure_jax("--checkpoint-dir", str(tmp_path / "ref"))
    own = ("--own-checkpoints", str(tmp_path / "own"), "--label-as-orbax")
    failed = pure_jax(*own, "--fail-after", "6")
    resumed = pure_jax(*own)
    assert (failed.exit_status, resumed.exit_status) == (10, 0), stderr_of(resumed)
    assert kinds(resumed, "restored")[0]["step"] == 3
    report = proven(reference, failed, resumed)
    assert not report.proven
    explanation = first_difference(report)["explanation"]
    expected = (
        "the state restored as step 3 equals the reference's at step 4: the checkpoint is "
        "labelled one less than the updates it holds; give run.restored() the number of "
        "updates in the state (4), not the checkpointer's label (Orbax's resume recipe "
        "counts from 0)"
    )
    assert expected == explanation
    assert "does not hold all" not in verify.render(report)
    assert expected in verify.render(report)


class TestScript:
    """`jw.start`: a script without the ``with`` block, run as a real process."""

    @pytest.mark.slow
    def test_an_exception_escaping_the_script_is_failed_and_exits_70(
        self, script: Runner, tmp_path: Path
    ) -> None:
        """The program's own error after update 5: its traceback, failed worker.internal,
        exit 70, and the run left (the writer lock released: running again resumes)."""
        ck = str(tmp_path / "ck")
        crashed = script("--checkpoint-dir", ck, "--raise-at", "5")
        assert crashed.exit_status == 70, stderr_of(crashed)
        failed = kinds(crashed, "failed")[0]
        assert (failed["code"], failed["exception"]) == ("worker.internal", "RuntimeError")
        assert stderr_of(crashed).count("Traceback") == 1
        resumed = script("--checkpoint-dir", ck)
        assert resumed.exit_status == 0, stderr_of(resumed)
        assert [e["step"] for e in kinds(resumed, "restored")] == [4]

    @pytest.mark.slow
    def test_a_crash_drill_under_wardend_recovers_and_is_verified(
        self, compile_cache: Path, tmp_path: Path
    ) -> None:
        """The script as a command job with fail_after 7: exit 10, the daemon restarts it, the
        incident is verified from the state hashes (data position and numpy generator
        restored) and the job completes at 12."""
        folder = tmp_path / "user"
        folder.mkdir()
        shutil.copy(HERE / "sdk_script.py", folder / "train.py")
        document = {
            "id": "script",
            "command": [sys.executable, "train.py"],
            "workdir": str(folder),
            "sdk": True,
            "run": {"steps": 12, "checkpoint_every": 4},
            "faults": {"fail_after": 7},
        }
        with Daemon(tmp_path / "root", compile_cache) as daemon:
            daemon.drop("script.json", json.dumps(document))
            status = daemon.wait("script", timeout=300)
            incidents = daemon.incidents("script")
            first, second = daemon.events("script", 1), daemon.events("script", 2)
        assert (status["state"], status["attempt"], status["step"]) == ("completed", 2, 12)
        assert [e["code"] for e in first if e["event"] == "failed"] == ["worker.injected_failure"]
        (incident,) = incidents
        assert (incident["kind"], incident["status"]) == ("crash", "verified"), incident
        restored = next(e for e in second if e["event"] == "restored")
        assert restored["step"] == 4
        assert {"data", "rng", "params"} <= set(restored["components"])


class TestEpochs:
    """`jw.Epochs` and `jw.Position`: the data position in the state, the batches from there."""

    def test_batches_cover_each_epoch_once_in_a_new_order(self) -> None:
        """10 examples in batches of 3: three batches an epoch, each a fresh permutation's."""
        data = jw.Epochs(examples=10, batch_size=3, seed=1)
        taken = [next(b) for b in [data.batches(data.start)] for _ in range(6)]
        positions = [position for _, position in taken]
        assert positions[2:4] == [jw.Position(1, 0), jw.Position(1, 1)]
        first = np.concatenate([batch for batch, _ in taken[:3]])
        second = np.concatenate([batch for batch, _ in taken[3:]])
        assert len(set(first.tolist())) == 9
        assert first.tolist() != second.tolist()

    def test_a_restored_position_yields_what_the_run_would_have_read(self) -> None:
        """Starting from the position after batch 4 (numpy scalars, as restored) gives batch 5."""
        data = jw.Epochs(examples=10, batch_size=3, seed=1)
        straight = data.batches(data.start)
        for _ in range(4):
            _, position = next(straight)
        expected = next(straight)
        resumed = jw.Epochs(examples=10, batch_size=3, seed=1)
        restored = (np.int64(position.epoch), np.int64(position.index))
        batch, after = resumed.take(restored)
        assert (expected[0].tolist(), expected[1]) == (batch.tolist(), after)

    def test_the_position_is_two_named_leaves(self) -> None:
        """A Position in the state is the leaves data/epoch and data/index."""
        from jobwarden import statetree

        paths = statetree.leaf_paths({"data": jw.Position(0, 0)})
        assert paths == ["data/epoch", "data/index"]


class TestGenerators:
    """`jw.rng_state` / `jw.set_rng_state` for each kind of numpy generator."""

    @pytest.mark.parametrize(
        "make",
        [
            lambda: np.random.default_rng(3),
            lambda: np.random.RandomState(3),
            lambda: np.random.Generator(np.random.Philox(3)),
        ],
        ids=["Generator", "RandomState", "Philox"],
    )
    def test_the_state_put_back_draws_the_same_numbers(self, make: object) -> None:
        """Saved mid-stream and put into a fresh generator: the next draws are equal."""
        assert callable(make)
        used, fresh = make(), make()
        used.standard_normal(5)
        saved = jw.rng_state(used)
        expected = used.standard_normal(4)
        jw.set_rng_state(fresh, saved)
        assert expected.tolist() == fresh.standard_normal(4).tolist()


class TestExternalSaves:
    """An external checkpointer's pending saves when the run ends."""

    def test_a_registered_checkpointer_is_waited_for_when_the_run_fails(
        self, tmp_path: Path
    ) -> None:
        """fail_after with a registered checkpointer: its wait runs before the run ends."""
        waited: list[str] = []
        attached = jw.attach(
            data_hash="none",
            name="toy",
            checkpoint_dir=tmp_path / "ck",
            steps=3,
            faults={"fail_after": 2},
            events=io.StringIO(),
            checkpoints="external",
            argv=[],
            environ={},
        )

        def fails_at_2() -> None:
            with attached as run:
                run.checkpointer(lambda: waited.append("waited"))
                state = {"params": np.zeros(2, np.float32)}
                for step in run.steps(state):
                    run.progress(step, state)

        with pytest.raises(jw.RunEnded) as ended:
            fails_at_2()
        assert (ended.value.exit_status, waited) == (10, ["waited"])

    def test_an_unfinished_save_left_in_the_directory_is_named(
        self, tmp_path: Path, capfd: pytest.CaptureFixture[str]
    ) -> None:
        """An Orbax temporary folder in the checkpoint directory at the end: named on stderr."""
        ck = tmp_path / "ck"
        with jw.attach(
            data_hash="none",
            name="toy",
            checkpoint_dir=ck,
            steps=1,
            events=io.StringIO(),
            checkpoints="external",
            argv=[],
            environ={},
        ) as run:
            state = {"params": np.zeros(2, np.float32)}
            for step in run.steps(state):
                (ck / "1.orbax-checkpoint-tmp-17").mkdir()
                run.progress(step, state)
        err = capfd.readouterr().err
        assert "1 unfinished save(s)" in err
        assert "1.orbax-checkpoint-tmp-17" in err


@pytest.mark.slow
def test_the_nnx_recipe_in_the_docs_resumes_exactly(compile_cache: Path, tmp_path: Path) -> None:
    """docs/sdk.md's NNX program as written: failed after update 7 and run again, the model,
    the optimizer and the Rngs stream are put back with nnx.update, proven update by update."""
    pytest.importorskip("flax")
    (tmp_path / "recipe.py").write_text(nnx_recipe())
    recipe = Runner(tmp_path / "recipe.py", tmp_path / "user", compile_cache)
    reference = recipe("--checkpoint-dir", str(tmp_path / "ref"))
    assert reference.exit_status == 0, stderr_of(reference)
    ck = str(tmp_path / "ck")
    failed = recipe(run_file=RunFile(checkpoint_dir=ck, faults=FaultSection(fail_after=7)))
    assert failed.exit_status == 10, stderr_of(failed)
    resumed = recipe("--checkpoint-dir", ck)
    assert resumed.exit_status == 0, stderr_of(resumed)
    restored = kinds(resumed, "restored")[0]
    assert restored["step"] > 0
    assert {"model", "optimizer", "rngs", "data"} <= set(restored["components"])
    report = proven(reference, failed, resumed)
    assert report.proven, verify.render(report)
