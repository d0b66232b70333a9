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
import errno
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobwarden import files
from jobwarden.checkpoint import format, onepass
from jobwarden.checkpoint.errors import (
    CheckpointDiskFull,
    CheckpointError,
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    NoUsableCheckpoint,
    RuntimeMismatch,
)
from jobwarden.checkpoint.lock import WriterLock, open_directory, read_generation
from jobwarden.checkpoint.shardrecord import RECORD, SHARD, CommitRecord, describe
from jobwarden.checkpoint.validate import (
    Expected,
    check_config,
    check_generation,
    check_manifest,
    check_step,
    validate,
)
from jobwarden.errors import WriterLockedError
from jobwarden.files import Directory
from jobwarden.hashing import Leaves

if TYPE_CHECKING:
    from jobwarden.jobfile import Job

NAME = re.compile(r"ckpt-(\d{10})\.safetensors")
QUARANTINE = "quarantine"
REASON_SUFFIX = ".reason.json"
# What a quarantined file's reason file may be called, finished or still pending.
REASON_NAMES = (REASON_SUFFIX, REASON_SUFFIX + files.PENDING_SUFFIX)


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
    """One checkpoint directory, used by the single writer that holds its lock.

    With ``lock`` every operation goes through the directory the lock holds
    and every commit first checks the lock (`WriterLock.check`); without one
    (tests, tools) each operation opens the directory afresh, held to the same
    rules.  With ``signing_key`` commits are signed and restores require a
    valid signature.
    """

    def __init__(
        self, directory: Path, lock: WriterLock | None = None, signing_key: bytes | None = None
    ) -> None:
        self.directory = directory
        self.lock = lock
        self.signing_key = signing_key

    @contextlib.contextmanager
    def _opened(self) -> Iterator[Directory]:
        if self.lock is not None and self.lock.handle is not None:
            yield self.lock.handle
            return
        with open_directory(self.directory) as handle:
            yield handle

    def _names(self) -> list[os.DirEntry[str]]:
        if self.lock is not None and self.lock.handle is not None:
            return self.lock.handle.entries()
        with os.scandir(self.directory) as scan:  # a read-only listing (the daemon's)
            return list(scan)

    def committed(self) -> list[tuple[int, Path]]:
        """Committed checkpoints as (step, path), oldest first; links are never listed."""
        found = []
        for entry in self._names():
            match = NAME.fullmatch(entry.name)
            if match and entry.is_file(follow_symlinks=False):
                found.append((int(match.group(1)), self.directory / entry.name))
        return sorted(found)

    def pending(self) -> list[Path]:
        """Leftover pending files of commits that never finished."""
        return sorted(
            self.directory / e.name for e in self._names() if e.name.endswith(files.PENDING_SUFFIX)
        )

    def commit(
        self,
        step: int,
        manifest: format.Manifest,
        leaves: Leaves,
        before_replace: Callable[[Path], None] | None = None,
    ) -> tuple[Path, int]:
        """Durably commit the state at ``step``; returns its path and size.

        The writer's lock is checked before the write and again before the
        rename; a writer that lost it leaves nothing behind and raises.
        """
        name = file_name(step)

        def hook(pending: Path) -> None:
            if before_replace is not None:
                before_replace(pending)
            self._check_writer()  # the last thing before the rename

        def write(fd: int) -> int:  # one pass over the bytes, checksummed as written
            return onepass.write(fd, manifest, leaves, self.signing_key)[0]

        with self._opened() as handle:
            self._check_writer()
            try:
                written = handle.commit(name, write, hook)
            except WriterLockedError:
                handle.unlink(name + files.PENDING_SUFFIX, missing_ok=True)
                raise
            except OSError as error:
                if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                signed = self.signing_key is not None
                data = sum(leaf.nbytes for leaf in manifest.leaves)
                wanted = onepass.header_size(manifest, signed) + data
                raise CheckpointDiskFull(str(self.directory), step, wanted, error) from error
        return self.directory / name, written

    def _check_writer(self) -> None:
        if self.lock is not None:
            self.lock.check()

    def retain(self, keep: int) -> list[Path]:
        """Delete committed checkpoints beyond the newest ``keep``; returns those removed."""
        removed = [path for _, path in self.committed()[:-keep]] if keep > 0 else []
        if removed:
            with self._opened() as handle:
                for path in removed:
                    handle.unlink(path.name)
                handle.fsync()
        return removed

    def quarantine(self, path: Path, reason: dict[str, Any]) -> Path:
        """Move ``path`` unchanged into ``quarantine/`` and write a reason file beside it.

        ``quarantine/`` must be a real directory of ours; nothing in it is ever
        replaced: the target takes a numbered name when its own is taken.
        """
        with self._opened() as handle, handle.child(QUARANTINE, create=True) as folder:
            target, suffix = path.name, 1
            while any(folder.lexists(target + extra) for extra in ("", *REASON_NAMES)):
                target, suffix = f"{path.name}.{suffix}", suffix + 1
            handle.move_to(path.name, folder, target)
            record = {"original": str(path), "quarantined": time.time(), **reason}
            text = json.dumps(record, indent=2, default=str) + "\n"
            folder.write_atomic(target + REASON_SUFFIX, text.encode())  # fsyncs the folder
            handle.fsync()
        return self.directory / QUARANTINE / target

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
        if not self.committed():
            self._refuse_sharded()
        for step, path in reversed(self.committed()):
            try:
                checkpoint = self._read(path, expected, step)
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

    def _refuse_sharded(self) -> None:
        """A directory of sharded steps is another layout than a state with no leaf laid out
        over the members: refused as incompatible, naming both, never started over."""
        records = sorted(n.name for n in self._names() if RECORD.fullmatch(n.name))
        if not records:
            return
        path = self.directory / records[-1]
        with self._opened() as handle:
            try:
                record = CommitRecord.from_bytes(
                    str(path), handle.read_small(records[-1], 64 << 20)
                )
                saved = describe(record.devices, record.layout)
            except CorruptCheckpoint:
                saved = "a sharded step (its record is damaged)"
        running = "a state with no leaf laid out over the members"
        raise RuntimeMismatch(
            str(path),
            "layout",
            saved,
            running,
            message=f"layout differs: saved {saved}, running {running}",
        )

    def _read(self, path: Path, expected: Expected, step: int) -> format.Checkpoint:
        """Read ``path`` for a restore, allocating only what the expected tree needs.

        The header was checked against the file's size when it was opened.  A
        header whose tree differs from the job's would size the allocation by
        what the file claims, so its data is only streamed through a bounded
        buffer to tell damage (corrupt) from another experiment (incompatible,
        raised by the manifest checks in their usual order).
        """
        with self._opened() as handle, format.Reader.open(path, handle) as reader:
            if reader.manifest.leaves != expected.leaves:
                reader.verify(self.signing_key)
                check_manifest(str(path), reader.manifest, expected, step)
            return reader.load(self.signing_key)


