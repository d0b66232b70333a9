"""What the sections read back from a root: final checkpoints against the reference
runs, incident and event records, pending files and rejections."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jobwarden.checkpoint import format as ckformat
from jobwarden.control.harness import job_text
from jobwarden.worker.command import worker_argv

from .common import CKPT_NAME, SETTLED_STATES, Record


@dataclass(frozen=True)
class Final:
    """The newest committed checkpoint of a directory, read and verified."""

    step: int
    state_hash: str
    arrays: dict[str, np.ndarray]

    def equals(self, other: Final) -> bool:
        """Same step and bit-equal leaves (names, dtypes, shapes, bytes)."""
        return (
            self.step == other.step
            and self.arrays.keys() == other.arrays.keys()
            and all(
                a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
                for a, b in ((self.arrays[k], other.arrays[k]) for k in self.arrays)
            )
        )


def final_of(directory: Path) -> Final | None:
    """The newest committed checkpoint in ``directory``, or None."""
    steps = []
    with contextlib.suppress(FileNotFoundError):
        steps = sorted(
            (int(m.group(1)), directory / name)
            for name in os.listdir(directory)
            if (m := CKPT_NAME.fullmatch(name))
        )
    if not steps:
        return None
    checkpoint = ckformat.read(steps[-1][1])
    return Final(
        checkpoint.manifest.step,
        checkpoint.manifest.state_hash,
        {k: np.array(v) for k, v in checkpoint.arrays.items()},
    )


class References:
    """Uninterrupted runs of a linreg job (no faults), by (seed, steps), run once each."""

    def __init__(self, base: Path, cache: Path) -> None:
        self.base = base
        self.cache = cache
        self.finals: dict[tuple[int, int], Final] = {}
        self.lock = threading.Lock()

    def get(self, seed: int, steps: int) -> Final:
        """The final checkpoint of the uninterrupted run."""
        with self.lock:
            if (seed, steps) not in self.finals:
                folder = self.base / f"reference-{seed}-{steps}"
                folder.mkdir(parents=True, exist_ok=True)
                spec = folder / "job.toml"
                spec.write_text(job_text("reference", train={"seed": seed}, run={"steps": steps}))
                argv = worker_argv(spec, folder / "checkpoints", self.cache)
                with (folder / "events.jsonl").open("wb") as out:
                    subprocess.run(
                        argv, stdout=out, stderr=subprocess.DEVNULL, check=True, timeout=600
                    )
                final = final_of(folder / "checkpoints")
                if final is None or final.step != steps:
                    raise RuntimeError(f"reference run in {folder} did not reach step {steps}")
                self.finals[seed, steps] = final
            return self.finals[seed, steps]


def read_json(path: Path) -> Any:
    """A JSON file, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def event_kinds(path: Path) -> list[str]:
    """The event kinds of an events.jsonl (malformed lines skipped)."""
    kinds = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_bytes().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    kinds.append(str(record.get("event")))
    return kinds


def incident_records(root: Path, job: str) -> list[Record]:
    """The latest record of each of the job's incidents, read from disk."""
    folder = root / "jobs" / job / "incidents"
    found = []
    with contextlib.suppress(FileNotFoundError):
        for path in sorted(folder.glob("*.json")):
            record = read_json(path)
            if isinstance(record, dict):
                found.append(record)
    return found


def open_incidents(root: Path, jobs: list[str]) -> list[str]:
    """Incidents still open although their job has settled."""
    found = []
    for job in jobs:
        state = (read_json(root / "jobs" / job / "state.json") or {}).get("state")
        if state in SETTLED_STATES:
            found += [
                str(i.get("id")) for i in incident_records(root, job) if i.get("status") == "open"
            ]
    return found


def pending_inodes(directory: Path) -> set[tuple[str, int]]:
    """(name, inode) of each pending checkpoint file in ``directory``."""
    found = set()
    for name in pending_files(directory):
        if CKPT_NAME.match(name):
            with contextlib.suppress(FileNotFoundError):
                found.add((name, os.lstat(directory / name).st_ino))
    return found


def pending_files(directory: Path) -> list[str]:
    """Names ending in ``.pending`` directly in ``directory``."""
    try:
        return [name for name in os.listdir(directory) if name.endswith(".pending")]
    except (FileNotFoundError, NotADirectoryError):
        return []


def rejections(root: Path) -> dict[str, list[Record]]:
    """Error files in spool/rejected by the name each request was submitted as."""
    found: dict[str, list[Record]] = {}
    for path in (root / "spool" / "rejected").glob("*.error.json"):
        record = read_json(path)
        if isinstance(record, dict):
            record["kept"] = (path.parent / record.get("file", "")).is_file()
            found.setdefault(str(record.get("submitted_as")), []).append(record)
    return found
