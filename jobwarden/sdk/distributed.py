"""One member of a multi-process job: joining `jax.distributed`, sharing the start, agreeing.

wardend starts the N members of a ``[run] processes = N`` job with
``JOBWARDEN_PROCESS_ID``, ``JOBWARDEN_PROCESSES`` and ``JOBWARDEN_COORDINATOR``
(a loopback ``host:port`` it picked).  On Slurm the coordinator is the first node of the
job's allocation and no one off that node can pick a free port on it, so the member
script names the host alone and a rendezvous file (``JOBWARDEN_COORDINATOR_FILE``, in the
attempt folder every node shares): member 0 binds a free port there and publishes
``host:port``, the others wait for it (`publish_coordinator`, `await_coordinator`).
`Membership.join` joins them with gloo
collectives on CPU.  The training state is replicated (data-parallel: the
gradients are reduced across members), so member 0 alone holds the writer
lock, restores and commits; `Membership.share_start` gives every member
member 0's start state bit for bit, and `Membership.agree` checks before each
commit that every member holds exactly the state being written (docs/multiprocess.md).
A state laid out over the members (sharded) is committed and restored by every member
instead (`jobwarden.shards`), through `Membership.allgather` and `Membership.broadcast`.
"""

from __future__ import annotations

import atexit
import errno
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jobwarden.errors import IncidentKind, JobwardenError
from jobwarden.files import write_text_atomic
from jobwarden.jobfile import FaultSection
from jobwarden.runtime import exit_now

PROCESS_ID_ENV = "JOBWARDEN_PROCESS_ID"
PROCESSES_ENV = "JOBWARDEN_PROCESSES"
COORDINATOR_ENV = "JOBWARDEN_COORDINATOR"
COORDINATOR_FILE_ENV = "JOBWARDEN_COORDINATOR_FILE"
"""Where member 0 publishes ``host:port`` when `COORDINATOR_ENV` names a host alone."""
RPC_BIND_FAILED = "Failed to start RPC server"
"""What JAX's error says when member 0 cannot bind the coordinator's port."""
RENDEZVOUS_POLL_S = 0.05
JOIN_TIMEOUT_S = 300
"""How long `jax.distributed.initialize` waits for every member (wardend's startup
timeout usually ends the attempt first, naming the members that never arrived)."""


class MembersDiverged(JobwardenError):
    """Raised in every member when their state hashes differ at a commit step: the replicas
    are no longer one experiment, so nothing is committed."""

    code = "distributed.diverged"
    exit_status = 36
    incident = IncidentKind.CRASH
    """Nothing was committed, so a restart resumes every member from the last agreed step."""


class CoordinatorUnavailable(JobwardenError):
    """Raised in member 0 when it cannot listen on the coordinator address it was given
    (another process took the port between its choice and the bind): the attempt fails,
    naming the address, and the next attempt gets a port of its own."""

    code = "distributed.coordinator"
    exit_status = 37
    incident = IncidentKind.CRASH


class MembershipError(JobwardenError):
    """Raised when the membership variables wardend sets are missing or inconsistent."""

    code = "distributed.membership"
    exit_status = 2


def probe_coordinator(address: str) -> None:
    """Raise `CoordinatorUnavailable` when member 0 could not listen on ``address``'s port as
    JAX's coordinator will (every interface, IPv6 with IPv4 mapped, address reuse): JAX ends
    the process with SIGSEGV as often as it raises when its bind fails."""
    port = int(address.rsplit(":", 1)[1])
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):  # noqa: S104
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise CoordinatorUnavailable(
                    f"member 0 could not listen on the coordinator address {address}: "
                    f"{error.strerror} (another process holds the port)",
                    coordinator=address,
                ) from error
            continue  # no IPv6 on this host (or none at all): the next family, else JAX's own
        return