def directory_verdicts(
    directory: Path, job: Job, signing_key: bytes | None = None
) -> list[dict[str, Any]]:
    """Every checkpoint file of a directory (committed, pending, quarantined) with its verdict.

    The container (readable, length, checksum, and the signature given
    ``signing_key``) is fully checked, streaming the data through one bounded
    buffer, so a file that lies about its size costs no memory; of the
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
    recorded = {m.group(1) for p in directory.iterdir() if (m := RECORD.fullmatch(p.name))}
    rows = []
    for path in paths:
        shard = SHARD.fullmatch(path.name)
        place = (
            "quarantined"
            if path.parent == quarantine
            else "pending"
            if path.name.endswith(files.PENDING_SUFFIX)
            else "without its commit record"
            if shard and shard.group(1) not in recorded
            else "committed"
        )
        rows.append(_verdict_row(path, place, job, generation, signing_key))
    return rows


def _verdict_row(
    path: Path, place: str, job: Job, generation: int, signing_key: bytes | None
) -> dict[str, Any]:
    """One file's row: its identity from the header, and the verdict on it."""
    manifest: format.Manifest | None = None
    size: int | None = None
    signed: bool | None = None
    try:
        with format.Reader.open(path) as reader:
            manifest, size, signed = reader.manifest, reader.size, reader.signature is not None
            reader.verify(signing_key)
    except CheckpointError as error:
        verdict: dict[str, Any] = {"ok": False, **error.as_record()}
    else:
        problems = _provenance_refusals(path, reader.manifest, job, generation)
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
        "signed": signed,
    }


def _provenance_refusals(
    path: Path, manifest: format.Manifest, job: Job, generation: int
) -> list[str]:
    """The restore checks that need no JAX (task, training fields, step, generation) that fail."""
    where = str(path)
    named = NAME.fullmatch(path.name)
    found = []
    # A command job's program holds its own config (the SDK checks it on restore), and its
    # own step count unless the job file sets one.
    if job.task is not None:
        found.append(_refusal(check_config, where, manifest, job.task, job.train_fields()))
    if job.task is not None or "steps" in job.run.model_fields_set:
        step_in_name = int(named.group(1)) if named else None
        found.append(_refusal(check_step, where, manifest.step, job.run.steps, step_in_name))
    found.append(
        _refusal(check_generation, where, manifest.provenance.writer_generation, generation)
    )
    return [text for text in found if text is not None]


def _refusal(check: Callable[..., None], *args: Any) -> str | None:
    """``code: detail`` of the `IncompatibleCheckpoint` that ``check(*args)`` raises, if any."""
    try:
        check(*args)
    except IncompatibleCheckpoint as error:
        return f"{error.code}: {error.detail}"
    return None
