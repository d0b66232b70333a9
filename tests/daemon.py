"""A real wardend on a temporary root, driven the way users drive it: by dropping files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from jobwarden.control import client
from jobwarden.control.client import DaemonUnreachable
from jobwarden.protocol import ControlError
from jobwarden.states import SETTLED, JobState
from tests.helpers import toml_value, wait_until

SETTLED_STATES = tuple(sorted(state.value for state in SETTLED))
"""Where a job rests: the states `Daemon.wait` waits for unless told otherwise."""
ANY_STATE = tuple(state.value for state in JobState)
"""Every state: waiting for one of them waits until the daemon has accepted the job."""

WARDENCTL = [sys.executable, "-m", "jobwarden.control.cli"]
"""The command line of wardenctl, run by this interpreter."""


def ctl(daemon: Daemon, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """wardenctl --root ROOT ARGS."""
    return subprocess.run(
        [*WARDENCTL, "--root", str(daemon.root), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class Daemon:
    """One wardend process; `drop` submits a job file, `wait` polls its state over the socket."""

    def __init__(self, root: Path, cache: Path | None = None, *extra: str) -> None:
        self.root = root
        self.cache = cache
        self.extra = extra
        given = list(extra)
        self.socket = (
            Path(given[given.index("--socket") + 1])
            if "--socket" in given
            else root / "control.sock"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30) -> Daemon:
        """Start wardend and wait until its control socket answers."""
        argv = [
            sys.executable,
            "-m",
            "jobwarden.daemon",
            "--root",
            str(self.root),
            "--rescan-interval",
            "1",
            *self.extra,
        ]
        if self.cache is not None:
            argv += ["--compile-cache", str(self.cache)]
        self.root.parent.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(mode=0o700, exist_ok=True)
        stderr = self.root.parent / f"{self.root.name}.stderr"
        with stderr.open("ab") as err:
            proc = self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)

        def version() -> Any:
            if proc.poll() is not None:
                raise RuntimeError(f"wardend exited with {proc.returncode}; see {stderr}")
            return self.ask("version")

        wait_until(
            version,
            timeout=timeout,
            what=f"wardend answering on {self.socket}",
            retry=(DaemonUnreachable, OSError),
        )
        return self

    def ask(self, cmd: str, **args: Any) -> Any:
        """One control request."""
        return client.request(self.socket, cmd, **args)

    def drop(self, name: str, text: str | bytes) -> Path:
        """Write a request in spool/tmp and rename it into spool/incoming."""
        tmp = self.root / "spool" / "tmp" / name
        tmp.write_bytes(text.encode() if isinstance(text, str) else text)
        target = self.root / "spool" / "incoming" / name
        os.rename(tmp, target)
        return target

    def state(self, job: str) -> dict[str, Any]:
        """The job's detail status."""
        result: dict[str, Any] = self.ask("status", job=job)
        return result

    def wait(
        self, job: str, states: tuple[str, ...] = SETTLED_STATES, timeout: float = 120
    ) -> dict[str, Any]:
        """Poll until the job reaches one of ``states``; returns its status."""
        return wait_until(
            lambda: self.state(job),
            lambda status: status["state"] in states,
            timeout=timeout,
            what=f"job {job} in one of {states}",
            retry=(ControlError,),
        )

    def incidents(self, job: str) -> list[dict[str, Any]]:
        """The job's incident records."""
        result: list[dict[str, Any]] = self.ask("incidents", job=job)
        return result

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Signal the daemon and wait for it; returns its exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def job_folder(self, job: str) -> Path:
        """jobs/<id>."""
        return self.root / "jobs" / job

    def events(self, job: str, attempt: int) -> list[dict[str, Any]]:
        """Parsed events of one attempt."""
        path = self.job_folder(job) / "attempts" / str(attempt) / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def __enter__(self) -> Daemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def linreg_job(job_id: str, checkpoint: str | None = None, **sections: dict[str, Any]) -> str:
    """A linreg job file's text with the lesson's training fields."""
    lines = [f'id = "{job_id}"', 'task = "linreg"']
    if checkpoint:
        lines.append(f'checkpoint = "{checkpoint}"')
    for name, fields in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in fields.items()]
    return "\n".join(lines) + "\n"
