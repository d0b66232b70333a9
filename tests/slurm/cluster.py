"""A real single-node Slurm for the tests: munged, slurmctld and slurmd on loopback.

Everything lives under one base folder of its own (config, state, spool, logs,
the munge key and socket: munged wants every folder above its socket searchable
by all, so the base is made with `tempfile` rather than under pytest's private
tmp) on free ports, so two test processes (pytest -n 2)
or another user's cluster on the same box do not meet.  The daemons are
started in their own sessions and stopped by pid: SIGTERM, then SIGKILL after
`STOP_WAIT_S`.  Settings that make it fast are in ``slurm.conf.in``:
``batch_sched_delay=0`` and ``sched_interval=1``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

TEMPLATE = Path(__file__).with_name("slurm.conf.in")
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
PROGRAMS = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "munged", "munge")
START_TIMEOUT_S = 30.0
STOP_WAIT_S = 10.0
CRED_EXPIRE_S = 5
IDLE = "idle\n"


class Unavailable(Exception):
    """Raised when Slurm is not installed and cannot be installed here; says why."""


def missing_programs() -> list[str]:
    """The Slurm and munge programs not on PATH."""
    return [name for name in PROGRAMS if shutil.which(name) is None]


def ensure_installed(lock: Path) -> None:
    """Install Slurm's Debian packages with apt-get when a program is missing, quietly.

    ``lock`` serialises the install between test processes.  Raises
    `Unavailable` naming what failed when they cannot be installed.
    """
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not missing_programs():
            return
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise Unavailable(f"{missing_programs()} missing and apt-get cannot run as root here")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        steps = [
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
        ]
        for argv in steps:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                tail = (done.stderr or done.stdout)[-800:]
                raise Unavailable(f"{' '.join(argv)} exited {done.returncode}: {tail}")
        if missing_programs():
            raise Unavailable(f"still missing after the install: {missing_programs()}")


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Cluster:
    """One running single-node cluster; `env` is what a Slurm client needs to reach it."""

    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="jobwarden-slurm-")))
    host: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    started_s: float = 0.0

    @property
    def conf(self) -> Path:
        """The generated slurm.conf."""
        return self.base / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment of a Slurm client of this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @property
    def jobcomp(self) -> Path:
        """One line per finished Slurm job (jobcomp/filetxt)."""
        return self.base / "log" / "jobcomp.log"

    def run(self, *argv: str, check: bool = True) -> str:
        """Run a Slurm client command against this cluster; its stdout."""
        return run_client(self.env, argv, check)

    def start(self) -> Cluster:
        """munged, then slurmctld, then slurmd; returns once the node is idle."""
        began = time.monotonic()
        self.base.chmod(0o755)
        for sub in ("etc", "run", "log", "state", "spool", "munge"):
            (self.base / sub).mkdir(mode=0o755, parents=True, exist_ok=True)
        munge = self.base / "munge"
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        sock = munge / "munge.socket"
        self._spawn(
            "munged",
            "munged",
            "--foreground",
            f"--key-file={key}",
            f"--socket={sock}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--log-file={self.base / 'log' / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        )
        self._wait("munged", lambda: self._ok("munge", "-n", "-S", str(sock)))
        self.conf.write_text(
            TEMPLATE.read_text().format(
                host=self.host,
                base=self.base,
                ctld_port=free_port(),
                slurmd_port=free_port(),
                cred_expire=CRED_EXPIRE_S,
                cpus=os.cpu_count() or 1,
                memory_mb=1000,
            )
        )
        self._spawn("slurmctld", "slurmctld", "-D", "-f", str(self.conf))
        self._wait("slurmctld", lambda: self._ok("scontrol", "ping"))
        self._spawn("slurmd", "slurmd", "-D", "-f", str(self.conf))
        self._wait("node idle", lambda: self.run("sinfo", "-h", "-o", "%T", check=False) == IDLE)
        self.started_s = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Cancel every job, then stop slurmd, slurmctld and munged by pid."""
        if "slurmctld" in self.procs:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                jobs = self.run("squeue", "-h", "-o", "%i").split()
                if jobs:
                    self.run("scancel", *jobs, check=False)
                    self._wait("no jobs", lambda: not self.run("squeue", "-h", "-o", "%i").strip())
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                stop_process(proc)
        shutil.rmtree(self.base, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        """The ends of the daemons' logs, for a failure message."""
        parts = []
        for path in sorted((self.base / "log").glob("*")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"== {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def _spawn(self, name: str, *argv: str) -> None:
        with (self.base / "log" / f"{name}.out").open("wb") as out:
            proc = subprocess.Popen(
                argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[name] = proc

    def _ok(self, *argv: str) -> bool:
        done = subprocess.run(argv, env=self.env, capture_output=True, timeout=10, check=False)
        return done.returncode == 0

    def _wait(self, what: str, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            dead = [name for name, proc in self.procs.items() if proc.poll() is not None]
            if dead:
                raise RuntimeError(f"{what}: {dead} exited\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not within {START_TIMEOUT_S} s\n{self.log_tail()}")
            time.sleep(0.05)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM its pid, wait up to `STOP_WAIT_S` for it to be reaped, then SIGKILL it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_client(env: dict[str, str], argv: tuple[str, ...], check: bool) -> str:
    """Run a Slurm client command with a cluster's environment; its stdout (RuntimeError
    naming the command and its stderr when it fails and ``check``)."""
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr}")
    return done.stdout
