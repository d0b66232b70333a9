"""Shared helpers for tests that drive real worker processes."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from jobwarden.checkpoint import atomic, format
from jobwarden.control.rehearsal import AttemptResult, run_worker
from jobwarden.hashing import state_hash

__all__ = ["AttemptResult", "job", "kinds", "rewrite_checkpoint", "run_worker", "toml_value"]


def toml_value(value: Any) -> str:
    """A Python value as TOML."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def job(path: Path, job_id: str = "job", task: str = "linreg", **sections: dict[str, Any]) -> Path:
    """Write a job file with the given sections (train, run, faults) and return its path."""
    lines = [f'id = "{job_id}"', f'task = "{task}"']
    for name, fields in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in fields.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def kinds(result: AttemptResult, kind: str) -> list[dict[str, Any]]:
    """The fields of every event of ``kind`` in an attempt."""
    return [dict(e.fields) for e in result.events() if e.kind == kind]


def rewrite_checkpoint(path: Path, change: dict[str, np.ndarray]) -> None:
    """Replace leaves of a checkpoint and write it back as a fully valid file.

    Stands for a tool that writes a sound checkpoint of a different state (a
    weights-only restore, a reseeded key): checksum and state hash are recomputed.
    """
    checkpoint = format.read(path)
    arrays = {p: np.array(a) for p, a in checkpoint.arrays.items()}
    arrays.update(change)
    leaves = [(leaf.path, arrays[leaf.path]) for leaf in checkpoint.manifest.leaves]
    digest, components = state_hash(leaves, checkpoint.manifest.step)
    manifest = dataclasses.replace(
        checkpoint.manifest, state_hash=digest, components=components, created=time.time()
    )
    atomic.commit(path, format.encode(manifest, leaves))
