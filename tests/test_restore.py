"""Restore over real workers: damaged files are quarantined, incompatible ones escalate."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import pytest

from jobwarden import files
from jobwarden.checkpoint import format
from jobwarden.checkpoint.store import file_name
from jobwarden.proof import verify
from tests.conftest import Runner
from tests.helpers import AttemptResult, job, kinds, rewrite_checkpoint


@pytest.fixture(scope="module")
def stopped_at_5(tmp_path_factory: pytest.TempPathFactory, compile_cache: Path) -> Path:
    """A checkpoint directory left by a failure after update 5: steps 2 and 4 committed."""
    from tests.helpers import run_worker

    base = tmp_path_factory.mktemp("stopped")
    spec = job(base / "f.toml", "corrupt", faults={"fail_after": 5})
    result = run_worker(spec, base / "ck", base / "attempt", compile_cache)
    assert result.exit_status == 10
    return base / "ck"


@pytest.fixture
def ck(stopped_at_5: Path, tmp_path: Path) -> Path:
    """A private copy of the stopped run's checkpoint directory."""
    return Path(shutil.copytree(stopped_at_5, tmp_path / "ck"))


def resume(
    worker: Runner, tmp_path: Path, ck: Path, **sections: dict[str, object]
) -> AttemptResult:
    """Run the job again on ``ck`` (same id and training fields unless overridden)."""
    return worker(job(tmp_path / "resume.toml", "corrupt", **sections), ck)


def rewrite_runtime(path: Path, edit: Callable[[dict[str, str]], object]) -> None:
    """Write ``path`` back as a fully valid checkpoint whose recorded runtime ``edit`` changed
    (in place): a checkpoint written under another runtime."""
    checkpoint = format.read(path)
    runtime = dict(checkpoint.manifest.provenance.runtime)
    edit(runtime)
    provenance = dataclasses.replace(checkpoint.manifest.provenance, runtime=runtime)
    manifest = dataclasses.replace(checkpoint.manifest, provenance=provenance)
    files.commit(path, format.encode(manifest, checkpoint.leaves()))


def continues_exactly(reference: AttemptResult, resumed: AttemptResult) -> bool:
    """Whether the resumed attempt's every update equals the reference's."""
    candidate = verify.Run("resumed", [list(resumed.events())], 0)
    return verify.verify(verify.load_run(reference.folder), candidate).proven


def assert_quarantined(ck: Path, name: str, original: bytes, code: str) -> None:
    """The refused file sits unchanged in quarantine/ beside a reason naming ``code``."""
    kept = ck / "quarantine" / name
    assert kept.read_bytes() == original
    reason = json.loads((ck / "quarantine" / f"{name}.reason.json").read_text())
    assert reason["code"] == code


def test_changed_momentum_value_is_refused_by_checksum_and_older_one_used(
    reference: AttemptResult, worker: Runner, tmp_path: Path, ck: Path
) -> None:
    """One velocity value changed in place: checksum refusal, quarantine, fallback to step 2."""
    path = ck / file_name(4)
    checkpoint = format.read(path)
    raw = bytearray(path.read_bytes())
    velocity = checkpoint.arrays["opt_state/velocity"].copy()
    old = velocity.tobytes()
    velocity[0] += 1.0
    at = raw.find(old)
    raw[at : at + len(old)] = velocity.tobytes()
    path.write_bytes(bytes(raw))
    resumed = resume(worker, tmp_path, ck)
    restored = kinds(resumed, "restored")[0]
    assert restored["step"] == 2
    assert [(s["file"], s["code"]) for s in restored["skipped"]] == [
        (file_name(4), "checkpoint.checksum")
    ]
    assert_quarantined(ck, file_name(4), bytes(raw), "checkpoint.checksum")
    assert continues_exactly(reference, resumed)


def test_truncated_newest_checkpoint_is_quarantined_and_older_one_used(
    reference: AttemptResult, worker: Runner, tmp_path: Path, ck: Path
) -> None:
    """A newest file cut short is refused as truncated; the resume from step 2 is exact."""
    path = ck / file_name(4)
    cut = path.read_bytes()[:-5]
    path.write_bytes(cut)
    resumed = resume(worker, tmp_path, ck)
    restored = kinds(resumed, "restored")[0]
    assert restored["step"] == 2
    assert restored["skipped"][0]["code"] == "checkpoint.truncated"
    assert_quarantined(ck, file_name(4), cut, "checkpoint.truncated")
    assert continues_exactly(reference, resumed)


