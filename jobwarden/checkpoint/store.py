"""The checkpoint directory: commit, retention, quarantine, selection and verdicts.

Policy lives here (which checkpoint to use, what to keep), the byte mechanism
in `format` and `atomic`.  Committed files are ``ckpt-<step>.safetensors``;
anything else (a ``.pending`` leftover, a stray file) is never selected.
Damaged files are moved byte-for-byte into ``quarantine/`` with a reason file
beside them; nothing here rewrites or deletes a file it refused.
`directory_verdicts` lists every file of a directory with its verdict, for
``wardenctl checkpoints``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobwarden import files
from jobwarden.checkpoint import format
from jobwarden.checkpoint.errors import (
    CheckpointError,
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    NoUsableCheckpoint,
)
from jobwarden.checkpoint.lock import read_generation
from jobwarden.checkpoint.validate import (
    Expected,
    check_config,
    check_generation,
    check_step,
    validate,
)
from jobwarden.hashing import Leaves

if TYPE_CHECKING:
    from jobwarden.jobfile import Job

NAME = re.compile(r"ckpt-(\d{10})\.safetensors")
QUARANTINE = "quarantine"


def file_name(step: int) -> str:
    """The committed file name of the checkpoint at ``step``."""
    return f"ckpt-{step:010d}.safetensors"


@dataclass(frozen=True)
class Skipped:
    """A file passed over during selection, and why."""

    file: str
    code: str
    message: str
    quarantined_to: str

    def as_record(self) -> dict[str, str]:
        """JSON-ready form for the ``restored`` event."""
        return {
            "file": self.file,
            "code": self.code,
            "message": self.message,
            "quarantined_to": self.quarantined_to,
        }


@dataclass(frozen=True)
class Selection:
    """The outcome of selecting a checkpoint to restore."""

    checkpoint: format.Checkpoint | None
    checks: tuple[str, ...] = ()
    skipped: tuple[Skipped, ...] = field(default=())


class CheckpointStore:
    """One checkpoint directory, used by the single writer that holds its lock."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def committed(self) -> list[tuple[int, Path]]:
        """Committed checkpoints as (step, path), oldest first."""
        found = []
        for entry in os.scandir(self.directory):
            match = NAME.fullmatch(entry.name)
            if match and entry.is_file(follow_symlinks=False):
                found.append((int(match.group(1)), Path(entry.path)))
        return sorted(found)

    def pending(self) -> list[Path]:
        """Leftover pending files of commits that never finished."""
        return sorted(
            Path(e.path)
            for e in os.scandir(self.directory)
            if e.name.endswith(files.PENDING_SUFFIX)
        )

    def commit(
        self,
        step: int,
        manifest: format.Manifest,
        leaves: Leaves,
        before_replace: Callable[[Path], None] | None = None,
    ) -> tuple[Path, int]:
        """Durably commit the state at ``step``; returns its path and size."""
        final = self.directory / file_name(step)
        written = files.commit(final, format.encode(manifest, leaves), before_replace)
        return final, written

    def retain(self, keep: int) -> list[Path]:
        """Delete committed checkpoints beyond the newest ``keep``; returns those removed."""
        removed = [path for _, path in self.committed()[:-keep]] if keep > 0 else []
        for path in removed:
            path.unlink()
        if removed:
            files.fsync_dir(self.directory)
        return removed

    def quarantine(self, path: Path, reason: dict[str, Any]) -> Path:
        """Move ``path`` unchanged into ``quarantine/`` and write a reason file beside it."""
        folder = self.directory / QUARANTINE
        folder.mkdir(exist_ok=True)
        target = folder / path.name
        suffix = 1
        while target.exists():
            target = folder / f"{path.name}.{suffix}"
            suffix += 1
        os.rename(path, target)
        record = {"original": str(path), "quarantined": time.time(), **reason}
        files.write_text_atomic(
            target.with_name(target.name + ".reason.json"),
            json.dumps(record, indent=2, default=str) + "\n",
        )
        files.fsync_dir(self.directory)
        return target

    def select(self, expected: Expected) -> Selection:
        """Find the newest accepted compatible checkpoint.

        Pending leftovers and damaged files are quarantined and passed over;
        an incompatible file raises its `IncompatibleCheckpoint` at once, with
        no fallback.  Raises `NoUsableCheckpoint` when files existed but none
        survived, and returns an empty `Selection` for an empty directory.
        """
        skipped: list[Skipped] = []
        for path in self.pending():
            reason = {
                "code": "checkpoint.pending",
                "message": "pending file of a commit that never finished; never selected",
            }
            target = self.quarantine(path, reason)
            skipped.append(Skipped(path.name, reason["code"], reason["message"], str(target)))
        for step, path in reversed(self.committed()):
            try:
                checkpoint = format.read(path)
            except CorruptCheckpoint as error:
                target = self.quarantine(path, error.as_record())
                skipped.append(Skipped(path.name, error.code, error.message, str(target)))
                continue
            checks = validate(checkpoint, expected, step)
            return Selection(checkpoint, checks, tuple(skipped))
        if any(s.code != "checkpoint.pending" for s in skipped):
            raise NoUsableCheckpoint(
                str(self.directory),
                "every committed checkpoint was damaged "
                "and quarantined; refusing to start over silently",
                skipped=[s.as_record() for s in skipped],
            )
        return Selection(None, (), tuple(skipped))


