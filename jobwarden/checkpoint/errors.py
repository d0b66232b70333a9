"""Checkpoint refusals: each has its own code and exit status and names what differed.

Two families decide what recovery may do next.  A `CorruptCheckpoint` is
accidental damage (or, for `SignatureMismatch`, a rewrite by someone without
the key): the file is quarantined and an older checkpoint may be used.  An
`IncompatibleCheckpoint` is a sound file from a different experiment or
runtime: the attempt stops, with no fallback and no relaxed checks.  Besides
the files, the directory itself can be refused (`UnsafeCheckpointDirectory`),
and a writer that lost its lock or was fenced stops before it commits
(`WriterLockLost`, `WriterFenced`).  Each family names the `IncidentKind` it
leads to and its members inherit it.
"""

from __future__ import annotations

from typing import Any

from jobwarden.errors import IncidentKind, JobwardenError, WriterLockedError
from jobwarden.files import UnsafePathError


class CheckpointError(JobwardenError):
    """Raised when a checkpoint file is refused; ``path`` names the file.

    ``detail`` is the message without the path, for listings that show the file already.
    """

    code = "checkpoint.error"
    exit_status = 19

    def __init__(self, path: str, message: str, **evidence: Any) -> None:
        super().__init__(f"{path}: {message}", path=path, **evidence)
        self.path = path
        self.detail = message


class CorruptCheckpoint(CheckpointError):
    """Raised for accidental damage; the store quarantines the file and falls back."""

    code = "checkpoint.corrupt"
    incident = IncidentKind.CRASH
    """A restart falls back past the quarantined file; only `NoUsableCheckpoint` is final."""


class UnreadableCheckpoint(CorruptCheckpoint):
    """Raised when the file cannot be opened or its safetensors header is malformed."""

    code = "checkpoint.unreadable"
    exit_status = 20


class TruncatedCheckpoint(CorruptCheckpoint):
    """Raised when the file is shorter than its header says it must be."""

    code = "checkpoint.truncated"
    exit_status = 21


class ChecksumMismatch(CorruptCheckpoint):
    """Raised when the recomputed checksum differs from the one stored in the manifest."""

    code = "checkpoint.checksum"
    exit_status = 22


class SignatureMismatch(CorruptCheckpoint):
    """Raised, when a signing key is given, for a checkpoint whose HMAC is missing or wrong.

    The checksum verified, so this is no accident: someone without the key
    rewrote the file.  Quarantined and passed over like damage.
    """

    code = "checkpoint.signature"
    exit_status = 34


class IncompatibleCheckpoint(CheckpointError):
    """Raised for a sound file that is not this experiment's; recovery escalates."""

    code = "checkpoint.incompatible"
    incident = IncidentKind.INCOMPATIBLE_CHECKPOINT

    def __init__(
        self,
        path: str,
        field: str,
        saved: Any,
        requested: Any,
        message: str | None = None,
        **evidence: Any,
    ) -> None:
        text = message or f"{field} differs: saved {saved!r}, requested {requested!r}"
        super().__init__(path, text, field=field, saved=saved, requested=requested, **evidence)
        self.field = field
        self.saved = saved
        self.requested = requested


class SchemaMismatch(IncompatibleCheckpoint):
    """Raised when the checkpoint was written under another schema version."""

    code = "checkpoint.schema"
    exit_status = 23


class SourceMismatch(IncompatibleCheckpoint):
    """Raised when the worker and task source that define the update changed."""

    code = "checkpoint.source"
    exit_status = 24


class ConfigMismatch(IncompatibleCheckpoint):
    """Raised when training fields differ; ``fields`` lists each with both values."""

    code = "checkpoint.config"
    exit_status = 25


class DataMismatch(IncompatibleCheckpoint):
    """Raised when the training data hash differs."""

    code = "checkpoint.data"
    exit_status = 26


class RuntimeMismatch(IncompatibleCheckpoint):
    """Raised when python, jax, jaxlib, numpy, backend, XLA flags or XLA's CPU pool differ."""

    code = "checkpoint.runtime"
    exit_status = 27


class TreeMismatch(IncompatibleCheckpoint):
    """Raised when the saved state's leaf paths differ from the task's state."""

    code = "checkpoint.tree"
    exit_status = 28


class ShapeMismatch(IncompatibleCheckpoint):
    """Raised when a saved leaf has another shape than the task's state."""

    code = "checkpoint.shape"
    exit_status = 29


class DtypeMismatch(IncompatibleCheckpoint):
    """Raised when a saved leaf has another dtype than the task's state."""

    code = "checkpoint.dtype"
    exit_status = 30


class StepOutOfRange(IncompatibleCheckpoint):
    """Raised when the saved step is negative, past the requested steps, or mislabelled."""

    code = "checkpoint.step_range"
    exit_status = 31


class NonFiniteState(IncompatibleCheckpoint):
    """Raised when a saved floating-point leaf holds NaN or infinity."""

    code = "checkpoint.non_finite"
    exit_status = 32


class GenerationFenced(IncompatibleCheckpoint):
    """Raised when a checkpoint names a writer generation newer than the directory's."""

    code = "checkpoint.generation"
    exit_status = 33


class NoUsableCheckpoint(CheckpointError):
    """Raised when the directory held checkpoints but every one was quarantined."""

    code = "checkpoint.none_usable"
    exit_status = 13
    incident = IncidentKind.CORRUPT_CHECKPOINT


class CheckpointDiskFull(CheckpointError):
    """Raised when a commit fails because the checkpoint directory's filesystem is full
    (ENOSPC) or over quota (EDQUOT).  The pending file is removed and every older
    checkpoint is intact; a restart would fill the disk again, so a person frees space."""

    code = "checkpoint.disk_full"
    exit_status = 17
    incident = IncidentKind.DISK_FULL

    def __init__(self, directory: str, step: int, wanted: int, error: OSError) -> None:
        super().__init__(
            directory,
            f"no room to commit step {step} ({wanted} bytes): {error.strerror}",
            step=step,
            bytes=wanted,
            errno=error.errno,
        )


class UnsafeCheckpointDirectory(UnsafePathError):
    """Raised when the checkpoint directory, or an entry a writer uses in it, is unsafe.

    The directory must be a real directory (not a symbolic link) owned by the
    writer's uid and not writable by group or others; ``quarantine/``,
    ``writer.json`` and the files read must be ours and no links.  The
    evidence names the path, what is there, its owner and its mode.
    """

    code = "checkpoint.directory_unsafe"
    exit_status = 14


class WriterLockLost(WriterLockedError):
    """Raised before a commit when the writer's path no longer names the directory it locked.

    The directory was moved, replaced or deleted under the writer; a commit
    now would land where no restart looks, beside a writer that may hold the new one.
    """

    code = "writer.lock_lost"
    exit_status = 15


class WriterFenced(WriterLockedError):
    """Raised before a commit when ``writer.json`` names another generation than the writer's.

    A newer writer took the directory (or its record was rewritten): this
    writer is fenced and must stop without committing.
    """

    code = "writer.fenced"
    exit_status = 16
