"""Which incident each error code leads to, read from the error classes named here.

A failed attempt reports its error by ``code`` (the ``failed`` event) and its exit
status, and the policy needs that error's `IncidentKind`.  The kind is declared on the error
class (``incident``); this module names every class whose code can reach the
policy, so the table never depends on which modules happen to be imported.
A test checks the list against every error class in the package.
"""

from __future__ import annotations

from jobwarden.checkpoint.errors import (
    CheckpointDiskFull,
    ChecksumMismatch,
    ConfigMismatch,
    DataMismatch,
    DtypeMismatch,
    GenerationFenced,
    NonFiniteState,
    NoUsableCheckpoint,
    RuntimeMismatch,
    SchemaMismatch,
    ShapeMismatch,
    SignatureMismatch,
    SourceMismatch,
    StepOutOfRange,
    TreeMismatch,
    TruncatedCheckpoint,
    UnreadableCheckpoint,
    UnsafeCheckpointDirectory,
    WriterFenced,
    WriterLockLost,
)
from jobwarden.checkpoint.lease import LeaseLost
from jobwarden.checkpoint.signing import UnsafeSigningKey
from jobwarden.daemon.store.layout import RootLockedError
from jobwarden.daemon.store.rootcheck import RootUnsafeError
from jobwarden.errors import (
    ExitStatusConflict,
    IncidentKind,
    InjectedFailure,
    JobFileError,
    JobwardenError,
    PreemptedExit,
    ResumePolicyError,
    UnsafeCacheError,
    WorkerInternalError,
    WriterLockedError,
)
from jobwarden.files import UnsafePathError
from jobwarden.protocol import ControlError
from jobwarden.sdk.distributed import CoordinatorUnavailable, MembersDiverged, MembershipError
from jobwarden.sdk.session import UsageError
from jobwarden.states import IllegalTransition
from jobwarden.statetree import UnsupportedLeaf

ERRORS: tuple[type[JobwardenError], ...] = (
    # the worker's own refusals and faults
    JobFileError,
    UnsafeCacheError,
    UnsafePathError,
    UnsafeSigningKey,
    InjectedFailure,
    ResumePolicyError,
    PreemptedExit,
    WorkerInternalError,
    UsageError,
    UnsupportedLeaf,
    MembersDiverged,
    MembershipError,
    CoordinatorUnavailable,
    # the writer lock and its fencing
    WriterLockedError,
    WriterLockLost,
    WriterFenced,
    LeaseLost,
    # checkpoint files and their directory
    UnreadableCheckpoint,
    TruncatedCheckpoint,
    ChecksumMismatch,
    SignatureMismatch,
    SchemaMismatch,
    SourceMismatch,
    ConfigMismatch,
    DataMismatch,
    RuntimeMismatch,
    TreeMismatch,
    ShapeMismatch,
    DtypeMismatch,
    StepOutOfRange,
    NonFiniteState,
    GenerationFenced,
    NoUsableCheckpoint,
    CheckpointDiskFull,
    UnsafeCheckpointDirectory,
    # raised outside an attempt, named so that every code below the daemon has its kind
    ExitStatusConflict,
    IllegalTransition,
    ControlError,
    RootLockedError,
    RootUnsafeError,
)
"""Every error class whose code a failure can carry.  Left out on purpose (the test
names them): the abstract family bases, never raised; wardend's start-up refusals
(launcher, metrics and notify settings) and the policy's own defect, which no attempt
reports; and wardenctl's errors, which the daemon never imports."""

KINDS: dict[str, IncidentKind] = {error.code: error.incident for error in ERRORS}
"""Each listed code and the kind of incident it leads to; an unlisted code is the root's
kind (a crash), as a restart may mend what nobody foresaw."""