def test_leftover_pending_file_is_never_selected_and_is_quarantined(
    reference: AttemptResult, worker: Runner, tmp_path: Path, ck: Path
) -> None:
    """A pending file (even a complete one, of a later step) is passed over and preserved."""
    pending = ck / (file_name(6) + ".pending")
    data = (ck / file_name(4)).read_bytes()
    pending.write_bytes(data)
    resumed = resume(worker, tmp_path, ck)
    restored = kinds(resumed, "restored")[0]
    assert restored["step"] == 4
    assert restored["skipped"][0]["code"] == "checkpoint.pending"
    assert (ck / "quarantine" / pending.name).read_bytes() == data
    assert continues_exactly(reference, resumed)


@pytest.mark.slow
def test_crash_in_the_middle_of_a_commit_leaves_the_previous_checkpoint_in_use(
    reference: AttemptResult, worker: Runner, tmp_path: Path
) -> None:
    """Killed between the pending file's fsync and its rename: step 2 stays the newest."""
    ck = tmp_path / "ck"
    crashed = worker(job(tmp_path / "c.toml", "commit", faults={"crash_in_commit": 4}), ck)
    assert crashed.exit_status == -9
    assert sorted(p.name for p in ck.glob("ckpt-*")) == [file_name(2), file_name(4) + ".pending"]
    resumed = worker(job(tmp_path / "r.toml", "commit"), ck)
    restored = kinds(resumed, "restored")[0]
    assert restored["step"] == 2
    assert restored["skipped"][0]["code"] == "checkpoint.pending"
    assert continues_exactly(reference, resumed)


def test_changed_learning_rate_is_refused_as_incompatible_without_fallback(
    worker: Runner, tmp_path: Path, ck: Path
) -> None:
    """learning_rate 0.04 -> 0.05: refused naming the field and both values; nothing moved."""
    before = {p.name: p.read_bytes() for p in ck.glob("ckpt-*")}
    resumed = resume(worker, tmp_path, ck, train={"learning_rate": 0.05})
    assert resumed.exit_status == 25
    failed = kinds(resumed, "failed")[0]
    assert failed["code"] == "checkpoint.config"
    assert failed["fields"] == {"learning_rate": [0.04, 0.05]}
    assert "learning_rate (saved 0.04, requested 0.05)" in failed["message"]
    assert failed["path"].endswith(file_name(4))
    assert not kinds(resumed, "progress")
    assert {p.name: p.read_bytes() for p in ck.glob("ckpt-*")} == before
    assert not (ck / "quarantine").exists()


def test_changed_steps_are_accepted(worker: Runner, tmp_path: Path, ck: Path) -> None:
    """steps is operational: a retry that asks for 12 steps resumes at 4 and runs to 12."""
    resumed = resume(worker, tmp_path, ck, run={"steps": 12})
    assert resumed.exit_status == 0
    assert kinds(resumed, "restored")[0]["step"] == 4
    assert kinds(resumed, "completed")[0]["step"] == 12


def test_steps_below_the_saved_step_are_refused(worker: Runner, tmp_path: Path, ck: Path) -> None:
    """A retry asking for 3 steps cannot use a step-4 checkpoint: step_range names both."""
    resumed = resume(worker, tmp_path, ck, run={"steps": 3})
    assert resumed.exit_status == 31
    failed = kinds(resumed, "failed")[0]
    assert (failed["code"], failed["saved"], failed["requested"]) == ("checkpoint.step_range", 4, 3)


def test_runtime_change_is_refused_naming_the_field(
    worker: Runner, tmp_path: Path, ck: Path
) -> None:
    """A checkpoint recorded under other XLA flags is refused as a runtime mismatch."""
    rewrite_runtime(ck / file_name(4), lambda runtime: runtime.update(jaxlib="0.0.1"))
    resumed = resume(worker, tmp_path, ck)
    failed = kinds(resumed, "failed")[0]
    assert failed["code"] == "checkpoint.runtime"
    assert failed["fields"]["jaxlib"][0] == "0.0.1"
    assert resumed.exit_status == 27


