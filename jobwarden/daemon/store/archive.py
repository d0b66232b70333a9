"""The archive: settled jobs moved whole out of ``ROOT/jobs/``, never deleted.

``wardenctl remove JOB`` (or ``archive``) and the ``--keep-finished N``
retention move a settled job's folder to ``ROOT/archive/<id>-<UTC time>/``
in one rename, with an ``archived.json`` note beside its ``state.json``; the
job leaves the daemon's table, so its id is free for a new submit.  Nothing
in the archive is ever deleted by the daemon.  Its checkpoint directory is
not part of the job folder and stays where it is, so that a job of the same
checkpoint resumes it; unless the job is archived ``fresh`` (``submit
--fresh``): then the directory moves with it, to ``<folder>/checkpoint/``.
A checkpoint directory no job holds is archived alone, to
``ROOT/archive/checkpoints/<name>-<UTC time>/``.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from collections.abc import Container
from pathlib import Path
from typing import Any

import structlog

from jobwarden.daemon.store import rootcheck
from jobwarden.daemon.store.jobs import JobRecord, JobTable
from jobwarden.daemon.store.layout import Root
from jobwarden.files import fsync_dir, write_text_atomic
from jobwarden.states import SETTLED, TERMINAL

log = structlog.get_logger("wardend.archive")

ARCHIVE = "archive"
NOTE = "archived.json"
"""The note an archived job folder holds: when, why, and the state it rested in."""
CHECKPOINT = "checkpoint"
"""Where a job archived fresh keeps its checkpoint directory, in its archive folder."""
CHECKPOINTS = "checkpoints"
"""The folder of ``ROOT/archive`` holding the checkpoint directories archived alone."""


DAY_S = 86400.0
"""Seconds in a day, for ``--keep-finished-days``."""


def folder_of(root: Root) -> Path:
    """``ROOT/archive``."""
    return root.path / ARCHIVE


def stamp(now: float) -> str:
    """A UTC time for a folder name: ``20250102T030405.123456Z``."""
    moment = datetime.datetime.fromtimestamp(now, datetime.UTC)
    return moment.strftime("%Y%m%dT%H%M%S.%fZ")


def is_directory(path: Path) -> bool:
    """Whether ``path`` is a directory itself, not a link to one (which is never moved)."""
    return path.is_dir() and not path.is_symlink()


def free_place(folder: Path, name: str, now: float) -> Path:
    """``folder/<name>-<UTC time>``, with a counter after it should that be taken."""
    target = folder / f"{name}-{stamp(now)}"
    number = 1
    while os.path.lexists(target):
        target = folder / f"{name}-{stamp(now)}.{number}"
        number += 1
    return target


def archive_job(
    root: Root, table: JobTable, record: JobRecord, reason: str, *, fresh: bool = False
) -> Path:
    """Move a settled job's folder into the archive and forget the job; returns where it went.

    With ``fresh`` its checkpoint directory, when there is one, moves first into the
    job folder (as `CHECKPOINT`), so that the two reach the archive in one rename.
    Raises OSError when a move cannot be made (the job then stays as it was).
    The caller forgets whatever else it keeps for the job (its unwritten incidents).
    """
    now = time.time()
    archive = folder_of(root)
    rootcheck.make_folder(archive)
    target = free_place(archive, record.id, now)
    source = root.job(record.id)
    checkpoint = root.checkpoints / record.checkpoint
    carried = fresh and is_directory(checkpoint)
    note = {
        "job": record.id,
        "archived": now,
        "archived_utc": datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat(),
        "reason": reason,
        "state": record.state.value,
        "from": str(source),
        "checkpoint": {"name": record.checkpoint, "from": str(checkpoint), "to": CHECKPOINT}
        if carried
        else None,
    }
    write_text_atomic(source / NOTE, json.dumps(note, indent=2) + "\n")
    if carried:
        os.rename(checkpoint, source / CHECKPOINT)
        fsync_dir(root.checkpoints)
    try:
        os.rename(source, target)
    except OSError:
        if carried:  # put it back: the job stays as it was, checkpoints and all
            os.rename(source / CHECKPOINT, checkpoint)
        raise
    fsync_dir(archive)
    fsync_dir(root.jobs)
    table.drop(record.id)
    log.info(
        "job.archived",
        job=record.id,
        state=record.state.value,
        folder=target.name,
        reason=reason,
        checkpoint=record.checkpoint if carried else None,
    )
    return target


def archive_checkpoint(root: Root, name: str) -> Path | None:
    """Move the checkpoint directory ``name`` that no job holds to ``ROOT/archive/checkpoints/``;
    returns where it went, or None when there is no such directory.

    Raises OSError when the move cannot be made (the directory then stays).
    """
    source = root.checkpoints / name
    if not is_directory(source):
        return None
    folder = folder_of(root) / CHECKPOINTS
    rootcheck.make_folder(folder_of(root))
    rootcheck.make_folder(folder)
    target = free_place(folder, name, time.time())
    os.rename(source, target)
    fsync_dir(folder)
    fsync_dir(root.checkpoints)
    log.info("checkpoint.archived", checkpoint=name, folder=f"{CHECKPOINTS}/{target.name}")
    return target


def settled_at(record: JobRecord) -> float:
    """When the job came to rest: its last transition's time."""
    return float(record.history[-1]["time"]) if record.history else record.updated


