"""A user's own task, registered as a ``jobwarden.tasks`` entry point, with a data position."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from jobwarden.checkpoint import format
from jobwarden.errors import JobFileError
from jobwarden.jobfile import load_job
from jobwarden.proof import verify
from tests.helpers import job, kinds, run_worker

TASK = '''
from typing import Any, ClassVar

from pydantic import Field

from jobwarden.tasks import Task, TrainFields


class SweepTrain(TrainFields):
    seed: int = Field(0, ge=0)
    learning_rate: float = Field(0.1, gt=0, lt=1)
    batch_size: int = Field(4, ge=1, le=32)


class Sweep(Task):
    """Sequential minibatches over a fixed dataset: the data position is part of the state."""

    name: ClassVar[str] = "sweep"
    Train: ClassVar[type[TrainFields]] = SweepTrain

    def data(self) -> dict[str, Any]:
        import jax.numpy as jnp

        x = jnp.arange(32, dtype=jnp.float32) / 32
        return {"x": x, "y": 3 * x - 1}

    def init_state(self, data: dict[str, Any]) -> dict[str, Any]:
        import jax
        import jax.numpy as jnp

        return {"params": jnp.zeros(2), "opt_state": {}, "key": jax.random.PRNGKey(self.train.seed),
                "data_position": jnp.zeros((), jnp.int32)}

    def update(self, data: dict[str, Any]) -> Any:
        import jax
        import jax.numpy as jnp

        batch, rate = self.train.batch_size, self.train.learning_rate

        def step(state: dict[str, Any]) -> tuple[dict[str, Any], Any]:
            start = state["data_position"]
            x = jax.lax.dynamic_slice(data["x"], (start,), (batch,))
            y = jax.lax.dynamic_slice(data["y"], (start,), (batch,))
            loss, grad = jax.value_and_grad(
                lambda p: jnp.mean((p[0] * x + p[1] - y) ** 2))(state["params"])
            position = (start + batch) % (32 - batch)
            return {**state, "params": state["params"] - rate * grad,
                    "data_position": position.astype(jnp.int32)}, loss

        return step
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the module and the metadata that registers it as task 'sweep'."""
    folder = tmp_path_factory.mktemp("plugin")
    (folder / "sweep_task.py").write_text(textwrap.dedent(TASK))
    info = folder / "sweep_task-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sweep-task\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[jobwarden.tasks]\nsweep = sweep_task:Sweep\n")
    return folder


@pytest.mark.slow
def test_a_registered_task_is_supervised_and_resumed_exactly(
    plugin: Path, tmp_path: Path, compile_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker finds the task by name; its data position is checkpointed and restored."""
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(plugin), os.environ.get("PYTHONPATH", "")])
    )
    run = {"steps": 10, "checkpoint_every": 3}
    ref = run_worker(
        job(tmp_path / "ref.toml", "ref", "sweep", run=run),
        tmp_path / "ref-ck",
        tmp_path / "ref",
        compile_cache,
    )
    assert ref.exit_status == 0, (tmp_path / "ref" / "stderr.log").read_text()[-2000:]
    ck = tmp_path / "ck"
    failed = run_worker(
        job(tmp_path / "f.toml", "s", "sweep", run=run, faults={"fail_after": 7}),
        ck,
        tmp_path / "a1",
        compile_cache,
    )
    resumed = run_worker(
        job(tmp_path / "r.toml", "s", "sweep", run=run), ck, tmp_path / "a2", compile_cache
    )
    assert failed.exit_status == 10
    assert [e["step"] for e in kinds(resumed, "restored")] == [6]
    restored = format.read(Path(kinds(resumed, "restored")[0]["file"]))
    assert restored.arrays["data_position"].tolist() == (6 * 4) % 28
    assert "data_position" in kinds(resumed, "restored")[0]["components"]
    candidate = verify.Run("resumed", [list(failed.events()), list(resumed.events())], 0)
    report = verify.verify(verify.load_run(ref.folder), candidate)
    assert report.proven, verify.render(report)


def test_one_broken_plugin_does_not_break_the_others(
    plugin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plugin whose import fails, or that is not a Task, is named when used; every other
    task, built-in or plugin, still validates."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "bad_task.py").write_text("import not_installed_anywhere\n")
    (broken / "odd_task.py").write_text("Odd = 3\n")
    info = broken / "bad_task-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: bad-task\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[jobwarden.tasks]\nbad = bad_task:Bad\nodd = odd_task:Odd\n"
    )
    monkeypatch.syspath_prepend(str(plugin))
    monkeypatch.syspath_prepend(str(broken))
    assert load_job(job(tmp_path / "l.toml", "l", "linreg")).task == "linreg"
    assert load_job(job(tmp_path / "s.toml", "s", "sweep")).task == "sweep"
    with pytest.raises(JobFileError) as caught:
        load_job(job(tmp_path / "b.toml", "b", "bad"))
    (problem,) = caught.value.problems
    assert problem.startswith("task: the plugin task 'bad' cannot be used: bad_task:Bad failed")
    assert "ModuleNotFoundError" in problem
    with pytest.raises(JobFileError) as caught:
        load_job(job(tmp_path / "o.toml", "o", "odd"))
    assert "odd_task:Odd is not a subclass of jobwarden.tasks.Task" in caught.value.problems[0]
