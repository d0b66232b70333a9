"""A private wardend for a caller: started on a root, fed job files, asked, stopped.

The tests, the benchmarks and the drills all need a real daemon they own: ``python -m
jobwarden.daemon`` on a root of their own, ready once its control socket answers with
the pid they started, fed job files the Maildir way (written in ``spool/tmp``, renamed
into ``spool/incoming``), asked over the socket, and stopped by signalling that pid.
`Wardend` is that one way; a caller subclasses it for what only it needs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, ClassVar, Self

from jobwarden.control import client
from jobwarden.control.client import DaemonBusy, DaemonUnreachable
from jobwarden.jobfolder import EVENTS_FILE, attempt_folder
from jobwarden.protocol import ControlError
from jobwarden.states import SETTLED

SETTLED_STATES = tuple(sorted(state.value for state in SETTLED))
"""Where a job rests, the daemon doing nothing more for it on its own: what `Wardend.wait`
waits for unless told otherwise."""
DAEMON = [sys.executable, "-m", "jobwarden.daemon"]
"""The command line of wardend, run by this interpreter."""
Record = dict[str, Any]


class WardendDown(DaemonUnreachable):
    """Raised when a private wardend exited, or never answered, so that the caller learns
    its exit status and where its stderr went; a `DaemonUnreachable`, which wardenctl
    reports as it reports any daemon it cannot reach."""


def toml_value(value: object) -> str:
    """A Python scalar as TOML, so that a job file can be written without a TOML library."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def job_text(
    job_id: str, checkpoint: str | None = None, task: str = "linreg", **sections: Mapping[str, Any]
) -> str:
    """A job file's text (``[name]`` tables from ``sections``), the request callers drop."""
    lines = [f'id = "{job_id}"', f'task = "{task}"']
    if checkpoint:
        lines.append(f'checkpoint = "{checkpoint}"')
    for name, fields in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in fields.items()]
    return "\n".join(lines) + "\n"


def read_records(path: Path) -> list[Record]:
    """The JSON objects of a JSON-lines file another process may still be appending to:
    a line not (yet) whole is skipped, and a file not yet written has none."""
    records: list[Record] = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_bytes().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    records.append(record)
    return records


