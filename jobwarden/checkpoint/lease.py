"""The writer lease: one writer per checkpoint directory across hosts, where flock is not enough.

flock is node-local on many shared filesystems (NFS through lockd, Lustre
only with ``-o flock``), so two Slurm attempts on two nodes could both hold
"the" lock.  The lease closes that gap with what every POSIX filesystem
gives: ``O_CREAT|O_EXCL``.  A writer of generation N claims
``writer.lease.N`` exclusively (of two writers that read the same generation,
exactly one gets it, and the claim is kept), writes its generation, Slurm job
id, host and pid into it, and replaces ``writer.lease`` with the same record
(pending sibling, fsync, rename, directory fsync) unless that already names a
newer generation.  Before every commit's rename the writer checks that
``writer.lease`` still names its own generation; a writer fenced out by a
newer one raises `LeaseLost` and commits nothing.

A lease is taken when the worker runs under Slurm (``SLURM_JOB_ID`` set), or
when ``JOBWARDEN_LEASE=1``.  Every commit's check renews it (the claim's time).
It is never judged stale by a clock: the daemon judges it from the state of
the Slurm job it names (`jobwarden.daemon.launch.slurm.lease`), and a newer generation
takes over, fencing the old writer.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from jobwarden.checkpoint.errors import WriterFenced

LEASE_NAME = "writer.lease"
LEASE_ENV = "JOBWARDEN_LEASE"
SLURM_JOB_ENV = "SLURM_JOB_ID"


class LeaseLost(WriterFenced):
    """Raised when the lease names another generation than the writer's (or none): a newer
    writer took the directory, and this one must not commit."""

    code = "writer.lease_lost"
    exit_status = 35


@dataclass(frozen=True)
class Lease:
    """Who holds the checkpoint directory: the writer generation and its Slurm job."""

    generation: int
    slurm_job: str | None
    host: str
    pid: int
    taken: float


def wanted(env: Mapping[str, str]) -> bool:
    """Whether a writer in ``env`` takes a lease: under Slurm, or when asked to."""
    return bool(env.get(SLURM_JOB_ENV)) or env.get(LEASE_ENV) == "1"


def take(directory: Path, generation: int, slurm_job: str | None) -> Lease:
    """Claim the lease for ``generation``; raises `LeaseLost` when that generation is already
    claimed or a newer one holds the lease."""
    lease = Lease(generation, slurm_job, socket.gethostname(), os.getpid(), time.time())
    text = (json.dumps(asdict(lease)) + "\n").encode()
    claim = directory / f"{LEASE_NAME}.{generation}"
    try:
        _write(claim, text, os.O_EXCL)  # kept: the generation stays claimed
    except FileExistsError as error:
        raise _lost(directory, generation, read(directory), "already claimed") from error
    current = read(directory)
    if current is not None and current.generation >= generation:
        raise _lost(directory, generation, current, "a newer writer holds it")
    pending = directory / f".{LEASE_NAME}.{generation}.pending"
    _write(pending, text, os.O_TRUNC)
    os.replace(pending, directory / LEASE_NAME)
    _fsync_directory(directory)
    return lease


def read(directory: Path) -> Lease | None:
    """The lease as it stands; None when there is none (or it cannot be read as one)."""
    try:
        record = json.loads((directory / LEASE_NAME).read_text())
        return Lease(**record)
    except (OSError, ValueError, TypeError):
        return None


def check(directory: Path, generation: int, *, renewing: bool = True) -> None:
    """Refuse (`LeaseLost`) unless the lease still names ``generation``: before a rename.
    A check that holds renews the lease (`renew`): every commit is a sign of life.  A
    member of a sharded job that does not hold the lease checks without renewing."""
    current = read(directory)
    if current is None or current.generation != generation:
        raise _lost(directory, generation, current, "fenced before the commit")
    if renewing:
        renew(directory, generation)


def renew(directory: Path, generation: int) -> None:
    """Touch this writer's own claim, ``writer.lease.N``, which no other writer ever writes
    (replacing ``writer.lease`` could undo a newer writer's takeover).  Its time is evidence
    for a person; staleness is judged from Slurm's job state (`daemon.slurmlease`)."""
    with contextlib.suppress(OSError):
        os.utime(directory / f"{LEASE_NAME}.{generation}")


def renewed(directory: Path, generation: int) -> float | None:
    """When the writer of ``generation`` last renewed its lease (wall time), if known."""
    try:
        return (directory / f"{LEASE_NAME}.{generation}").stat().st_mtime
    except OSError:
        return None


def _lost(directory: Path, generation: int, current: Lease | None, why: str) -> LeaseLost:
    found = (
        f"generation {current.generation} (Slurm job {current.slurm_job}, {current.host})"
        if current is not None
        else "no lease"
    )
    return LeaseLost(
        f"{directory / LEASE_NAME} names {found}, this writer holds generation {generation}: {why}",
        directory=str(directory),
        generation=generation,
        current_generation=current.generation if current is not None else None,
        current_slurm_job=current.slurm_job if current is not None else None,
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | mode
    fd = os.open(path, flags, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
