"""Job folders made durable in groups: staged apart, then fsynced together.

A job folder appears whole or not at all.  `stage` builds it as a sibling
``jobs/+intake-<id>/`` holding the request as taken, ``job.json`` and
``state.json``, written but not yet fsynced; `make_durable` then fsyncs every
file and staging folder of the group at once, renames each folder into place
and fsyncs ``jobs/`` once for all of them.  Only when it returns may a
request leave the spool.  The order each folder needs is kept (its files and
its staging folder durable before the rename, the rename durable before the
request goes); what the group shares is the waiting.  The fsyncs of a group
run in threads at once: the file system commits them together (on ext4 one
journal commit for all, where one after another each pays its own), and a
request that arrives while another is being made durable waits for one group,
not for a queue of them.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from jobwarden.daemon.store.jobs import STAGING_PREFIX, JobRecord, new_record, state_text
from jobwarden.daemon.store.layout import Root
from jobwarden.files import CREATE_FLAGS, UnsafePathError, kind_of, write_all
from jobwarden.jobfile import Job

FSYNC_THREADS = 16
"""Most fsyncs of a group in flight at once."""
FSYNC_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
"""How a file or a folder is opened to be fsynced (read-only serves both)."""


@dataclass(frozen=True)
class Staged:
    """A job folder written as its staging sibling, not yet durable."""

    record: JobRecord
    staging: Path
    target: Path
    files: tuple[Path, ...]


def stage(
    root: Root, job: Job, request: bytes, suffix: str, *, claim: str, request_name: str
) -> Staged:
    """Write ``jobs/+intake-<id>/`` with the request as taken (our own copy), ``job.json``
    and ``state.json``; nothing is fsynced yet (`make_durable`).

    A staging folder left by an earlier attempt is discarded first.  Raises
    `UnsafePathError` when something else sits at the staging name, OSError
    otherwise.
    """
    staging = root.jobs / f"{STAGING_PREFIX}{job.id}"
    if os.path.lexists(staging):
        found = os.lstat(staging).st_mode
        if not stat.S_ISDIR(found):  # planted: rmtree would refuse it at every rescan
            raise UnsafePathError(
                str(staging),
                f"is a {kind_of(found)}, not a staging folder of this daemon; left in place",
                found=kind_of(found),
            )
        shutil.rmtree(staging)
    staging.mkdir()
    record = new_record(job, claim=claim, request_name=request_name)
    contents = {
        f"request{suffix}": request,
        "job.json": (json.dumps(job.to_record(), indent=2) + "\n").encode(),
        "state.json": state_text(record).encode(),
    }
    files = []
    for name, data in contents.items():
        path = staging / name
        fd = os.open(path, CREATE_FLAGS, 0o600)
        try:
            write_all(fd, [memoryview(data)])
        finally:
            os.close(fd)
        files.append(path)
    return Staged(record, staging, root.job(job.id), tuple(files))


def make_durable(root: Root, group: list[Staged]) -> list[JobRecord | OSError]:
    """Make every staged folder of ``group`` durable as ``jobs/<id>/``; for each, its record
    or the OSError that stopped it (FileExistsError if its job folder appeared meanwhile).

    A folder whose fsync failed is left staged, for the next attempt or start to discard.
    """
    outcomes: list[JobRecord | OSError] = [s.record for s in group]
    paths = [(i, path) for i, s in enumerate(group) for path in (*s.files, s.staging)]
    for (i, _), error in zip(paths, fsync_all([path for _, path in paths]), strict=True):
        if error is not None and not isinstance(outcomes[i], OSError):
            outcomes[i] = error
    renamed = []
    for i, staged in enumerate(group):
        if isinstance(outcomes[i], OSError):
            continue
        try:
            if os.path.lexists(staged.target):
                raise FileExistsError(
                    f"job folder {staged.target} appeared while {staged.staging} was built"
                )
            os.rename(staged.staging, staged.target)
        except OSError as error:
            outcomes[i] = error
        else:
            renamed.append(i)
    if renamed:
        [failed] = fsync_all([root.jobs])
        if failed is not None:
            for i in renamed:
                outcomes[i] = failed
    return outcomes


def create_folder(
    root: Root, job: Job, request: bytes, suffix: str, *, claim: str, request_name: str
) -> JobRecord:
    """Make ``jobs/<id>/`` durable in one step (a group of one); returns the record it saved.

    Raises OSError (the staging folder is left for the next attempt or start
    to discard) or FileExistsError if the job folder appeared meanwhile.
    """
    staged = stage(root, job, request, suffix, claim=claim, request_name=request_name)
    [outcome] = make_durable(root, [staged])
    if isinstance(outcome, OSError):
        raise outcome
    return outcome


def fsync_all(paths: list[Path]) -> list[OSError | None]:
    """fsync each file or folder of ``paths``, all at once; for each, None or its error."""
    if len(paths) <= 1:
        return [_fsync(path) for path in paths]
    with ThreadPoolExecutor(min(len(paths), FSYNC_THREADS), "wardend-fsync") as pool:
        return list(pool.map(_fsync, paths))


def _fsync(path: Path) -> OSError | None:
    try:
        fd = os.open(path, FSYNC_FLAGS)
    except OSError as error:
        return error
    try:
        os.fsync(fd)
    except OSError as error:
        return error
    finally:
        os.close(fd)
    return None