def private_dir(path: Path) -> Path:
    """A 0700 directory (its parents made, an existing one taken as it is), so that a worker
    accepts it as a compile cache: it refuses one that others can read."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


class Wardend:
    """One wardend process on its own root, so that a test, a benchmark or a drill drives a
    real daemon the way a user does: job files into its spool, requests on its socket.

    ``extra`` goes to wardend as given (``--socket PATH`` there moves the socket);
    ``rescan_interval`` None leaves wardend's default; ``stderr`` (``ROOT.stderr`` beside
    the root unless given) is appended to, or started afresh with ``append_stderr=False``;
    ``env`` replaces this process's environment.  The class attributes are the defaults of
    the timeouts and of the polling interval, which a subclass may change.
    """

    start_timeout_s: ClassVar[float] = 60.0
    wait_timeout_s: ClassVar[float] = 120.0
    stop_timeout_s: ClassVar[float] = 60.0
    poll_s: ClassVar[float] = 0.02

    def __init__(
        self,
        root: Path,
        cache: Path | None = None,
        *extra: str,
        rescan_interval: float | None = 1.0,
        stderr: Path | None = None,
        append_stderr: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.root = root
        self.cache = cache
        self.extra = extra
        self.rescan_interval = rescan_interval
        self.stderr_path = stderr or root.parent / f"{root.name}.stderr"
        self.append_stderr = append_stderr
        self.env = None if env is None else dict(env)
        given = list(extra)
        named = given.index("--socket") + 1 if "--socket" in given else None
        self.socket = root / "control.sock" if named is None else Path(given[named])
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def argv(self) -> list[str]:
        """The daemon's command line."""
        argv = [*DAEMON, "--root", str(self.root)]
        if self.rescan_interval is not None:
            argv += ["--rescan-interval", f"{self.rescan_interval:g}"]
        argv += self.extra
        if self.cache is not None:
            argv += ["--compile-cache", str(self.cache)]
        return argv

    def launch(self) -> subprocess.Popen[bytes]:
        """Start the process without waiting for it (the root made, private, if missing)."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(mode=0o700, exist_ok=True)
        with self.stderr_path.open("ab" if self.append_stderr else "wb") as err:
            self.proc = subprocess.Popen(
                self.argv(), stdout=subprocess.DEVNULL, stderr=err, env=self.env
            )
        self.starts += 1
        return self.proc

    def start_or_exit(self, timeout: float | None = None) -> int | None:
        """Start wardend; None once it answers, or its exit status if it exits first (a
        daemon refusing its root, say).  Raises `WardendDown` if it neither answers nor
        exits within ``timeout`` s."""
        limit = self.start_timeout_s if timeout is None else timeout
        proc = self.launch()
        deadline = time.monotonic() + limit
        last: object = "nothing"
        while True:
            if proc.poll() is not None:
                return proc.returncode
            try:
                if self.ask("version", timeout=2)["pid"] == proc.pid:
                    return None
                last = "another daemon's answer"
            except (DaemonUnreachable, DaemonBusy, ControlError, OSError) as error:
                last = error
            if time.monotonic() > deadline:
                raise WardendDown(
                    f"wardend on {self.root} not answering on {self.socket} within {limit:g} s"
                    f" (last: {last}); its stderr is in {self.stderr_path}",
                    stderr=str(self.stderr_path),
                )
            time.sleep(self.poll_s)

    def start(self, timeout: float | None = None) -> Self:
        """Start wardend and wait until it answers on its socket; raises `WardendDown` if it
        exits or stays silent."""
        status = self.start_or_exit(timeout)
        if status is not None:
            raise WardendDown(
                f"wardend on {self.root} exited with {status}; its stderr is in {self.stderr_path}",
                exit_status=status,
                stderr=str(self.stderr_path),
            )
        return self

    @property
    def pid(self) -> int:
        """The pid of the daemon this harness started."""
        assert self.proc is not None, "the daemon was never started"
        return self.proc.pid

    def alive(self) -> bool:
        """Whether the daemon this harness started still runs."""
        return self.proc is not None and self.proc.poll() is None

    def ask(self, cmd: str, timeout: float = 10.0, **args: Any) -> Any:
        """One control request, answered or raised as wardenctl would see it."""
        return client.request(self.socket, cmd, timeout=timeout, **args)

    def status(self, job: str) -> Record | None:
        """``status JOB``, or None while the daemon does not know the job."""
        try:
            found: Record = self.ask("status", job=job)
        except ControlError as error:
            if error.code == "control.no_such_job":
                return None
            raise
        return found

    def wait(
        self, job: str, states: Collection[str] = SETTLED_STATES, timeout: float | None = None
    ) -> Record:
        """Poll ``status JOB`` until the job is in one of ``states``, and return that status.

        A job not yet known or a busy daemon count as "not yet"; raises `WardendDown` if the
        daemon this harness started exits, TimeoutError naming the last status after
        ``timeout`` s.
        """
        limit = self.wait_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + limit
        last: object = None
        while True:
            try:
                last = self.status(job)
            except (DaemonBusy, DaemonUnreachable) as error:
                last = error
            if isinstance(last, dict) and last["state"] in states:
                return last
            if self.proc is not None and self.proc.poll() is not None:
                raise WardendDown(
                    f"wardend on {self.root} exited with {self.proc.returncode} while job"
                    f" {job} was awaited; its stderr is in {self.stderr_path}",
                    exit_status=self.proc.returncode,
                    stderr=str(self.stderr_path),
                )
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"job {job} not in {sorted(states)} within {limit:g} s: {last!r:.300}"
                )
            time.sleep(self.poll_s)

    def drop(self, name: str, data: str | bytes) -> Path:
        """Write a request in spool/tmp and rename it into spool/incoming, as a user's tool
        would, so that the daemon never sees half a file; returns where it landed."""
        tmp = self.root / "spool" / "tmp" / name
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        target = self.root / "spool" / "incoming" / name
        os.rename(tmp, target)
        return target

    def job_folder(self, job: str) -> Path:
        """jobs/<id>, where the daemon keeps the job's evidence."""
        return self.root / "jobs" / job

    def attempt_folder(self, job: str, attempt: int) -> Path:
        """jobs/<id>/attempts/<n>, one worker attempt's evidence."""
        return attempt_folder(self.job_folder(job), attempt)

    def events(self, job: str, attempt: int) -> list[Record]:
        """The worker events of one attempt so far (none while it has written none)."""
        return read_records(self.attempt_folder(job, attempt) / EVENTS_FILE)

    def kill(self) -> None:
        """SIGKILL the daemon and reap it, to leave its root as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()

    def stop(self, sig: int = signal.SIGTERM, timeout: float | None = None) -> int | None:
        """Signal the daemon (SIGTERM: stop cleanly) and wait for it, SIGKILLing it past
        ``timeout`` s; returns its exit status, None if it was never started."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(self.stop_timeout_s if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
