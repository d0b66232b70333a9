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
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jobwarden.errors import JobwardenError
from jobwarden.files import pid_lock


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

    def create(self) -> None:
        """Create every folder (the root itself 0700 unless it exists)."""
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        for folder in (
            self.spool_tmp,
            self.incoming,
            self.claimed,
            self.rejected,
            self.jobs,
            self.checkpoints,
        ):
            folder.mkdir(parents=True, exist_ok=True)
        self.cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.cache.chmod(0o700)

    def lock(self) -> int:
        """Take the root lock; raises `RootLockedError` naming the pid that holds it."""
        fd, holder = pid_lock(self.path / "wardend.lock")
        if fd is None:
            raise RootLockedError(
                f"another wardend (pid {holder or '?'}) already runs on {self.path}",
                root=str(self.path),
                holder_pid=holder,
            )
        return fd
