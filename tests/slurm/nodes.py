"""A real Slurm of several nodes for the tests, brought up by the repo's own ``slurm/cluster.sh``.

The script `make slurm-up` runs, with settings of its own: a base folder made with
`tempfile` (munged wants every folder above its socket searchable by all), a name
for its namespaces, bridge and veths and a /24 taken from this process's pid, and
free ports, so neither the suite's one-node cluster, another test process's
cluster, nor a developer's ``make slurm-up`` meet it.  ``cluster.sh down`` stops
its daemons by pid and removes the namespaces.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.slurm.cluster import free_port, run_client

SCRIPT = Path(__file__).parents[2] / "slurm" / "cluster.sh"
UP_TIMEOUT_S = 120.0


def _name() -> str:
    """A prefix of this process's own for the namespaces (an interface name holds 15 bytes)."""
    return f"jt{os.getpid() % 100000}"


def _net() -> str:
    """A /24 of this process's own, away from the ``make slurm-up`` default (10.231.0)."""
    pid = os.getpid()
    return f"10.{232 + (pid // 256) % 20}.{pid % 256}"


@dataclass
class Nodes:
    """A running cluster of `count` nodes ``n1``..``nN``; `env` is a Slurm client's."""

    count: int = 3
    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="jobwarden-nodes-")))
    name: str = field(default_factory=_name)
    net: str = field(default_factory=_net)

    @property
    def conf(self) -> Path:
        """The generated slurm.conf."""
        return self.base / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment of a Slurm client of this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def namespace(self, node: str) -> str:
        """The network namespace node ``n<i>`` runs in."""
        return f"{self.name}n{node.removeprefix('n')}"

    def run(self, *argv: str, check: bool = True) -> str:
        """Run a Slurm client command against this cluster; its stdout."""
        return run_client(self.env, argv, check)

    def start(self) -> Nodes:
        """``cluster.sh up``; returns once every node is idle, raises with its output if not."""
        self.base.chmod(0o755)
        done = self._script("up", UP_TIMEOUT_S)
        if done.returncode != 0 or f"export SLURM_CONF={self.conf}" not in done.stdout:
            self.stop()
            raise RuntimeError(f"cluster.sh up exited {done.returncode}: {done.stderr[-2000:]}")
        return self

    def stop(self) -> None:
        """``cluster.sh down`` (by pid), then the base folder."""
        self._script("down", 60)
        shutil.rmtree(self.base, ignore_errors=True)

    def pids(self, node: str) -> list[int]:
        """Every process in node ``node``'s network namespace (its slurmd and job steps)."""
        out = subprocess.run(
            ["ip", "netns", "pids", self.namespace(node)],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        return [int(pid) for pid in out.split()]

    def fail(self, node: str) -> list[int]:
        """SIGKILL every process of node ``node`` (its slurmd and the steps on it): the node
        is lost as a machine is; the pids killed."""
        pids = self.pids(node)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def restart(self, node: str) -> None:
        """Start node ``node``'s slurmd again; returns once every node is idle."""
        done = self._script("restart-node", UP_TIMEOUT_S, node.removeprefix("n"))
        if done.returncode != 0:
            raise RuntimeError(f"cluster.sh restart-node {node}: {done.stderr[-2000:]}")

    def _script(self, action: str, timeout: float, *args: str) -> subprocess.CompletedProcess[str]:
        settings = {
            "NODES": str(self.count),
            "BASE": str(self.base),
            "NAME": self.name,
            "NET": self.net,
            "CTLD_PORT": str(free_port()),
            "SLURMD_PORT": str(free_port()),
        }
        return subprocess.run(
            [str(SCRIPT), action, *args],
            env={**os.environ, **settings},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
