"""The SDK in a user's own program: drills, resume, refusal, preemption, own checkpointer."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import jobwarden.sdk as jw
from jobwarden import statetree as state_tree
from jobwarden.checkpoint import format
from jobwarden.errors import JobFileError
from jobwarden.events import Event, Malformed, parse_lines, read_events
from jobwarden.hashing import files_digest
from jobwarden.jobfile import job_from_mapping
from jobwarden.proof import verify
from jobwarden.sdk.provenance import SDK_SOURCES, normalize_config
from jobwarden.sdk.settings import RUN_FILE_ENV, resolve, split_argv
from jobwarden.worker.builtin import source_files
from tests.helpers import AttemptResult, kinds

PROGRAM = Path(__file__).with_name("sdk_program.py")
Program = Callable[..., AttemptResult]


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's program, copied where a user would keep it."""
    folder = tmp_path_factory.mktemp("user")
    return Path(shutil.copy(PROGRAM, folder / "train.py"))


def launch(program: Path, cache: Path, run_file: Path | None, *args: str) -> subprocess.Popen[str]:
    """Start ``python train.py ARGS`` as a user would, events on stdout."""
    env = dict(os.environ, JOBWARDEN_COMPILE_CACHE=str(cache))
    env.pop(RUN_FILE_ENV, None)
    if run_file is not None:
        env[RUN_FILE_ENV] = str(run_file)
    return subprocess.Popen(
        [sys.executable, str(program), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.fixture(scope="module")
def runner(program: Path, tmp_path_factory: pytest.TempPathFactory) -> Program:
    """Run the program to its end; its stdout is kept as the attempt's events.jsonl."""
    base = tmp_path_factory.mktemp("attempts")
    cache = tmp_path_factory.mktemp("cache")
    cache.chmod(0o700)
    counter = iter(range(1, 1000))

    def run(*args: str, run_file: Path | None = None) -> AttemptResult:
        folder = base / str(next(counter))
        folder.mkdir()
        with launch(program, cache, run_file, *args) as proc:
            out, err = proc.communicate(timeout=120)
        (folder / "events.jsonl").write_text(out)
        (folder / "stderr.log").write_text(err)
        return AttemptResult(folder, proc.returncode)

    return run


@pytest.fixture(scope="module")
def reference(runner: Program, tmp_path_factory: pytest.TempPathFactory) -> AttemptResult:
    """The uninterrupted run, standalone: 12 steps, a checkpoint every 4."""
    result = runner("--checkpoint-dir", str(tmp_path_factory.mktemp("ref") / "ck"))
    assert result.exit_status == 0, (result.folder / "stderr.log").read_text()[-3000:]
    return result


@pytest.fixture(scope="module")
def failed_at_6(runner: Program, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A checkpoint directory left by ``fail_after`` 6: step 4 committed."""
    ck = tmp_path_factory.mktemp("failed") / "ck"
    failed = runner("--checkpoint-dir", str(ck), "--fail-after", "6")
    assert failed.exit_status == 10, (failed.folder / "stderr.log").read_text()[-3000:]
    return ck, failed


def proven(reference: AttemptResult, *attempts: AttemptResult) -> verify.Report:
    """Verify attempts (in order) against the reference run."""
    candidate = verify.Run("candidate", [list(a.events()) for a in attempts], 0)
    return verify.verify(verify.load_run(reference.folder), candidate)


@pytest.mark.slow
def test_fail_after_then_running_again_resumes_exactly(
    reference: AttemptResult,
    failed_at_6: tuple[Path, AttemptResult],
    runner: Program,
    tmp_path: Path,
) -> None:
    """Failed after update 6, run again: restored at 4 with its data position, proven exact."""
    ck = Path(shutil.copytree(failed_at_6[0], tmp_path / "ck"))
    failed = failed_at_6[1]
    assert kinds(failed, "failed")[0]["code"] == "worker.injected_failure"
    resumed = runner("--checkpoint-dir", str(ck))
    assert resumed.exit_status == 0
    assert [e["step"] for e in kinds(resumed, "restored")] == [4]
    assert [e["step"] for e in kinds(resumed, "progress")] == list(range(5, 13))
    restored = format.read(Path(kinds(resumed, "restored")[0]["file"]))
    assert (restored.arrays["data/epoch"].item(), restored.arrays["data/index"].item()) == (0, 4)
    assert "data" in kinds(resumed, "restored")[0]["components"]
    assert restored.arrays["key"].dtype == np.uint32
    report = proven(reference, failed, resumed)
    assert report.proven, verify.render(report)
    assert not any(isinstance(e, Malformed) for e in read_events(resumed.folder / "events.jsonl"))
    assert "starting after step 4" in (resumed.folder / "stderr.log").read_text()
    cli = subprocess.run(
        [
            str(Path(sys.executable).with_name("wardenctl")),
            "verify",
            str(reference.folder / "events.jsonl"),
            str(resumed.folder / "events.jsonl"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert cli.returncode == 0, cli.stdout + cli.stderr


@pytest.mark.slow
def test_crash_after_under_a_run_file_resumes_exactly(
    reference: AttemptResult, runner: Program, tmp_path: Path
) -> None:
    """The run file's checkpoint_dir, cadence and crash_after win; the retry without it is exact."""
    ck = tmp_path / "ck"
    spec = {"checkpoint_dir": str(ck), "job_id": "user-job", "run": {"checkpoint_every": 3}}
    faulted = tmp_path / "faulted.json"
    faulted.write_text(json.dumps({**spec, "faults": {"crash_after": 8}}))
    crashed = runner("--checkpoint-dir", str(tmp_path / "ignored"), run_file=faulted)
    assert crashed.exit_status == -signal.SIGKILL
    assert [e["step"] for e in kinds(crashed, "checkpoint")] == [3, 6]
    assert kinds(crashed, "started")[0]["job"] == "user-job"
    assert not (tmp_path / "ignored").exists()
    retry = tmp_path / "retry.json"
    retry.write_text(json.dumps(spec))
    resumed = runner(run_file=retry)
    assert [e["step"] for e in kinds(resumed, "restored")] == [6]
    report = proven(reference, crashed, resumed)
    assert report.proven, verify.render(report)


@pytest.mark.slow
def test_changed_learning_rate_is_refused_naming_the_field(
    failed_at_6: tuple[Path, AttemptResult], runner: Program, tmp_path: Path
) -> None:
    """Resuming with another learning rate: checkpoint.config, exit 25, the dotted field named."""
    ck = Path(shutil.copytree(failed_at_6[0], tmp_path / "ck"))
    refused = runner("--checkpoint-dir", str(ck), "--learning-rate", "0.2")
    assert refused.exit_status == 25
    failed = kinds(refused, "failed")[0]
    assert failed["code"] == "checkpoint.config"
    assert failed["fields"] == {"optim.learning_rate": [0.1, 0.2]}
    assert not kinds(refused, "progress")


@pytest.mark.slow
def test_sigterm_commits_exits_75_and_resumes_exactly(
    program: Path, reference: AttemptResult, runner: Program, tmp_path: Path
) -> None:
    """SIGTERM mid-run: the step in flight is committed, exit 75; running again is exact."""
    ck, cache = tmp_path / "ck", tmp_path / "cache"
    cache.mkdir(mode=0o700)
    args = ("--checkpoint-dir", str(ck), "--step-delay", "0.1")
    with launch(program, cache, None, *args) as proc:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if '"progress"' in line and json.loads(line)["step"] >= 2:
                proc.send_signal(signal.SIGTERM)
                break
        rest, _ = proc.communicate(timeout=60)
    folder = tmp_path / "preempted"
    folder.mkdir()
    (folder / "events.jsonl").write_text("".join(lines) + rest)
    preempted = AttemptResult(folder, proc.returncode)
    assert preempted.exit_status == 75
    stop = kinds(preempted, "preempted")[0]["step"]
    assert 2 <= stop < 12
    assert kinds(preempted, "checkpoint")[-1]["step"] == stop
    resumed = runner("--checkpoint-dir", str(ck))
    assert [e["step"] for e in kinds(resumed, "restored")] == [stop]
    report = proven(reference, preempted, resumed)
    assert report.proven, verify.render(report)


@pytest.mark.slow
def test_own_checkpointer_is_verified_from_state_hashes(
    reference: AttemptResult, runner: Program, tmp_path: Path
) -> None:
    """progress/restored without SDK checkpoints: a log that verifies, no jobwarden file written."""
    own = tmp_path / "own"
    failed = runner("--own-checkpoints", str(own), "--fail-after", "6")
    assert failed.exit_status == 10
    resumed = runner("--own-checkpoints", str(own))
    assert resumed.exit_status == 0
    restored = kinds(resumed, "restored")[0]
    assert (restored["step"], restored["checks"], restored["checkpointer"]) == (4, [], "external")
    assert not kinds(resumed, "checkpoint")
    assert sorted(p.name for p in own.iterdir()) == ["step-12.npz", "step-4.npz", "step-8.npz"]
    report = proven(reference, failed, resumed)
    assert report.proven, verify.render(report)


@pytest.mark.slow
def test_a_data_position_left_out_of_the_restore_is_caught(
    reference: AttemptResult,
    failed_at_6: tuple[Path, AttemptResult],
    runner: Program,
    tmp_path: Path,
) -> None:
    """A resume that restarts the data pipeline passes validation; verify names component data."""
    ck = Path(shutil.copytree(failed_at_6[0], tmp_path / "ck"))
    resumed = runner("--checkpoint-dir", str(ck), "--forget-data-position")
    assert resumed.exit_status == 0
    report = proven(reference, failed_at_6[1], resumed)
    assert not report.proven
    assert report.first_divergence is not None
    assert report.first_divergence["restored_state"]["components"] == ["data"]


class TestSettings:
    """Where an attached program's settings come from, and which wins."""

    def test_run_file_over_command_line_over_program(self, tmp_path: Path) -> None:
        """The run file's fields win, the command line's next, the program's fill the rest."""
        run_file = tmp_path / "run.json"
        run_file.write_text(json.dumps({"checkpoint_dir": "/srv/ck", "run": {"steps": 20}}))
        settings = resolve(
            checkpoint_dir="mine",
            run={"steps": 5, "checkpoint_every": 5},
            faults={"fail_after": 3},
            compile_cache=None,
            signing_key=None,
            job_id=None,
            options={"checkpoint_dir": "cli", "signing_key": "/k"},
            environ={RUN_FILE_ENV: str(run_file)},
        )
        expected = (Path("/srv/ck"), 20, 5, 3, Path("/k"))
        run, faults = settings.run, settings.faults
        actual = (settings.checkpoint_dir, run.steps, run.checkpoint_every, faults.fail_after)
        assert expected == (*actual, settings.signing_key)

    def test_split_argv_leaves_the_program_its_own_options(self) -> None:
        """Only the SDK's options are taken; the rest keeps its order."""
        argv = ["--lr", "0.1", "--checkpoint-dir=ck", "data.txt", "--compile-cache", "c"]
        expected = ({"checkpoint_dir": "ck", "compile_cache": "c"}, ["--lr", "0.1", "data.txt"])
        assert expected == split_argv(argv)

    def test_a_bad_run_file_lists_every_problem(self, tmp_path: Path) -> None:
        """Unknown fields and bad values in the run file are all named."""
        run_file = tmp_path / "run.json"
        run_file.write_text(json.dumps({"checkpoint_dir": "/ck", "run": {"steps": 0}, "x": 1}))
        with pytest.raises(JobFileError) as caught:
            resolve(
                checkpoint_dir=None,
                run={},
                faults=None,
                compile_cache=None,
                signing_key=None,
                job_id=None,
                options={},
                environ={RUN_FILE_ENV: str(run_file)},
            )
        assert len(caught.value.problems) == 2

    def test_config_is_flattened_to_dotted_json_fields(self) -> None:
        """Nested training fields get dotted names; tuples and numpy numbers come back as JSON."""
        config = {"optim": {"lr": np.float32(0.5), "betas": (0.9, 0.99)}, "seed": 1}
        expected = {"optim.lr": 0.5, "optim.betas": [0.9, 0.99], "seed": 1}
        assert expected == normalize_config(config)

    def test_a_config_value_that_is_not_json_is_named(self) -> None:
        """A non-JSON training field is refused by name."""
        with pytest.raises(JobFileError, match=r"config\.model\.act"):
            normalize_config({"model": {"act": object()}})


class TestState:
    """Any pytree as a state: typed keys, Python and numpy scalars, arrays."""

    def test_restore_gives_each_leaf_back_in_its_kind(self) -> None:
        """Flattened and restored, every leaf has its template's kind and equal bits."""
        import jax
        import jax.numpy as jnp

        state = {
            "key": jax.random.key(7),
            "data": {"epoch": 3, "index": np.int32(5), "order": np.arange(4)},
            "params": jnp.ones(2),
            "flag": True,
        }
        arrays = dict(state_tree.flatten(state))
        back = state_tree.unflatten_like(state, arrays)
        assert arrays["key"].dtype == np.uint32
        expected = [type(leaf) for leaf in jax.tree_util.tree_leaves(state)]
        assert expected == [type(leaf) for leaf in jax.tree_util.tree_leaves(back)]
        assert dict(state_tree.flatten(back)).keys() == arrays.keys()
        assert all(np.array_equal(arrays[p], a) for p, a in state_tree.flatten(back))


class TestCachedHashing:
    """The cached flattening and hashing give exactly what state.flatten and state_hash do."""

    @staticmethod
    def states() -> list[Any]:
        """States of every kind of leaf, and the same structure again with other shapes."""
        import jax
        import jax.numpy as jnp

        wide = np.arange(24, dtype=np.float32).reshape(4, 6)
        return [
            {
                "key": jax.random.key(7),
                "rbg": jax.random.key(1, impl="rbg"),
                "raw": jax.random.PRNGKey(3),
                "data": {"epoch": 3, "index": np.int32(5), "rate": 0.5, "flag": True},
                "params": {"w": jnp.ones((3, 2)), "b": jnp.zeros((), jnp.bfloat16)},
                "numpy": {"big": np.arange(5, dtype=">f8"), "strided": wide[:, ::2]},
                "small": (jnp.int8(-3), np.float16(1.5), np.array([True, False])),
            },
            {
                "key": jax.random.key(8),
                "rbg": jax.random.key(2, impl="rbg"),
                "raw": jax.random.PRNGKey(4),
                "data": {"epoch": 4, "index": np.int32(0), "rate": 0.25, "flag": False},
                "params": {"w": jnp.ones((2, 5)), "b": jnp.ones((1,), jnp.bfloat16)},
                "numpy": {"big": np.arange(2, dtype=">i4"), "strided": wide.T},
                "small": (jnp.int8(4), np.float16(-2.0), np.array(True)),
            },
            {"params": jnp.arange(3.0), "step": np.int64(9)},
        ]

    def test_the_same_leaves_and_the_same_hashes_update_after_update(self) -> None:
        """Every state twice over (cache cold, then warm): equal paths, bits and hashes."""
        from jobwarden.hashing import StateHasher, state_hash
        from jobwarden.sdk.leaves import Flattener

        flatten, hasher = Flattener(), StateHasher()
        for state in self.states() * 2:
            expected, found = state_tree.flatten(state), flatten(state)
            assert [p for p, _ in expected] == [p for p, _ in found]
            for (_, want), (_, got) in zip(expected, found, strict=True):
                assert (want.dtype, want.shape, want.tobytes()) == (
                    got.dtype,
                    got.shape,
                    got.tobytes(),
                )
            assert state_hash(expected, 11) == hasher(found, 11)

    def test_a_snapshot_hashed_from_its_buffers_hashes_the_same(self) -> None:
        """`Snapshot.hash` (the arrays' own buffers joined per component, no host views)
        gives state_hash for every kind of leaf, cold and warm, and keeps to the buffers."""
        from jobwarden.hashing import StateHasher, state_hash
        from jobwarden.sdk.leaves import Flattener

        flatten, hasher = Flattener(), StateHasher()
        for step, state in enumerate(self.states() * 2):
            expected = state_hash(state_tree.flatten(state), step)
            assert expected == flatten.snapshot(state).hash(hasher, step)
        assert flatten.exports

    def test_a_large_leaf_is_hashed_where_it_lies_and_hashes_the_same(self) -> None:
        """Leaves over JOINED_AT_MOST between small ones, in one component and across."""
        import jax.numpy as jnp

        from jobwarden.hashing import JOINED_AT_MOST, StateHasher, state_hash
        from jobwarden.sdk.leaves import Flattener

        big = JOINED_AT_MOST // 4 + 1  # float32: one element over the bound
        state = {
            "model": {"a": jnp.ones(3), "b": jnp.arange(big, dtype=jnp.float32), "c": jnp.ones(2)},
            "opt": {"m": jnp.full(big + 5, 2.0), "n": np.arange(4)},
        }
        flatten, hasher = Flattener(), StateHasher()
        for step in range(2):
            assert state_hash(state_tree.flatten(state), step) == flatten.snapshot(state).hash(
                hasher, step
            )

    def test_a_state_whose_array_refuses_its_buffer_is_hashed_from_host_views(self) -> None:
        """An array over two devices exports no buffer: the same hash, from host views, and
        the flattener stops trying."""
        script = textwrap.dedent(
            """
            import os
            os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
            import jax, jax.numpy as jnp, numpy as np
            from jax.sharding import Mesh, NamedSharding, PartitionSpec
            from jobwarden import statetree
            from jobwarden.hashing import StateHasher, state_hash
            from jobwarden.sdk.leaves import Flattener
            mesh = Mesh(np.array(jax.devices()), ("d",))
            spread = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, PartitionSpec("d")))
            state = {"a": jnp.ones(3), "spread": spread}
            flatten, hasher = Flattener(), StateHasher()
            found = flatten.snapshot(state).hash(hasher, 4)
            assert found == state_hash(statetree.flatten(state), 4), found
            assert not flatten.exports
            print("ok")
            """
        )
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=False
        )
        assert done.stdout.strip() == "ok", done.stderr[-2000:]

    def test_a_leaf_a_checkpoint_cannot_hold_is_refused_the_same_way(self) -> None:
        """A string leaf or a complex array: UnsupportedLeaf naming the leaf, cached or not."""
        import jax.numpy as jnp

        from jobwarden.sdk.leaves import Flattener

        flatten = Flattener()
        for bad in ("text", jnp.ones(2, jnp.complex64)):
            state = {"params": jnp.ones(2), "bad": bad}
            with pytest.raises(state_tree.UnsupportedLeaf) as expected:
                state_tree.flatten(state)
            with pytest.raises(state_tree.UnsupportedLeaf) as found:
                flatten(state)
            assert str(expected.value) == str(found.value)


class TestHeldEvents:
    """Unhashed progress events share later writes; what proves something is written at once."""

    @staticmethod
    def lines(stream: io.StringIO) -> list[tuple[str, int | None]]:
        """The (kind, step) of every event written so far."""
        parsed = parse_lines(stream.getvalue().splitlines())
        return [
            (e.kind, e.get("step")) if isinstance(e, Event) else ("malformed", None) for e in parsed
        ]

    def test_held_events_go_out_in_order_before_the_next_written_one(self) -> None:
        """Three held progress events, then a checkpoint: nothing before it, all four with it."""
        from jobwarden.sdk.stream import RunEmitter

        stream, now = io.StringIO(), [0.0]
        emitter = RunEmitter(stream, clock=lambda: now[0])
        for step in (1, 2, 3):
            emitter.emit_held(
                "progress", step=step, loss=0.5, examples=0, update_s=0.001, **NO_HASH
            )
        assert self.lines(stream) == []
        emitter.emit("checkpoint", step=3, file="f", bytes=1, seconds=0.0, state_hash="h")
        expected = [("progress", 1), ("progress", 2), ("progress", 3), ("checkpoint", 3)]
        assert expected == self.lines(stream)

    def test_an_event_after_a_quiet_spell_or_a_full_hold_is_written_at_once(self) -> None:
        """HOLD_S after the last write, or HOLD_EVENTS held, the held events are written."""
        from jobwarden.sdk.stream import HOLD_EVENTS, HOLD_S, RunEmitter

        stream, now = io.StringIO(), [0.0]
        emitter = RunEmitter(stream, clock=lambda: now[0])
        emitter.emit_held("progress", step=1, loss=0.5, examples=0, update_s=0.1, **NO_HASH)
        now[0] += HOLD_S / 2
        emitter.emit_held("progress", step=2, loss=0.5, examples=0, update_s=0.1, **NO_HASH)
        assert self.lines(stream) == []
        now[0] += HOLD_S / 2
        emitter.emit_held("progress", step=3, loss=0.5, examples=0, update_s=0.1, **NO_HASH)
        assert self.lines(stream) == [("progress", 1), ("progress", 2), ("progress", 3)]
        for step in range(4, 4 + HOLD_EVENTS):
            emitter.emit_held("progress", step=step, loss=0.5, examples=0, update_s=0, **NO_HASH)
        assert len(self.lines(stream)) == 3 + HOLD_EVENTS

    @pytest.mark.parametrize("where", ["here", "thread"])
    def test_a_run_writes_every_event_by_its_end_and_a_thread_hashed_one_once_hashed(
        self, where: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """hash_every=3: every event is out by the end, in order, the hashed ones hashed.  A
        state hashed on the emitter's thread has its event out once the emitter is drained;
        a small one hashed on the training thread may be held for a later write, as an
        unhashed one is (`HOLD_S`)."""
        if where == "thread":
            monkeypatch.setattr("jobwarden.sdk.run.HASHED_HERE_BELOW", 0)
        events = io.StringIO()
        seen_after: dict[int, list[tuple[str, int | None]]] = {}
        with jw.attach(
            config={"lr": 0.1},
            data_hash="none",
            name="toy",
            steps=7,
            hash_every=3,
            checkpoints="external",
            events=events,
            argv=[],
            environ={},
        ) as run:
            state = {"params": np.zeros(2, np.float32)}
            for step in run.steps(state):
                state = {"params": state["params"] + 1}
                run.progress(step, state, loss=float(step))
                run.emitter.drain()
                seen_after[step] = self.lines(events)
        parsed = parse_lines(events.getvalue().splitlines())
        progress = [e for e in parsed if isinstance(e, Event) and e.kind == "progress"]
        hashed = [e["step"] for e in progress if e["state_hash"] is not None]
        assert ([e["step"] for e in progress], hashed) == ([1, 2, 3, 4, 5, 6, 7], [3, 6, 7])
        if where == "thread":
            assert all(("progress", step) in seen_after[step] for step in hashed)


NO_HASH: dict[str, Any] = {"state_hash": None}


class TestRun:
    """The run in process: what the loop refuses."""

    def test_an_update_never_reported_ends_the_run_as_a_bug(self, tmp_path: Path) -> None:
        """Asking for the next step without run.progress: worker.internal, exit 70."""
        events = io.StringIO()
        attached = jw.attach(
            config={"lr": 0.1},
            data_hash="none",
            name="toy",
            checkpoint_dir=tmp_path / "ck",
            steps=3,
            events=events,
            argv=[],
            environ={},
        )

        def loop_without_progress() -> None:
            with attached as run:
                state = run.restore({"params": np.zeros(2, np.float32)})
                for _ in run.steps(state):
                    pass

        with pytest.raises(jw.RunEnded) as ended:
            loop_without_progress()
        parsed = [e for e in parse_lines(events.getvalue().splitlines()) if isinstance(e, Event)]
        assert (ended.value.exit_status, parsed[-1]["code"]) == (70, "worker.internal")


def toy(events: Path, ck: Path, **faults: int) -> None:
    """A small program run in this process: six noisy updates, events appended to a file."""
    import jax
    import jax.numpy as jnp

    with jw.attach(
        config={"rate": 0.5},
        data_hash="toy",
        name="toy",
        checkpoint_dir=ck,
        steps=6,
        checkpoint_every=2,
        faults=faults,
        events=events,
        argv=[],
        environ={},
    ) as run:
        state = run.restore({"params": jnp.zeros(2), "key": jax.random.key(1)})
        for step in run.steps(state):
            key, sub = jax.random.split(state["key"])
            params = state["params"] - 0.5 * (state["params"] - jax.random.normal(sub, (2,)))
            state = {"params": params, "key": key}
            run.progress(step, state, loss=float(params.sum()))


def test_an_events_file_gathers_the_attempts_and_verifies(tmp_path: Path) -> None:
    """events= appends each attempt to one log; verify proves the resumed run from it."""
    toy(tmp_path / "ref.jsonl", tmp_path / "ref")
    with pytest.raises(jw.RunEnded) as ended:
        toy(tmp_path / "run.jsonl", tmp_path / "ck", fail_after=3)
    toy(tmp_path / "run.jsonl", tmp_path / "ck")
    reference = verify.load_run(tmp_path / "ref.jsonl")
    report = verify.verify(reference, verify.load_run(tmp_path / "run.jsonl"))
    assert (ended.value.exit_status, report.restored_steps) == (10, [2])
    assert report.proven, verify.render(report)


def test_the_worker_source_hash_covers_the_task_the_driver_and_the_sdk() -> None:
    """linreg's hash covers linreg.py, the driver, the SDK's loop and statetree.py, stably."""
    job = job_from_mapping({"id": "j", "task": "linreg"})
    names = [p.name for p in [*source_files(job), *SDK_SOURCES]]
    assert names == ["linreg.py", "builtin.py", "run.py", "statetree.py"]
    paths = [*source_files(job), *SDK_SOURCES]
    assert files_digest(paths) == files_digest(paths)
