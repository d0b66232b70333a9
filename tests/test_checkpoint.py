"""The checkpoint container, atomic commit, store policy, validation and writer lock."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from jobwarden import files
from jobwarden.checkpoint import format
from jobwarden.checkpoint.errors import (
    ChecksumMismatch,
    ConfigMismatch,
    CorruptCheckpoint,
    DataMismatch,
    DtypeMismatch,
    GenerationFenced,
    NonFiniteState,
    RuntimeMismatch,
    SchemaMismatch,
    ShapeMismatch,
    SourceMismatch,
    StepOutOfRange,
    TreeMismatch,
    TruncatedCheckpoint,
    UnreadableCheckpoint,
)
from jobwarden.checkpoint.lock import WriterLock, read_generation
from jobwarden.checkpoint.store import CheckpointStore, file_name
from jobwarden.checkpoint.validate import Expected, validate
from jobwarden.errors import WriterLockedError
from jobwarden.hashing import Leaves, state_hash

TRAIN = {"seed": 3, "learning_rate": 0.04}
RUNTIME = {"jax": "0.10.2", "backend": "cpu"}


def sample_leaves(scale: float = 1.0) -> Leaves:
    """A small nested state with several dtypes."""
    return [
        ("key", np.array([0, 3], np.uint32)),
        ("opt_state/0/count", np.array(7, np.int32)),
        ("opt_state/0/mu", np.arange(6, dtype=np.float32).reshape(2, 3) * scale),
        ("params/w", np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2) * scale),
        ("params/half", np.ones(3, ml_dtypes.bfloat16)),
    ]


def manifest_for(leaves: Leaves, step: int = 4, generation: int = 1) -> format.Manifest:
    """A manifest describing ``leaves``."""
    digest, components = state_hash(leaves, step)
    return format.Manifest(
        task="t",
        job_id="j",
        step=step,
        key_impl="threefry2x32",
        leaves=format.leaf_specs(leaves),
        train=TRAIN,
        provenance=format.Provenance("cfg", "data", "src", RUNTIME, generation),
        state_hash=digest,
        components=components,
        created=time.time(),
    )


def expected_for(leaves: Leaves, **changes: object) -> Expected:
    """What a restoring attempt with the same experiment would expect."""
    base = Expected(
        task="t",
        train=TRAIN,
        config_hash="cfg",
        data_hash="data",
        source_hash="src",
        runtime=RUNTIME,
        leaves=format.leaf_specs(leaves),
        max_step=8,
        generation=1,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def write(path: Path, leaves: Leaves, step: int = 4, generation: int = 1) -> Path:
    """Commit ``leaves`` as a checkpoint file at ``path``."""
    files.commit(path, format.encode(manifest_for(leaves, step, generation), leaves))
    return path


def test_round_trip_is_bit_exact_and_readable_by_the_safetensors_library(tmp_path: Path) -> None:
    """Our file reads back bit for bit, and the reference safetensors reader agrees."""
    leaves = sample_leaves()
    path = write(tmp_path / file_name(4), leaves)
    checkpoint = format.read(path)
    assert [p for p, _ in checkpoint.leaves()] == [p for p, _ in leaves]
    for (_, ours), (_, saved) in zip(leaves, checkpoint.leaves(), strict=True):
        assert ours.dtype == saved.dtype
        assert ours.shape == saved.shape
        assert ours.tobytes() == saved.tobytes()
    other = load_file(str(path))
    assert sorted(other) == sorted(p for p, _ in leaves)
    assert all(other[p].tobytes() == a.tobytes() for p, a in leaves)
    assert checkpoint.manifest.step == 4
    assert checkpoint.manifest.state_hash == state_hash(leaves, 4)[0]


def test_every_truncation_is_refused_as_damage(tmp_path: Path) -> None:
    """Cutting the file at any length is refused as truncated or unreadable, never accepted."""
    data = write(tmp_path / "full", sample_leaves()).read_bytes()
    cut = tmp_path / "cut"
    for length in range(len(data)):
        cut.write_bytes(data[:length])
        with pytest.raises(CorruptCheckpoint) as caught:
            format.read(cut)
        assert isinstance(caught.value, TruncatedCheckpoint | UnreadableCheckpoint), length


def test_every_single_byte_change_in_the_data_is_a_checksum_mismatch(tmp_path: Path) -> None:
    """Flipping any one data byte is caught by the checksum."""
    path = write(tmp_path / "f", sample_leaves())
    data = bytearray(path.read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    for at in range(header, len(data)):
        changed = bytearray(data)
        changed[at] ^= 0x01
        path.write_bytes(bytes(changed))
        with pytest.raises(ChecksumMismatch):
            format.read(path)


def test_a_changed_manifest_is_caught(tmp_path: Path) -> None:
    """Editing the step inside the manifest without the checksum is a checksum mismatch."""
    path = write(tmp_path / "f", sample_leaves())
    data = path.read_bytes()
    path.write_bytes(data.replace(b'\\"step\\":4', b'\\"step\\":6'))
    assert path.read_bytes() != data
    with pytest.raises(ChecksumMismatch):
        format.read(path)


def test_trailing_bytes_and_garbage_are_unreadable(tmp_path: Path) -> None:
    """Bytes after the data, or a file that is not a checkpoint at all, are refused."""
    path = write(tmp_path / "f", sample_leaves())
    path.write_bytes(path.read_bytes() + b"x")
    with pytest.raises(UnreadableCheckpoint):
        format.read(path)
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    with pytest.raises(UnreadableCheckpoint):
        format.read(path)


def test_other_schema_versions_are_incompatible(tmp_path: Path) -> None:
    """A manifest of schema 2 is an incompatible checkpoint naming both versions."""
    leaves = sample_leaves()
    manifest = dataclasses.replace(manifest_for(leaves), schema_version=2)
    path = tmp_path / "f"
    files.commit(path, format.encode(manifest, leaves))
    with pytest.raises(SchemaMismatch) as caught:
        format.read(path)
    assert (caught.value.saved, caught.value.requested) == (2, 1)


def test_commit_interrupted_before_replace_keeps_the_old_file(tmp_path: Path) -> None:
    """A failure after the pending file is durable leaves the previous commit in place."""
    path = write(tmp_path / file_name(4), sample_leaves())
    old = path.read_bytes()

    def die(pending: Path) -> None:
        assert pending.read_bytes() != old
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        files.commit(path, format.encode(manifest_for(sample_leaves(2.0)), sample_leaves(2.0)), die)
    assert path.read_bytes() == old
    assert files.pending_path(path).exists()


def test_selection_quarantines_damage_and_falls_back(tmp_path: Path) -> None:
    """The newest damaged file is moved aside unchanged; the older valid one is selected."""
    leaves = sample_leaves()
    write(tmp_path / file_name(2), leaves, step=2)
    newest = write(tmp_path / file_name(4), leaves, step=4)
    newest.write_bytes(newest.read_bytes()[:-1])
    damaged = newest.read_bytes()
    selection = CheckpointStore(tmp_path).select(expected_for(leaves))
    assert selection.checkpoint is not None
    assert selection.checkpoint.manifest.step == 2
    assert [(s.file, s.code) for s in selection.skipped] == [(file_name(4), "checkpoint.truncated")]
    assert (tmp_path / "quarantine" / file_name(4)).read_bytes() == damaged
    reason = json.loads((tmp_path / "quarantine" / f"{file_name(4)}.reason.json").read_text())
    assert reason["code"] == "checkpoint.truncated"
    assert reason["original"].endswith(file_name(4))


def test_incompatible_newest_is_not_skipped(tmp_path: Path) -> None:
    """An incompatible newest checkpoint raises at once even when an older one would pass."""
    leaves = sample_leaves()
    write(tmp_path / file_name(2), leaves, step=2)
    write(tmp_path / file_name(4), leaves, step=4)
    with pytest.raises(ConfigMismatch) as caught:
        CheckpointStore(tmp_path).select(expected_for(leaves, train={**TRAIN, "seed": 4}))
    assert caught.value.path.endswith(file_name(4))
    assert caught.value.evidence["fields"] == {"seed": [3, 4]}
    assert not (tmp_path / "quarantine").exists()


@pytest.mark.parametrize(
    ("changes", "error", "field"),
    [
        ({"source_hash": "other"}, SourceMismatch, "source_hash"),
        ({"data_hash": "other"}, DataMismatch, "data_hash"),
        ({"config_hash": "other"}, ConfigMismatch, "config_hash"),
        ({"runtime": {**RUNTIME, "jax": "0.11.0"}}, RuntimeMismatch, "jax"),
        ({"generation": 0}, GenerationFenced, "writer_generation"),
        ({"max_step": 3}, StepOutOfRange, "step"),
    ],
)
def test_each_incompatibility_has_its_own_error_naming_both_values(
    tmp_path: Path, changes: dict[str, object], error: type[Exception], field: str
) -> None:
    """Source, data, config, runtime, fencing and step range are distinct refusals."""
    leaves = sample_leaves()
    checkpoint = format.read(write(tmp_path / file_name(4), leaves))
    with pytest.raises(error) as caught:
        validate(checkpoint, expected_for(leaves, **changes), 4)
    assert caught.value.field == field  # type: ignore[attr-defined]
    assert "saved" in caught.value.evidence
    assert "requested" in caught.value.evidence


def test_tree_shape_and_dtype_changes_are_distinct_refusals(tmp_path: Path) -> None:
    """A missing leaf, a reshaped leaf and a retyped leaf each name the leaf."""
    leaves = sample_leaves()
    checkpoint = format.read(write(tmp_path / file_name(4), leaves))
    with pytest.raises(TreeMismatch, match="missing"):
        validate(checkpoint, expected_for([*leaves, ("extra", np.zeros(1, np.float32))]), 4)
    reshaped = [(p, a.reshape(-1) if p == "params/w" else a) for p, a in leaves]
    with pytest.raises(ShapeMismatch, match="params/w"):
        validate(checkpoint, expected_for(reshaped), 4)
    retyped = [(p, a.astype(np.float64) if p == "params/w" else a) for p, a in leaves]
    with pytest.raises(DtypeMismatch, match="params/w"):
        validate(checkpoint, expected_for(retyped), 4)
    with pytest.raises(StepOutOfRange, match="file name"):
        validate(checkpoint, expected_for(leaves), 6)


def test_non_finite_values_are_refused(tmp_path: Path) -> None:
    """A NaN in a float leaf is refused naming the leaf."""
    leaves = [(p, a.copy()) for p, a in sample_leaves()]
    leaves[2][1][0, 1] = np.nan
    checkpoint = format.read(write(tmp_path / file_name(4), leaves))
    with pytest.raises(NonFiniteState, match="opt_state/0/mu"):
        validate(checkpoint, expected_for(leaves), 4)


def test_retention_keeps_the_newest(tmp_path: Path) -> None:
    """retain(2) deletes only the older committed files."""
    for step in (2, 4, 6):
        write(tmp_path / file_name(step), sample_leaves(), step=step)
    store = CheckpointStore(tmp_path)
    removed = store.retain(2)
    assert [p.name for p in removed] == [file_name(2)]
    assert [s for s, _ in store.committed()] == [4, 6]


def test_writer_lock_is_exclusive_across_processes_and_counts_generations(tmp_path: Path) -> None:
    """A second process is refused naming the holder; each acquisition bumps the generation."""
    with WriterLock(tmp_path) as lock:
        assert lock.generation == 1
        refused = subprocess.run(
            [
                sys.executable,
                "-c",
                (
                    "from pathlib import Path\nfrom jobwarden.checkpoint.lock import WriterLock\n"
                    "from jobwarden.errors import WriterLockedError\n"
                    f"try:\n    WriterLock(Path({str(tmp_path)!r})).acquire()\n"
                    "except WriterLockedError as e:\n    print(e.evidence['holder_pid'])\n"
                ),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        assert refused.stdout.strip() == str(__import__("os").getpid())
    with WriterLock(tmp_path) as again:
        assert again.generation == 2
    assert read_generation(tmp_path) == 2


def test_writer_lock_refuses_in_process_too(tmp_path: Path) -> None:
    """flock locks are per open file: a second acquisition in one process is refused too."""
    with WriterLock(tmp_path), pytest.raises(WriterLockedError):
        WriterLock(tmp_path).acquire()