def test_a_checkpoint_from_before_the_pinned_pool_is_refused_and_resumes_with_nproc_empty(
    reference: AttemptResult,
    worker: Runner,
    tmp_path: Path,
    ck: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A runtime without ``nproc`` (written before XLA's CPU pool was pinned) is refused,
    the message saying how to resume it; with ``NPROC`` set empty it resumes, exactly."""
    removed: list[str] = []
    rewrite_runtime(ck / file_name(4), lambda runtime: removed.append(runtime.pop("nproc")))
    assert removed == ["2"]
    refused = resume(worker, tmp_path, ck)
    failed = kinds(refused, "failed")[0]
    assert (failed["code"], failed["fields"]["nproc"]) == ("checkpoint.runtime", [None, "2"])
    assert "NPROC set empty" in failed["message"]
    monkeypatch.setenv("NPROC", "")
    resumed = resume(worker, tmp_path, ck)
    assert resumed.exit_status == 0
    assert kinds(resumed, "restored")[0]["step"] == 4
    assert continues_exactly(reference, resumed)


def test_weights_only_restore_passes_validation_but_verify_names_opt_state(
    reference: AttemptResult, worker: Runner, tmp_path: Path, ck: Path
) -> None:
    """Velocity zeroed with checksum recomputed: accepted, and verify finds the divergence."""
    rewrite_checkpoint(ck / file_name(4), {"opt_state/velocity": np.zeros(2, np.float32)})
    resumed = resume(worker, tmp_path, ck)
    assert resumed.exit_status == 0
    assert kinds(resumed, "restored")[0]["step"] == 4
    candidate = verify.Run("resumed", [list(resumed.events())], 0)
    report = verify.verify(verify.load_run(reference.folder), candidate)
    assert not report.proven
    assert report.first_divergence is not None
    assert report.first_divergence["step"] == 5
    assert report.first_divergence["restored_state"]["step"] == 4
    assert report.first_divergence["restored_state"]["components"] == ["opt_state"]
    leaves = report.first_divergence["restored_state"]["leaves"]
    assert [leaf["leaf"] for leaf in leaves] == ["opt_state/velocity"]


def test_reseeded_key_passes_validation_but_verify_names_the_key(
    reference: AttemptResult, worker: Runner, tmp_path: Path, ck: Path
) -> None:
    """The key replaced by PRNGKey(seed): accepted, and verify names key as the component."""
    rewrite_checkpoint(ck / file_name(4), {"key": np.asarray(jax.random.PRNGKey(3))})
    resumed = resume(worker, tmp_path, ck)
    report = verify.verify(
        verify.load_run(reference.folder), verify.Run("resumed", [list(resumed.events())], 0)
    )
    assert not report.proven
    assert report.first_divergence is not None
    assert report.first_divergence["restored_state"]["components"] == ["key"]
    assert report.first_divergence["step"] == 5
    assert "key" in report.first_divergence["components"]


def test_every_checkpoint_damaged_refuses_to_start_over(
    worker: Runner, tmp_path: Path, ck: Path
) -> None:
    """With both checkpoints damaged the worker refuses instead of silently starting fresh."""
    for step in (2, 4):
        (ck / file_name(step)).write_bytes(b"garbage")
    resumed = resume(worker, tmp_path, ck)
    assert resumed.exit_status == 13
    assert kinds(resumed, "failed")[0]["code"] == "checkpoint.none_usable"
    assert len(list((ck / "quarantine").glob("*.reason.json"))) == 2


def test_second_writer_on_a_locked_directory_is_refused_and_writes_nothing(
    worker: Runner, tmp_path: Path, ck: Path
) -> None:
    """While another process holds the writer lock, a worker exits 11 naming the holder."""
    import subprocess
    import sys

    with subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; from pathlib import Path\n"
                "from jobwarden.checkpoint.lock import WriterLock\n"
                f"WriterLock(Path({str(ck)!r})).acquire()\n"
                "print('held', flush=True); time.sleep(60)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "held"
            before = sorted((p.name, p.stat().st_mtime_ns) for p in ck.iterdir())
            refused = resume(worker, tmp_path, ck)
            after = sorted((p.name, p.stat().st_mtime_ns) for p in ck.iterdir())
        finally:
            holder.kill()
    assert refused.exit_status == 11
    failed = kinds(refused, "failed")[0]
    assert failed["code"] == "writer.locked"
    assert failed["holder_pid"] == holder.pid
    assert before == after


@pytest.mark.parametrize(
    ("policy", "fresh", "status"), [("require", True, 12), ("never", False, 12)]
)
def test_resume_policy_refusals(
    worker: Runner, tmp_path: Path, ck: Path, policy: str, fresh: bool, status: int
) -> None:
    """require refuses an empty directory; never refuses one that holds checkpoints."""
    target = tmp_path / "empty" if fresh else ck
    result = worker(job(tmp_path / "p.toml", "corrupt", run={"resume": policy}), target)
    assert result.exit_status == status
    assert kinds(result, "failed")[0]["code"] == "resume.policy"