@dataclass(frozen=True)
class Membership:
    """Which member of how many this process is, and where the coordinator listens."""

    index: int = 0
    processes: int = 1
    coordinator: str = ""
    rendezvous: str = ""
    """A file where member 0 publishes the coordinator's port (empty: it is in `coordinator`)."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Membership:
        """The membership wardend's launcher set; a single process when none is set."""
        env = os.environ if environ is None else environ
        if PROCESSES_ENV not in env:
            return cls()
        try:
            index, count = int(env[PROCESS_ID_ENV]), int(env[PROCESSES_ENV])
        except (KeyError, ValueError) as error:
            raise MembershipError(f"bad membership variables: {error}") from error
        if not 0 <= index < count:
            raise MembershipError(f"process id {index} is outside 0..{count - 1}", index=index)
        coordinator = env.get(COORDINATOR_ENV, "")
        if count > 1 and not coordinator:
            raise MembershipError(f"{COORDINATOR_ENV} is not set for a {count}-process job")
        return cls(index, count, coordinator, env.get(COORDINATOR_FILE_ENV, ""))

    @property
    def group(self) -> bool:
        """Whether this process is one of several."""
        return self.processes > 1

    @property
    def writes(self) -> bool:
        """Whether this member holds the writer lock and commits (member 0)."""
        return self.index == 0

    def faults(self, faults: FaultSection) -> FaultSection:
        """The drill faults that apply to this member (``[faults] process``: one, default all)."""
        if faults.process is None or faults.process == self.index:
            return faults
        return FaultSection()

    def runtime(self, identity: dict[str, str]) -> dict[str, str]:
        """The runtime identity with the process count: an N-process checkpoint resumes only
        into N processes (a single process keeps the identity it always had)."""
        return {**identity, "processes": str(self.processes)} if self.group else identity

    def join(self) -> None:
        """Join the other members: gloo collectives on CPU, then `jax.distributed` (once: a
        process that has joined already, a member of a group spare, stays in its group)."""
        if not self.group:
            return
        import jax

        if jax.distributed.is_initialized():  # a group spare joined before it was handed the run
            return
        address = self.coordinator
        if self.rendezvous and self.writes:
            address = publish_coordinator(self.coordinator, Path(self.rendezvous))
        elif self.rendezvous:
            address = await_coordinator(Path(self.rendezvous), JOIN_TIMEOUT_S)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # type: ignore[no-untyped-call]
        if self.writes:
            probe_coordinator(address)
        try:
            jax.distributed.initialize(
                coordinator_address=address,
                num_processes=self.processes,
                process_id=self.index,
                initialization_timeout=JOIN_TIMEOUT_S,
            )
        except Exception as error:  # JAX raises its own runtime error, untyped
            if self.writes and RPC_BIND_FAILED in str(error):
                raise CoordinatorUnavailable(
                    f"member 0 could not listen on the coordinator address {address}: "
                    f"{error} (another process holds the port?)",
                    coordinator=address,
                ) from error
            raise

    def leave(self, status: int) -> None:
        """End this member with ``status`` when the interpreter exits, before JAX's own exit
        handler: its `jax.distributed` shutdown waits for every member, while a member still
        inside a collective with this one waits for it in turn, both until the stall timeout
        (the built-in worker always ends so, `exit_now`)."""
        if self.group:
            atexit.register(exit_now, status)  # run first: JAX registered its handler earlier

    def allgather(self, rows: np.ndarray) -> np.ndarray:
        """Every member's ``rows``, stacked in member order (a collective: all call it)."""
        if not self.group:
            return rows[None]
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(rows))

    def broadcast(self, values: np.ndarray) -> np.ndarray:
        """Member 0's int32 ``values`` in every member (a collective)."""
        if not self.group:
            return values
        from jax.experimental import multihost_utils

        sent = multihost_utils.broadcast_one_to_all(values, is_source=self.writes)
        return np.asarray(sent)

    def share_start(self, step: int, leaves: list[np.ndarray]) -> tuple[int, list[np.ndarray]]:
        """Member 0's ``(step, leaves)`` in every member, bit for bit (the others pass their
        initial state as the template of shapes and dtypes)."""
        if not self.group:
            return step, leaves
        from jax.experimental import multihost_utils

        # Broadcast as bytes: a float sum with zeros would turn -0.0 into 0.0, an integer
        # one copies every bit.
        raw = [_as_bits(leaf) for leaf in leaves]
        sent = multihost_utils.broadcast_one_to_all(
            (np.array(step, dtype=np.int32), raw), is_source=self.writes
        )
        shared_step, shared = sent
        out = [
            np.asarray(bits).view(leaf.dtype).reshape(leaf.shape)
            for bits, leaf in zip(shared, leaves, strict=True)
        ]
        return int(shared_step), out

    def agree(self, step: int, digest: str) -> None:
        """Every member's state hash at ``step``, compared; raises `MembersDiverged` naming
        the members whose hash differs from member 0's."""
        if not self.group:
            return
        from jax.experimental import multihost_utils

        mine = np.frombuffer(digest.encode().ljust(128)[:128], dtype=np.uint8)
        every = np.asarray(multihost_utils.process_allgather(mine))
        hashes = [bytes(row).decode().strip() for row in every.reshape(self.processes, -1)]
        differing = [i for i, h in enumerate(hashes) if h != hashes[0]]
        if differing:
            raise MembersDiverged(
                f"members {differing} hold another state than member 0 at step {step}",
                step=step,
                hashes=hashes,
                members=differing,
            )


def publish_coordinator(host: str, rendezvous: Path) -> str:
    """Member 0's ``host:port``, with a port free on its own node now (the coordinator binds
    it at once), written durably to ``rendezvous`` for the other members."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        address = f"{host}:{probe.getsockname()[1]}"
    write_text_atomic(rendezvous, address + "\n")
    return address


def await_coordinator(rendezvous: Path, timeout_s: float) -> str:
    """The ``host:port`` member 0 published in ``rendezvous``; raises `MembershipError`
    when none is there within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            address = rendezvous.read_text().strip()
        except FileNotFoundError:
            address = ""
        if address:
            return address
        if time.monotonic() > deadline:
            raise MembershipError(
                f"member 0 published no coordinator in {rendezvous} within {timeout_s} s",
                path=str(rendezvous),
            )
        time.sleep(RENDEZVOUS_POLL_S)


def _as_bits(leaf: np.ndarray) -> np.ndarray:
    """The leaf's bytes, flat: JAX without x64 would narrow a 64-bit leaf, never a byte."""
    return np.ascontiguousarray(leaf).reshape(-1).view(np.uint8)
