"""The one root exception, the stable codes and exit statuses it carries, and incident kinds.

Every refusal jobwarden makes is a `JobwardenError` subclass.  Each subclass has
a stable machine-readable ``code``, a process ``exit_status`` (the worker exits
with it) and the `IncidentKind` a failed attempt that reports it leads to, and
carries its evidence as plain fields so an incident record can be written from
the exception alone.  A subclass inherits its family's kind unless it names its own.

Within one program the refusals have distinct exit statuses, with deliberate
exceptions: 70 (EX_SOFTWARE) for a defect, and for the abstract root, which
classes that never end a process themselves inherit; 2 for a setting or input
that cannot be used (a usage error); 19 for the checkpoint family bases, which
are never raised; and wardenctl's few statuses by meaning (docs/wardenctl.md).
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar


class IncidentKind(enum.StrEnum):
    """What kind of failure an incident records; defined here, as every error names its own."""

    CRASH = "crash"
    STALL = "stall"
    RSS_LIMIT = "rss_limit"
    PREEMPTION = "preemption"
    INVALID_REQUEST = "invalid_request"
    RESUME_POLICY = "resume_policy"
    UNSAFE_CACHE = "unsafe_cache"
    DUPLICATE_WRITER = "duplicate_writer"
    UNSAFE_PATH = "unsafe_path"
    DISK_FULL = "disk_full"
    CORRUPT_CHECKPOINT = "corrupt_checkpoint"
    INCOMPATIBLE_CHECKPOINT = "incompatible_checkpoint"
    REPLAY_MISMATCH = "replay_mismatch"
    DAEMON_RESTART = "daemon_restart"
    LAUNCH_FAILED = "launch_failed"


class JobwardenError(Exception):
    """Raised for every refusal jobwarden makes; never raised directly."""

    code: ClassVar[str] = "jobwarden.error"
    exit_status: ClassVar[int] = 70
    incident: ClassVar[IncidentKind] = IncidentKind.CRASH
    """The kind of incident a failed attempt that reports this code is; a restart may
    mend what nobody foresaw, so the root's is a crash."""

    def __init__(self, message: str, **evidence: Any) -> None:
        super().__init__(message)
        self.message = message
        self.evidence: dict[str, Any] = evidence

    def as_record(self) -> dict[str, Any]:
        """The error as a JSON-ready record: code, message and evidence."""
        return {"code": self.code, "message": self.message, **self.evidence}


class JobFileError(JobwardenError):
    """Raised when a job file cannot be parsed or breaks the schema; lists every problem."""

    code = "job.invalid"
    exit_status = 3
    incident = IncidentKind.INVALID_REQUEST

    def __init__(self, path: str, problems: list[str]) -> None:
        listing = "; ".join(problems)
        super().__init__(
            f"{path}: {len(problems)} problem(s): {listing}", path=path, problems=problems
        )
        self.problems = problems


class UnsafeCacheError(JobwardenError):
    """Raised when the compilation cache directory is readable or writable by others."""

    code = "worker.cache_unsafe"
    exit_status = 4
    incident = IncidentKind.UNSAFE_CACHE


class InjectedFailure(JobwardenError):
    """Raised by the ``fail_after`` drill fault after the named update."""

    code = "worker.injected_failure"
    exit_status = 10
    incident = IncidentKind.CRASH


class WriterLockedError(JobwardenError):
    """Raised when another live process holds the checkpoint directory's writer lock."""

    code = "writer.locked"
    exit_status = 11
    incident = IncidentKind.DUPLICATE_WRITER


class ResumePolicyError(JobwardenError):
    """Raised when the ``[run] resume`` policy forbids what the directory holds."""

    code = "resume.policy"
    exit_status = 12
    incident = IncidentKind.RESUME_POLICY


class PreemptedExit(JobwardenError):
    """Raised to end an attempt that was preempted after committing its checkpoint."""

    code = "worker.preempted"
    exit_status = 75
    incident = IncidentKind.PREEMPTION


class WorkerInternalError(JobwardenError):
    """Stands for an unexpected exception in the worker: a bug, reported with its type."""

    code = "worker.internal"
    exit_status = 70
    incident = IncidentKind.CRASH


class ExitStatusConflict(JobwardenError):
    """Raised by `exit_status_table` when two error classes give one code two exit statuses."""

    code = "errors.exit_status_conflict"
    exit_status = 70

    def __init__(self, code: str, classes: list[str], statuses: list[int]) -> None:
        super().__init__(
            f"error code {code} has two exit statuses: "
            + ", ".join(f"{name} {status}" for name, status in zip(classes, statuses, strict=True)),
            error_code=code,
            classes=classes,
            statuses=statuses,
        )


def exit_status_table() -> dict[str, int]:
    """Every error code and its exit status, for documentation and tests."""
    table: dict[str, int] = {}
    owner: dict[str, type[JobwardenError]] = {}
    stack: list[type[JobwardenError]] = [JobwardenError]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls.code in table and table[cls.code] != cls.exit_status:
            first = owner[cls.code]
            raise ExitStatusConflict(
                cls.code,
                [first.__qualname__, cls.__qualname__],
                [first.exit_status, cls.exit_status],
            )
        table[cls.code] = cls.exit_status
        owner.setdefault(cls.code, cls)
    return table
