"""Pins what the policy does with every error code a failed attempt can report.

The table was computed from the policy as wardend ran it before error classes
carried their incident kind (`ESCALATING_CODES` walked ``__subclasses__()``
after wardend's entry point had imported every error module).  It must not
change unless a code's outcome is meant to.
"""

from __future__ import annotations

import importlib
import pkgutil

import jobwarden
from jobwarden.daemon.launch.base import ExitInfo
from jobwarden.daemon.store.jobs import JobRecord
from jobwarden.daemon.supervise import policy
from jobwarden.errors import JobwardenError
from jobwarden.jobfile import job_from_mapping

RESTART = "restart"
"""Restarted: a ``preemption`` after exit status 75, a ``crash`` after any other."""

PINNED: dict[str, str] = {
    "checkpoint.checksum": RESTART,
    "checkpoint.config": "incompatible_checkpoint",
    "checkpoint.corrupt": RESTART,
    "checkpoint.data": "incompatible_checkpoint",
    "checkpoint.directory_unsafe": "unsafe_path",
    "checkpoint.disk_full": "disk_full",
    "checkpoint.dtype": "incompatible_checkpoint",
    "checkpoint.error": RESTART,
    "checkpoint.generation": "incompatible_checkpoint",
    "checkpoint.incompatible": RESTART,
    "checkpoint.non_finite": "incompatible_checkpoint",
    "checkpoint.none_usable": "corrupt_checkpoint",
    "checkpoint.runtime": "incompatible_checkpoint",
    "checkpoint.schema": "incompatible_checkpoint",
    "checkpoint.shape": "incompatible_checkpoint",
    "checkpoint.signature": RESTART,
    "checkpoint.source": "incompatible_checkpoint",
    "checkpoint.step_range": "incompatible_checkpoint",
    "checkpoint.tree": "incompatible_checkpoint",
    "checkpoint.truncated": RESTART,
    "checkpoint.unreadable": RESTART,
    "control.busy": RESTART,
    "control.error": RESTART,
    "control.unreachable": RESTART,
    "daemon.launcher": RESTART,
    "daemon.root_locked": RESTART,
    "daemon.root_unsafe": "unsafe_path",
    "daemon.unappliable_outcome": RESTART,
    "distributed.coordinator": RESTART,
    "distributed.diverged": RESTART,
    "distributed.membership": RESTART,
    "drill.abandoned": RESTART,
    "drill.job": RESTART,
    "drill.plan": RESTART,
    "drill.rejected": RESTART,
    "errors.exit_status_conflict": RESTART,
    "job.illegal_transition": RESTART,
    "job.invalid": "invalid_request",
    "jobwarden.error": RESTART,
    "metrics.listen": RESTART,
    "notify.setting": RESTART,
    "path.unsafe": "unsafe_path",
    "resume.policy": "resume_policy",
    "worker.cache_unsafe": "unsafe_cache",
    "worker.injected_failure": RESTART,
    "worker.internal": RESTART,
    "worker.preempted": RESTART,
    "worker.signing_key_unsafe": "unsafe_path",
    "writer.fenced": "duplicate_writer",
    "writer.lease_lost": "duplicate_writer",
    "writer.lock_lost": "duplicate_writer",
    "writer.locked": "duplicate_writer",
}


def every_error_class() -> dict[str, type[JobwardenError]]:
    """Each error code in the package and the first class that carries it, every module imported."""
    for found in pkgutil.walk_packages(jobwarden.__path__, "jobwarden."):
        if not found.name.endswith("__main__"):
            importlib.import_module(found.name)
    classes: dict[str, type[JobwardenError]] = {}
    stack: list[type[JobwardenError]] = [JobwardenError]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        classes.setdefault(cls.code, cls)
    return classes


def outcome(code: str, status: int) -> tuple[str, str]:
    """What the policy decides for a first attempt that reported ``code`` and exited ``status``."""
    job = job_from_mapping({"id": "j", "task": "linreg"})
    report = policy.AttemptReport(1, failure_code=code, failure_message="refused")
    decided = policy.decide(JobRecord(id="j", job=job), report, ExitInfo.from_status(status, 1.0))
    assert not isinstance(decided, policy.Completed | policy.Preempted)
    return type(decided).__name__, str(decided.kind)


def expected(pinned: str, status: int) -> tuple[str, str]:
    """The pinned outcome of an attempt that exited ``status``."""
    if pinned != RESTART:
        return "Escalate", pinned
    return "Restart", "preemption" if status == 75 else "crash"


def test_every_code_is_pinned() -> None:
    """A new error code gets its outcome pinned here, on purpose."""
    assert sorted(every_error_class()) == sorted(PINNED)


def test_every_code_keeps_its_outcome() -> None:
    """Each code leads to its pinned outcome after its own exit status, exit 1 and exit 75."""
    differing = {}
    for code, cls in every_error_class().items():
        for status in (cls.exit_status, 1, 75):
            if outcome(code, status) != expected(PINNED[code], status):
                differing[code, status] = outcome(code, status)
    assert differing == {}