def directory_verdicts(directory: Path, job: Job) -> list[dict[str, Any]]:
    """Every checkpoint file of a directory (committed, pending, quarantined) with its verdict.

    The container (readable, length, checksum) is fully checked; of the
    provenance, what can be told without starting JAX (task, training fields,
    step, writer generation), by the checks a restore runs.  The data, source
    and runtime identity are checked by the worker when it restores.
    """
    if not directory.is_dir():
        return []
    generation = read_generation(directory)
    paths = [
        p
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name.endswith((".safetensors", files.PENDING_SUFFIX))
    ]
    quarantine = directory / QUARANTINE
    if quarantine.is_dir():
        paths += [p for p in sorted(quarantine.iterdir()) if not p.name.endswith(".json")]
    rows = []
    for path in paths:
        place = (
            "quarantined"
            if path.parent == quarantine
            else "pending"
            if path.name.endswith(files.PENDING_SUFFIX)
            else "committed"
        )
        rows.append(_verdict_row(path, place, job, generation))
    return rows


def _verdict_row(path: Path, place: str, job: Job, generation: int) -> dict[str, Any]:
    """One file's row: its identity from the header, and the verdict on it."""
    manifest: format.Manifest | None = None
    size: int | None = None
    try:
        checkpoint = format.read(path)
    except CheckpointError as error:
        verdict: dict[str, Any] = {"ok": False, **error.as_record()}
        with contextlib.suppress(CheckpointError):  # described from its header if it has one
            manifest, _, size = format.read_manifest(path)
    else:
        manifest, size = checkpoint.manifest, checkpoint.size
        problems = _provenance_refusals(path, manifest, job, generation)
        if place != "committed":
            problems.append(f"{place}: never selected")
        verdict = {
            "ok": not problems,
            "message": "; ".join(problems)
            or "accepted as far as can be told "
            "without JAX (data, source and runtime are checked on restore)",
        }
    return {
        "file": str(path),
        "verdict": verdict,
        "step": manifest.step if manifest else None,
        "bytes": size,
        "state_hash": manifest.state_hash if manifest else None,
        "created": manifest.created if manifest else None,
        "train": dict(manifest.train) if manifest else None,
        "task": manifest.task if manifest else None,
        "where": place,
        "writer_generation": manifest.provenance.writer_generation if manifest else None,
    }


def _provenance_refusals(
    path: Path, manifest: format.Manifest, job: Job, generation: int
) -> list[str]:
    """The restore checks that need no JAX (task, training fields, step, generation) that fail."""
    where = str(path)
    named = NAME.fullmatch(path.name)
    found = [
        _refusal(check_config, where, manifest, job.task, job.train_fields()),
        _refusal(
            check_step, where, manifest.step, job.run.steps, int(named.group(1)) if named else None
        ),
        _refusal(check_generation, where, manifest.provenance.writer_generation, generation),
    ]
    return [text for text in found if text is not None]


def _refusal(check: Callable[..., None], *args: Any) -> str | None:
    """``code: detail`` of the `IncompatibleCheckpoint` that ``check(*args)`` raises, if any."""
    try:
        check(*args)
    except IncompatibleCheckpoint as error:
        return f"{error.code}: {error.detail}"
    return None
