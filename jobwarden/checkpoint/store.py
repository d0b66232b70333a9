"""The checkpoint directory: commit, retention, quarantine and selection on restore.

Policy lives here (which checkpoint to use, what to keep), the byte mechanism
in `format` and `atomic`.  Committed files are ``ckpt-<step>.safetensors``;
anything else (a ``.pending`` leftover, a stray file) is never selected.
Damaged files are moved byte-for-byte into ``quarantine/`` with a reason file
beside them; nothing here rewrites or deletes a file it refused.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobwarden import files
from jobwarden.checkpoint import format
from jobwarden.checkpoint.errors import CorruptCheckpoint, NoUsableCheckpoint
from jobwarden.checkpoint.validate import Expected, validate
from jobwarden.hashing import Leaves

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
