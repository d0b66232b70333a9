"""The Slurm launcher: each attempt is one Slurm batch job whose script runs the worker by srun.

``wardend --launcher slurm`` submits every attempt with ``sbatch --parsable``,
named ``jw-<job>-<attempt>``.  Its batch script (``slurm.sh`` in the attempt
folder) runs ``srun`` of the very argv the local launcher would exec, with
the worker's stdout in ``events.jsonl`` and its stderr in ``stderr.log``, and
records srun's exit status in ``slurm.exit``.  The daemon follows those files
by polling (the folder is on a shared filesystem, where inotify sees nothing
a remote node writes) and the job's state with ``scontrol -o show job``
every `STATE_POLL_S` (no slurmdbd needed); `slurmstate` says what each state
means.

Signals (measured on Slurm 22.05): a SIGTERM that reaches ``srun`` makes it
abort the step and SIGKILL the worker before it can commit, so nothing here
signals the batch step's processes with SIGTERM.  The script instead traps
SIGTERM and passes it to the job's steps (``scancel --signal=TERM``), where the
worker commits and exits 75.  The job carries ``--signal=B:TERM@<lead>``, so
Slurm's own time limit takes that path, and so does the daemon's stop
(``scancel --batch --signal=TERM``, the grace, then ``scancel``).

Settings, from the daemon's environment (``wardend --slurm-*`` sets them):
``JOBWARDEN_SLURM_PARTITION``, ``JOBWARDEN_SLURM_ACCOUNT``,
``JOBWARDEN_SLURM_TIME`` (``--time``), ``JOBWARDEN_SLURM_SIGNAL_S`` (the lead of
the time-limit warning, default 60 s) and ``JOBWARDEN_SLURM_EXTRA`` (more
sbatch options, split as a shell would).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from jobwarden.daemon.evidence import EvidenceFile
from jobwarden.daemon.launcher import (
    LINE_LIMIT,
    ExitInfo,
    Launcher,
    LauncherError,
    LaunchSpec,
    OnEvent,
    OnMalformed,
    RunningAttempt,
    pump,
)
from jobwarden.daemon.slurmstate import Phase, SlurmJob, exit_of
from jobwarden.files import write_text_atomic

log = structlog.get_logger("wardend.slurm")
STATE_POLL_S = 0.5
"""How often the job's state is asked of slurmctld (the issue asks for at most 1 s)."""
FILE_POLL_S = 0.05
"""How often the attempt's event file is read for new lines."""
COMMAND_TIMEOUT_S = 30.0
SCRIPT = "slurm.sh"
EXIT_RECORD = "slurm.exit"
JOB_RECORD = "slurm.json"
ORPHAN_WAIT_S = 60.0
ENV_PREFIX = "JOBWARDEN_SLURM_"
CLIENT_ENV = ("PATH", "SLURM_CONF")
"""Of the daemon's own environment, what sbatch needs on top of the worker's."""


@dataclass(frozen=True)
class SlurmSettings:
    """How attempts are submitted: the sbatch options every attempt gets."""

    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None
    signal_lead_s: int = 60
    extra: tuple[str, ...] = ()

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> SlurmSettings:
        """The settings in ``JOBWARDEN_SLURM_*``; raises `LauncherError` on a bad one."""

        def get(name: str) -> str | None:
            return env.get(ENV_PREFIX + name) or None

        try:
            lead = int(get("SIGNAL_S") or 60)
            extra = tuple(shlex.split(get("EXTRA") or ""))
        except ValueError as error:
            raise LauncherError(f"bad {ENV_PREFIX}* setting: {error}") from error
        return cls(get("PARTITION"), get("ACCOUNT"), get("TIME"), lead, extra)

    def sbatch_options(self, spec: LaunchSpec) -> list[str]:
        """The options of one attempt's sbatch."""
        options = [
            "--parsable",
            f"--job-name=jw-{spec.job_id}-{spec.attempt}",
            f"--ntasks={spec.processes}",
            f"--signal=B:TERM@{self.signal_lead_s}",
            f"--output={spec.folder / 'slurm.log'}",
            "--open-mode=append",
            f"--chdir={spec.cwd or spec.folder}",
            "--export=ALL",
        ]
        options += [f"--partition={self.partition}"] if self.partition else []
        options += [f"--account={self.account}"] if self.account else []
        options += [f"--time={self.time_limit}"] if self.time_limit else []
        return options + list(self.extra)


