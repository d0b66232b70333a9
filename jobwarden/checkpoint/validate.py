"""Compatibility checks on restore: each refusal names the field and both values.

Run after `format` has proven the file undamaged.  The order follows what
an operator needs to hear first: the code and experiment identity, then the
runtime, then the structure and values of the state.  `check_manifest` needs
only the header, so a restore can refuse another experiment's tree before it
allocates anything for the data; `validate` adds the values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from jobwarden.checkpoint.errors import (
    ConfigMismatch,
    DataMismatch,
    DtypeMismatch,
    GenerationFenced,
    NonFiniteState,
    RuntimeMismatch,
    ShapeMismatch,
    SourceMismatch,
    StepOutOfRange,
    TreeMismatch,
)
from jobwarden.checkpoint.format import Checkpoint
from jobwarden.checkpoint.manifest import LeafSpec, Manifest


@dataclass(frozen=True)
class Expected:
    """What the restoring attempt requires of a checkpoint."""

    task: str
    train: Mapping[str, Any]
    config_hash: str
    data_hash: str
    source_hash: str
    runtime: Mapping[str, str]
    leaves: tuple[LeafSpec, ...]
    max_step: int
    generation: int


# The checks after the container's own (readable, checksum, signature, schema).
COMPATIBILITY_CHECKS = (
    "source",
    "config",
    "data",
    "runtime",
    "generation",
    "tree",
    "shape",
    "dtype",
    "step_range",
    "finite",
)


def differing(saved: Mapping[str, Any], requested: Mapping[str, Any]) -> dict[str, list[Any]]:
    """Every key whose value differs, mapped to [saved, requested]."""
    return {
        key: [saved.get(key), requested.get(key)]
        for key in sorted(set(saved) | set(requested))
        if saved.get(key) != requested.get(key)
    }


def check_config(path: str, manifest: Manifest, task: str, train: Mapping[str, Any]) -> None:
    """Raise `ConfigMismatch` naming the task and every training field that differs."""
    fields = differing({"task": manifest.task, **manifest.train}, {"task": task, **train})
    if fields:
        listing = ", ".join(f"{k} (saved {v[0]!r}, requested {v[1]!r})" for k, v in fields.items())
        raise ConfigMismatch(
            path,
            ",".join(fields),
            {k: v[0] for k, v in fields.items()},
            {k: v[1] for k, v in fields.items()},
            message=f"training config differs: {listing}",
            fields=fields,
        )


def check_generation(path: str, written_by: int, generation: int) -> None:
    """Raise `GenerationFenced` when ``written_by`` is newer than the directory's ``generation``."""
    if written_by > generation:
        raise GenerationFenced(
            path,
            "writer_generation",
            written_by,
            generation,
            message=(
                f"written by writer generation {written_by}, newer "
                f"than the directory's {generation}"
            ),
        )


def check_step(path: str, step: int, max_step: int, step_from_name: int | None = None) -> None:
    """Raise `StepOutOfRange` when ``step`` disagrees with its file name or is outside 0..max_step.

    ``step_from_name`` is None for a file whose name carries no step.
    """
    if step_from_name is not None and step != step_from_name:
        raise StepOutOfRange(
            path,
            "step",
            step,
            step_from_name,
            message=f"manifest step {step} disagrees with the file name's step {step_from_name}",
        )
    if not 0 <= step <= max_step:
        raise StepOutOfRange(
            path,
            "step",
            step,
            max_step,
            message=f"saved step {step} is outside 0..{max_step} (the requested steps)",
        )


def validate(checkpoint: Checkpoint, expected: Expected, step_from_name: int) -> tuple[str, ...]:
    """Raise the first `IncompatibleCheckpoint` that applies; return the checks passed."""
    path = str(checkpoint.path)
    check_manifest(path, checkpoint.manifest, expected, step_from_name)
    check_finite(path, checkpoint)
    return (*checkpoint.checks, *COMPATIBILITY_CHECKS)


def check_manifest(path: str, manifest: Manifest, expected: Expected, step_from_name: int) -> None:
    """Raise the first `IncompatibleCheckpoint` the header alone shows, in `validate` order."""
    prov = manifest.provenance
    if prov.source_hash != expected.source_hash:
        raise SourceMismatch(path, "source_hash", prov.source_hash, expected.source_hash)
    check_config(path, manifest, expected.task, expected.train)
    if prov.config_hash != expected.config_hash:
        raise ConfigMismatch(path, "config_hash", prov.config_hash, expected.config_hash)
    if prov.data_hash != expected.data_hash:
        raise DataMismatch(path, "data_hash", prov.data_hash, expected.data_hash)
    runtime = differing(prov.runtime, expected.runtime)
    if runtime:
        listing = ", ".join(f"{k} (saved {v[0]!r}, running {v[1]!r})" for k, v in runtime.items())
        if "nproc" in runtime and runtime["nproc"][0] is None:
            listing += (
                "; written before XLA's CPU pool was pinned: resume it with NPROC set empty "
                "on the machine that wrote it"
            )
        raise RuntimeMismatch(
            path,
            ",".join(runtime),
            {k: v[0] for k, v in runtime.items()},
            {k: v[1] for k, v in runtime.items()},
            message=f"runtime differs: {listing}",
            fields=runtime,
        )
    check_generation(path, prov.writer_generation, expected.generation)
    saved_paths = [leaf.path for leaf in manifest.leaves]
    wanted_paths = [leaf.path for leaf in expected.leaves]
    if saved_paths != wanted_paths:
        missing = sorted(set(wanted_paths) - set(saved_paths))
        extra = sorted(set(saved_paths) - set(wanted_paths))
        raise TreeMismatch(
            path,
            "leaves",
            saved_paths,
            wanted_paths,
            message=(
                f"state tree differs: missing {missing}, unexpected {extra}"
                + ("" if missing or extra else ", same leaves in another order")
            ),
        )
    for saved, wanted in zip(manifest.leaves, expected.leaves, strict=True):
        if saved.shape != wanted.shape:
            raise ShapeMismatch(
                path,
                saved.path,
                list(saved.shape),
                list(wanted.shape),
                message=f"{saved.path} shape differs: saved {list(saved.shape)}, "
                f"requested {list(wanted.shape)}",
            )
    for saved, wanted in zip(manifest.leaves, expected.leaves, strict=True):
        if saved.dtype != wanted.dtype:
            raise DtypeMismatch(
                path,
                saved.path,
                saved.dtype,
                wanted.dtype,
                message=f"{saved.path} dtype differs: saved {saved.dtype}, "
                f"requested {wanted.dtype}",
            )
    check_step(path, manifest.step, expected.max_step, step_from_name)


def check_finite(path: str, checkpoint: Checkpoint) -> None:
    """Raise `NonFiniteState` naming the first floating-point leaf that holds NaN or infinity."""
    for leaf_path, array in checkpoint.leaves():
        if np.issubdtype(array.dtype, np.inexact) or array.dtype.name == "bfloat16":
            finite = np.isfinite(
                array.astype(np.float32) if array.dtype.name == "bfloat16" else array
            )
            if not bool(finite.all()):
                bad = int(np.size(finite) - np.count_nonzero(finite))
                raise NonFiniteState(
                    path,
                    leaf_path,
                    f"{bad} non-finite value(s)",
                    "all finite",
                    message=f"{leaf_path} holds {bad} non-finite value(s)",
                )