def retain(
    root: Root,
    table: JobTable,
    held: Container[str],
    keep: int | None,
    max_age_s: float | None = None,
    *,
    now: float | None = None,
) -> list[str]:
    """Archive the oldest completed and cancelled jobs beyond ``keep``, and those settled
    more than ``max_age_s`` ago, unless a supervisor still ``held`` them; returns their ids.

    Failed and escalated jobs are never archived automatically: they wait for
    a person, and `status` keeps saying so until one decides.
    """
    if keep is None and max_age_s is None:
        return []
    done = sorted(
        (r for r in table if r.state in TERMINAL and r.id not in held),
        key=settled_at,
    )
    now = time.time() if now is None else now
    chosen: list[tuple[JobRecord, str]] = []
    for index, record in enumerate(done):
        if keep is not None and index < len(done) - keep:
            chosen.append((record, f"retention: --keep-finished {keep}"))
        elif max_age_s is not None and now - settled_at(record) > max_age_s:
            chosen.append((record, f"retention: --keep-finished-days {max_age_s / DAY_S:g}"))
    moved = []
    for record, reason in chosen:
        try:
            archive_job(root, table, record, reason)
        except OSError as error:
            log.error("job.archive_failed", job=record.id, error=str(error))
            break
        moved.append(record.id)
    return moved


def rows(root: Root) -> list[dict[str, Any]]:
    """Every archived job, oldest archived first (reads files: run it in a thread)."""
    archive = folder_of(root)
    found = []
    for folder in sorted(archive.iterdir()) if archive.is_dir() else []:
        if folder.name == CHECKPOINTS:  # checkpoint directories archived without a job
            continue
        try:
            state = json.loads((folder / "state.json").read_text())
            note = json.loads((folder / NOTE).read_text())
        except (OSError, ValueError) as error:
            found.append({"folder": folder.name, "archived": None, "error": str(error)})
            continue
        found.append(
            {
                "id": state.get("id"),
                "state": state.get("state"),
                "reason": state.get("reason"),
                "attempt": state.get("attempt"),
                "step": state.get("step"),
                "steps": state.get("steps"),
                "task": state.get("task"),
                "checkpoint": state.get("checkpoint"),
                "incidents": state.get("incidents", []),
                "archived": note.get("archived"),
                "archived_reason": note.get("reason"),
                "folder": folder.name,
            }
        )
    return sorted(found, key=lambda row: row["archived"] or 0)


REMOVABLE = SETTLED
"""What `remove` takes: completed, cancelled, failed or escalated."""
