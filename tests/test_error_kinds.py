"""Error classes carry their incident kind, the registry names them all, and exit statuses
stay one per error except where a shared status is deliberate."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import jobwarden
from jobwarden.checkpoint.errors import CheckpointError, CorruptCheckpoint, IncompatibleCheckpoint
from jobwarden.daemon.incidents import kinds
from jobwarden.daemon.launch.base import LauncherError
from jobwarden.daemon.observe.exporter import MetricsListenError
from jobwarden.daemon.observe.hooks import NotifySettingError
from jobwarden.daemon.supervise.policy import UnappliableOutcome
from jobwarden.errors import IncidentKind, JobwardenError
from jobwarden.sdk.distributed import MembersDiverged

DOCS = Path(__file__).parent.parent / "docs"

ABSTRACT = {JobwardenError, CheckpointError, CorruptCheckpoint, IncompatibleCheckpoint}
"""Family bases, never raised: no failure carries their codes."""
OUTSIDE_ATTEMPTS = {LauncherError, MetricsListenError, NotifySettingError, UnappliableOutcome}
"""wardend's start-up refusals and the policy's own defect: never reported by an attempt."""

SHARED_STATUSES: dict[int, set[str]] = {
    # wardenctl: the daemon is not there or refused the request (docs/wardenctl.md)
    1: {"control.error", "control.unreachable"},
    # a usage error: a setting or an input that cannot be used (docs/daemon.md, wardenctl.md)
    2: {"distributed.membership", "drill.job", "drill.plan", "metrics.listen", "notify.setting"},
    # two programs: the worker's unsafe path, wardenctl's busy daemon (docs/wardenctl.md)
    5: {"control.busy", "path.unsafe"},
    # the checkpoint family bases, never raised
    19: {"checkpoint.corrupt", "checkpoint.error", "checkpoint.incompatible"},
    # EX_SOFTWARE: a defect, or an error that never ends a process by itself (the root's)
    70: {
        "daemon.unappliable_outcome",
        "drill.abandoned",
        "drill.rejected",
        "errors.exit_status_conflict",
        "jobwarden.error",
        "worker.internal",
    },
}
"""The exit statuses more than one error code has, on purpose, and those codes."""


def error_classes() -> set[type[JobwardenError]]:
    """Every error class in the package, each of its modules imported."""
    for found in pkgutil.walk_packages(jobwarden.__path__, "jobwarden."):
        if not found.name.endswith("__main__"):
            importlib.import_module(found.name)
    classes: set[type[JobwardenError]] = set()
    stack: list[type[JobwardenError]] = [JobwardenError]
    while stack:
        cls = stack.pop()
        classes.add(cls)
        stack.extend(cls.__subclasses__())
    return classes


def client_side(cls: type[JobwardenError]) -> bool:
    """Whether ``cls`` belongs to wardenctl, which the daemon never imports."""
    return cls.__module__.startswith("jobwarden.control.")


def test_every_error_class_has_an_incident_kind() -> None:
    """Each error class names (or inherits from its family) the incident it leads to."""
    missing = [
        cls.__qualname__ for cls in error_classes() if not isinstance(cls.incident, IncidentKind)
    ]
    assert missing == []


def test_the_registry_names_every_error_an_attempt_can_report() -> None:
    """Every error class is listed, or left out for a reason the registry gives."""
    left_out = {
        cls.__qualname__
        for cls in error_classes()
        if cls not in kinds.ERRORS
        and cls not in ABSTRACT | OUTSIDE_ATTEMPTS
        and not client_side(cls)
    }
    assert left_out == set()
    assert not (ABSTRACT | OUTSIDE_ATTEMPTS) & set(kinds.ERRORS)


def test_the_registry_reads_each_kind_from_its_class() -> None:
    """A listed code leads to its class's kind; one code never has two kinds."""
    by_code: dict[str, set[IncidentKind]] = defaultdict(set)
    for cls in kinds.ERRORS:
        by_code[cls.code].add(cls.incident)
    assert {code: found for code, found in by_code.items() if len(found) > 1} == {}
    assert all(kinds.KINDS[cls.code] is cls.incident for cls in kinds.ERRORS)


def test_an_abstract_base_code_is_unlisted() -> None:
    """The family bases' codes, never reported, stay out of the table (a crash if met)."""
    assert not {cls.code for cls in ABSTRACT} & set(kinds.KINDS)


def test_the_policy_needs_no_other_import_to_know_a_code() -> None:
    """In a fresh interpreter that imports only the policy, a lease-lost writer escalates."""
    program = (
        "from jobwarden.daemon.supervise.policy import AttemptReport, classify\n"
        "print(classify(AttemptReport(1, failure_code='writer.lease_lost'), 35))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "duplicate_writer"


def test_exit_statuses_are_shared_only_on_purpose() -> None:
    """No two error codes share an exit status, but for the deliberate shared statuses."""
    codes: dict[int, set[str]] = defaultdict(set)
    for cls in error_classes():
        codes[cls.exit_status].add(cls.code)
    shared = {status: found for status, found in codes.items() if len(found) > 1}
    assert shared == SHARED_STATUSES


def test_members_diverged_has_its_own_documented_status() -> None:
    """distributed.diverged exits 36, and the docs that give its status say so."""
    assert MembersDiverged.exit_status == 36
    assert "| 36 | `distributed.diverged` |" in (DOCS / "worker.md").read_text()
    assert "`distributed.diverged` (exit 36)" in (DOCS / "multiprocess.md").read_text()