def batch_script(spec: LaunchSpec) -> str:
    """The batch script of one attempt: srun of the worker, SIGTERM passed to its step, and
    srun's exit status recorded.  A job Slurm requeued runs it again: it then exits 75 at
    once, since jobwarden starts the next attempt itself."""
    folder = spec.folder
    srun = [
        "srun",
        f"--ntasks={spec.processes}",
        "--input=none",
        f"--output={folder / spec.stdout}",
        f"--error={folder / 'stderr.log'}",
        *spec.argv,
    ]
    exit_record = shlex.quote(str(folder / EXIT_RECORD))
    return f"""#!/bin/bash
# jobwarden: attempt {spec.attempt} of job {spec.job_id}
umask 077
if [ "${{SLURM_RESTART_COUNT:-0}}" != 0 ]; then
    echo "jobwarden: requeued by Slurm; the daemon starts the next attempt" >&2
    exit 75
fi
trap 'scancel --signal=TERM "$SLURM_JOB_ID"' TERM
{shlex.join(srun)} &
child=$!
while :; do
    wait "$child"; status=$?
    kill -0 "$child" 2>/dev/null || break
done
printf '%s\\n' "$status" > {exit_record}.tmp && mv {exit_record}.tmp {exit_record}
exit "$status"
"""


async def slurm_command(*argv: str) -> tuple[int, str, str]:
    """Run one Slurm client command; its status, stdout and stderr (never raises for it)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), COMMAND_TIMEOUT_S)
    except (OSError, TimeoutError) as error:
        return 127, "", f"{argv[0]}: {error}"
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


async def query(job_id: str) -> SlurmJob | None:
    """The job's state from ``scontrol -o show job``; None once Slurm no longer knows it.

    Raises `LauncherError` when slurmctld does not answer (the caller keeps polling)."""
    status, out, err = await slurm_command("scontrol", "-o", "show", "job", job_id)
    if status != 0:
        if "Invalid job id" in err:
            return None
        raise LauncherError(f"scontrol show job {job_id}: {err.strip()}", slurm_job=job_id)
    try:
        return SlurmJob.from_show(out.strip().splitlines()[0])
    except (ValueError, IndexError) as error:
        raise LauncherError(str(error), slurm_job=job_id) from error


class _FollowedFile(EvidenceFile):
    """The worker writes its own event file on the node; `pump` must not write it again."""

    def write(self, data: bytes) -> None:
        """Nothing to keep: the bytes are already in the file."""


@dataclass
class _Progress:
    job: SlurmJob | None = None
    started: bool = False
    callbacks: list[Callable[[], None]] = field(default_factory=list)


class SlurmAttempt(RunningAttempt):
    """One attempt as one Slurm job, followed through its files and scontrol."""

    def __init__(self, spec: LaunchSpec, job_id: str) -> None:
        super().__init__(spec)
        self.events = _FollowedFile(spec.folder / spec.stdout)
        self.job_id = job_id
        self.submitted_mono = time.monotonic()
        self.started_mono: float | None = None
        self._progress = _Progress()
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def pid(self) -> int | None:
        """The worker runs on a node: the daemon holds no pid of it."""
        return None

    @property
    def slurm(self) -> SlurmJob | None:
        """The job's state as last polled."""
        return self._progress.job

    def when_started(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the job has left the queue (the startup watch starts then)."""
        if self._progress.started:
            callback()
        else:
            self._progress.callbacks.append(callback)

    def _mark_started(self) -> None:
        if self._progress.started:
            return
        self._progress.started = True
        self.started_mono = time.monotonic()
        log.info(
            "slurm.started",
            job=self.spec.job_id,
            slurm_job=self.job_id,
            pending_s=round(self.started_mono - self.submitted_mono, 3),
        )
        for callback in self._progress.callbacks:
            callback()
        self._progress.callbacks.clear()

    def sample(self) -> dict[str, Any]:
        """The Slurm job id, state and reason (``PD (Resources)``): what status shows."""
        job = self._progress.job
        state = job.describe() if job is not None else "submitted"
        started = self.started_mono
        return {
            "status": f"slurm {self.job_id} {state}",
            "slurm_job": self.job_id,
            "slurm_state": job.state if job is not None else None,
            "slurm_reason": job.reason if job is not None else None,
            "node": job.node if job is not None else None,
            "pending_s": round((started or time.monotonic()) - self.submitted_mono, 3),
        }

    async def follow(self, on_event: OnEvent, on_malformed: OnMalformed) -> ExitInfo:
        """Feed the event file's new bytes to `pump` and poll the job until it ends."""
        reader = asyncio.StreamReader(limit=LINE_LIMIT)
        pumping = asyncio.create_task(pump(reader, self.events, on_event, on_malformed))
        path, offset, next_poll = self.spec.folder / self.spec.stdout, 0, 0.0
        job: SlurmJob | None = None
        while True:
            offset = self._feed(path, offset, reader)
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + STATE_POLL_S
                try:
                    job = self._progress.job = await query(self.job_id)
                except LauncherError as error:
                    log.warning("slurm.poll_failed", slurm_job=self.job_id, error=str(error))
                    continue
                if job is None or job.phase is not Phase.QUEUED:
                    self._mark_started()
                if job is None or job.phase in (Phase.ENDED, Phase.REQUEUED):
                    break
            await asyncio.sleep(FILE_POLL_S)
        if job is not None and job.phase is Phase.REQUEUED:
            await slurm_command("scancel", self.job_id)  # the next attempt is ours to start
        self._feed(path, offset, reader)
        reader.feed_eof()
        await pumping
        ended = exit_of(job, self._script_status())
        log.info("slurm.ended", slurm_job=self.job_id, status=ended.status, why=ended.why)
        duration = time.monotonic() - (self.started_mono or self.submitted_mono)
        return self._ended(ExitInfo(ended.status, ended.signal, duration))

    def _feed(self, path: Path, offset: int, reader: asyncio.StreamReader) -> int:
        """Give ``reader`` what the worker appended since ``offset``; the new offset."""
        try:
            with path.open("rb") as stream:
                stream.seek(offset)
                while chunk := stream.read(1 << 16):
                    if not self._progress.started:
                        self._mark_started()  # a line before the poll saw RUNNING
                    reader.feed_data(chunk)
                    offset += len(chunk)
        except FileNotFoundError:
            pass
        except OSError as error:
            log.warning("slurm.events_unreadable", file=str(path), error=str(error))
        return offset

    def _script_status(self) -> int | None:
        try:
            return int((self.spec.folder / EXIT_RECORD).read_text().strip())
        except (OSError, ValueError):
            return None

    def _scancel(self, *options: str) -> None:
        task = asyncio.get_running_loop().create_task(
            slurm_command("scancel", *options, self.job_id)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the job's steps (the worker), never to srun."""
        if self.exit_info is None:
            self._scancel(f"--signal={signal.Signals(signum).name.removeprefix('SIG')}")

    def kill(self) -> None:
        """SIGKILL everything of the job, then cancel it (a pending one included)."""
        if self.exit_info is None:
            self._scancel("--full", "--signal=KILL")
            self._scancel()

    async def stop(self, grace_s: float) -> None:
        """SIGTERM through the batch script's trap (the path of Slurm's time limit), up to
        ``grace_s`` for the worker to commit, then `kill`; a job still queued is cancelled."""
        job = self._progress.job
        queued = job.phase is Phase.QUEUED if job is not None else not self._progress.started
        if queued:
            self.kill()
        elif self.exit_info is None:
            await slurm_command("scancel", "--batch", "--signal=TERM", self.job_id)
        try:
            await asyncio.wait_for(self.ended.wait(), grace_s)
        except TimeoutError:
            self.kill()
            await self.ended.wait()


class SlurmLauncher(Launcher):
    """Submits each attempt as one Slurm batch job."""

    name = "slurm"

    def __init__(self, settings: SlurmSettings | None = None) -> None:
        self.settings = settings or SlurmSettings.from_environment(os.environ)

    async def start(self, spec: LaunchSpec) -> SlurmAttempt:
        """Write the batch script and submit it; raises `LauncherError` when sbatch refuses."""
        spec.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        await self._end_earlier_attempts(spec)
        script = spec.folder / SCRIPT
        write_text_atomic(script, batch_script(spec))
        script.chmod(0o700)
        env = {**spec.env, **{k: os.environ[k] for k in CLIENT_ENV if k in os.environ}}
        argv = ["sbatch", *self.settings.sbatch_options(spec), str(script)]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
            out, err = await asyncio.wait_for(proc.communicate(), COMMAND_TIMEOUT_S)
        except (OSError, TimeoutError) as error:
            raise LauncherError(f"sbatch could not run: {error}", argv=argv) from error
        job_id = out.decode().strip().split(";")[0]
        if proc.returncode != 0 or not job_id.isdigit():
            raise LauncherError(
                f"sbatch exited {proc.returncode}: {err.decode(errors='replace').strip()}",
                argv=argv,
            )
        record = {"slurm_job": job_id, "submitted": time.time(), "sbatch": argv}
        write_text_atomic(spec.folder / JOB_RECORD, json.dumps(record, indent=2) + "\n")
        log.info("slurm.submitted", job=spec.job_id, attempt=spec.attempt, slurm_job=job_id)
        return SlurmAttempt(spec, job_id)

    async def _end_earlier_attempts(self, spec: LaunchSpec) -> None:
        """After the daemon's restart an earlier attempt's Slurm job may still run: it is
        stopped as the local launcher stops an orphan (SIGTERM, it commits, it leaves) and
        waited for, so no two attempts of the job run at once."""
        for record in sorted(spec.folder.parent.glob(f"*/{JOB_RECORD}")):
            if record.parent == spec.folder:
                continue
            with contextlib.suppress(OSError, ValueError, KeyError, LauncherError):
                job_id = str(json.loads(record.read_text())["slurm_job"])
                job = await query(job_id)
                if job is None or job.phase is Phase.ENDED:
                    continue
                log.warning("slurm.orphan", job=spec.job_id, slurm_job=job_id)
                await slurm_command("scancel", "--batch", "--signal=TERM", job_id)
                deadline = time.monotonic() + ORPHAN_WAIT_S
                while time.monotonic() < deadline:
                    job = await query(job_id)
                    if job is None or job.phase is not Phase.RUNNING:
                        break
                    await asyncio.sleep(STATE_POLL_S)
                await slurm_command("scancel", job_id)
