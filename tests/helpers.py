"""Shared helpers for tests that drive real worker processes."""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from jobwarden import files
from jobwarden.checkpoint import format
from jobwarden.control.harness import job_text, toml_value
from jobwarden.events import Event, read_events
from jobwarden.hashing import state_hash
from jobwarden.worker.command import worker_argv

__all__ = [
    "AttemptResult",
    "job",
    "kinds",
    "rewrite_checkpoint",
    "run_worker",
    "toml_value",
    "wait_until",
]

T = TypeVar("T")


@dataclass(frozen=True)
class AttemptResult:
    """One worker process run to its end, with its evidence folder."""

    folder: Path
    exit_status: int

    def events(self) -> list[Event]:
        """The attempt's valid events."""
        return [e for e in read_events(self.folder / "events.jsonl") if isinstance(e, Event)]


def wait_until(
    observe: Callable[[], T],
    done: Callable[[T], object] = bool,
    *,
    timeout: float,
    what: str,
    interval: float = 0.02,
    retry: tuple[type[Exception], ...] = (),
) -> T:
    """Poll ``observe`` until ``done`` holds for what it returned, and return that value.

    An exception of a type in ``retry`` counts as "not yet".  Raises TimeoutError
    naming ``what`` and the last value (or exception) observed once ``timeout`` s pass.
    """
    deadline = time.monotonic() + timeout
    last: object = "nothing"
    while True:
        try:
            value = observe()
        except retry as error:
            last = error
        else:
            if done(value):
                return value
            last = value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not within {timeout} s; last observed {last!r:.2000}")
        time.sleep(interval)


def run_worker(
    job: Path, checkpoint_dir: Path, folder: Path, cache: Path | None = None, timeout: float = 300
) -> AttemptResult:
    """Run ``python -m jobwarden.worker`` to completion, keeping its events and stderr."""
    folder.mkdir(parents=True, exist_ok=True)
    argv = worker_argv(job, checkpoint_dir, cache)
    with (folder / "events.jsonl").open("wb") as out, (folder / "stderr.log").open("wb") as err:
        status = subprocess.run(
            argv, stdout=out, stderr=err, timeout=timeout, check=False
        ).returncode
    return AttemptResult(folder, status)


def job(path: Path, job_id: str = "job", task: str = "linreg", **sections: dict[str, Any]) -> Path:
    """Write a job file with the given sections (train, run, faults) and return its path."""
    path.write_text(job_text(job_id, task=task, **sections))
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
    files.commit(path, format.encode(manifest, leaves))
