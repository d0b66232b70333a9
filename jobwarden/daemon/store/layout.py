"""The daemon's root folder: where everything lives, and the one-daemon-per-root lock.

ROOT/wardend.lock            flock held by the running daemon (its pid inside)
ROOT/wardend.log             the daemon's structlog JSON lines
ROOT/control.sock            the control socket (unless --socket says otherwise)
ROOT/incidents.jsonl         every incident record, all jobs
ROOT/spool/tmp/              writers create request files here ...
ROOT/spool/incoming/         ... and rename them in here
ROOT/spool/claimed/          a request the daemon has claimed and is validating
ROOT/spool/rejected/         refused requests, each beside <name>.error.json
ROOT/jobs/<id>/              state.json, request.*, job.json, attempts/<n>/, incidents/
ROOT/checkpoints/<name>/     checkpoint directories, by name
ROOT/cache/jax/              the workers' private compilation cache (0700)

The daemon refuses a root it cannot trust (`rootcheck`): the root and every
folder above it and in it that it uses must be safe from other users, and the
files it writes there are opened without following links.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from jobwarden.daemon.store import rootcheck
from jobwarden.daemon.store.rootcheck import RootUnsafeError
from jobwarden.errors import JobwardenError
from jobwarden.files import Directory, UnsafePathError
from jobwarden.jobfolder import attempt_folder

__all__ = ["Root", "RootLockedError", "RootUnsafeError"]


class RootLockedError(JobwardenError):
    """Raised when another daemon already runs on this root."""

    code = "daemon.root_locked"
    exit_status = 73


@dataclass(frozen=True)
class Root:
    """Paths under one daemon root."""

    path: Path

    @property
    def spool_tmp(self) -> Path:
        """Where writers create requests."""
        return self.path / "spool" / "tmp"

    @property
    def incoming(self) -> Path:
        """Where complete requests are renamed in."""
        return self.path / "spool" / "incoming"

    @property
    def claimed(self) -> Path:
        """Requests claimed and being validated."""
        return self.path / "spool" / "claimed"

    @property
    def rejected(self) -> Path:
        """Refused requests and their error files."""
        return self.path / "spool" / "rejected"

    @property
    def jobs(self) -> Path:
        """One folder per accepted job."""
        return self.path / "jobs"

    @property
    def checkpoints(self) -> Path:
        """Checkpoint directories by name."""
        return self.path / "checkpoints"

    @property
    def cache(self) -> Path:
        """The workers' compilation cache."""
        return self.path / "cache" / "jax"

    @property
    def incidents(self) -> Path:
        """All incident records."""
        return self.path / "incidents.jsonl"

    @property
    def log(self) -> Path:
        """The daemon's log."""
        return self.path / "wardend.log"

    @property
    def socket(self) -> Path:
        """The default control socket."""
        return self.path / "control.sock"

    def job(self, job_id: str) -> Path:
        """The folder of one job."""
        return self.jobs / job_id

    def attempt(self, job_id: str, number: int) -> Path:
        """The evidence folder of one attempt of a job (`jobfolder.attempt_folder`)."""
        return attempt_folder(self.jobs / job_id, number)

    @property
    def lock_file(self) -> Path:
        """The root lock."""
        return self.path / "wardend.lock"

    @property
    def folders(self) -> tuple[Path, ...]:
        """The root and every folder the daemon uses in it, each after its parent."""
        spool, cache = self.path / "spool", self.path / "cache"
        return (
            self.path,
            spool,
            self.spool_tmp,
            self.incoming,
            self.claimed,
            self.rejected,
            self.jobs,
            self.checkpoints,
            cache,
            self.cache,
        )

    def create(self) -> None:
        """Create what is missing (each new folder 0700, the cache tightened to 0700), then
        `check` it all; raises `RootUnsafeError` on anything another user could control."""
        rootcheck.check_ancestors(self.path, missing_ok=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for folder in self.folders:
            rootcheck.make_folder(folder)
        rootcheck.make_private_folder(self.cache)
        self.check()

    def check(self) -> None:
        """Refuse the root unless it, each folder above it and each folder and file the
        daemon uses in it is safe from other users; raises `RootUnsafeError` naming the
        first path that is not, its owner and its mode."""
        rootcheck.check_ancestors(self.path)
        for folder in self.folders:
            rootcheck.check_folder(folder)
        for file in (self.lock_file, self.log, self.incidents):
            rootcheck.check_file(file)

    def lock(self) -> int:
        """Take the root lock and return its descriptor (the caller keeps it open).

        The lock is ``flock`` on the root directory itself, so deleting or
        replacing ``wardend.lock`` hands it to nobody; that file only records the
        holder's pid for the refusal message.  Raises `RootLockedError` naming the
        pid that holds it, or `RootUnsafeError` for a root that is not ours.
        """
        try:
            rootcheck.check_file(self.lock_file)
            directory = Directory.open(self.path)
        except RootUnsafeError:
            raise
        except UnsafePathError as error:
            evidence = {k: v for k, v in error.evidence.items() if k not in ("path", "reason")}
            raise RootUnsafeError(error.path, error.reason, **evidence) from error
        if not directory.try_lock():
            holder = _holder(directory)
            directory.close()
            raise RootLockedError(
                f"another wardend (pid {holder or '?'}) already runs on {self.path}",
                root=str(self.path),
                holder_pid=holder,
            )
        try:
            directory.write_atomic(self.lock_file.name, f"{os.getpid()}\n".encode())
        except (UnsafePathError, OSError):
            directory.close()
            raise
        return directory.fd


def _holder(directory: Directory) -> int | None:
    """The pid recorded in ``wardend.lock``, if it can be read."""
    try:
        text = directory.read_small("wardend.lock", 64).decode(errors="replace").strip()
    except (UnsafePathError, OSError):
        return None
    return int(text) if text.isdigit() else None
