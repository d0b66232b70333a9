"""What the daemon's sandbox permits, probed once at start, and what it therefore refuses.

The shipped unit (systemd/wardend.service, docs/deploy.md "What the unit allows")
restricts the daemon's network: `RestrictAddressFamilies=` decides which socket
families it may make, ``PrivateNetwork=yes`` leaves it a network namespace with
loopback alone, and ``IPAddressDeny=``/``IPAddressAllow=`` filter the addresses it
may reach.  A part that needs what is blocked would otherwise fail late and
obscurely: the members of a multi-process job cannot reach their coordinator, a
webhook never arrives, a metrics listener is bound where no scraper can reach it.
So `probe` looks once (a TCP connection to itself on loopback, the families
``socket()`` accepts, the interfaces of the namespace), and the daemon refuses, at
start or at intake, with a reason that names the unit's setting.  The probe sends
nothing beyond loopback.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path

LOOPBACK = "127.0.0.1"
NET_DEV = Path("/proc/self/net/dev")
"""The interfaces of this process's own network namespace (``/sys/class/net`` shows those of
whoever mounted ``/sys``)."""
CLUSTER_LAUNCHERS = frozenset({"slurm"})
"""Launchers whose members run on a cluster's nodes, reached through its client tools: a
multi-process job there needs no TCP on this host's loopback, but the controller."""
DOCS = 'docs/deploy.md, "What the unit allows"'
FAMILIES = {
    "AF_INET": (socket.AF_INET, socket.SOCK_STREAM, 0),
    "AF_INET6": (socket.AF_INET6, socket.SOCK_STREAM, 0),
    "AF_NETLINK": (socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE),
}
"""The families probed, each as ``socket()`` is called for it: TCP, and the netlink route
socket through which ``getifaddrs()`` lists the interfaces (gloo calls it)."""


def _errno_name(error: OSError) -> str:
    return errno.errorcode.get(error.errno or 0, "OSError")


def family_blocked(name: str) -> str:
    """The reason given when ``socket()`` refuses the family ``name``."""
    return (
        f"socket({name}) fails with EAFNOSUPPORT: the unit's RestrictAddressFamilies= "
        f"does not list {name}"
    )


@dataclass(frozen=True)
class Permits:
    """What the sandbox was found to permit at start (`probe`); everything, by default."""

    blocked_families: frozenset[str] = frozenset()
    """Of `FAMILIES`, those ``socket()`` refused (EAFNOSUPPORT)."""
    loopback: str | None = None
    """Why a TCP connection to this host's 127.0.0.1 cannot be made, naming the setting at
    fault; None when it can."""
    interfaces: tuple[str, ...] | None = None
    """The network interfaces of the daemon's namespace; None when they could not be read."""

    @property
    def loopback_only(self) -> bool:
        """Whether the namespace has loopback alone (``PrivateNetwork=yes``)."""
        return self.interfaces == ("lo",)

    def record(self) -> dict[str, object]:
        """The findings, as the daemon logs them at start (``wardend.sandbox``)."""
        return {
            "blocked_families": sorted(self.blocked_families),
            "tcp_loopback": self.loopback or "works",
            "interfaces": list(self.interfaces) if self.interfaces is not None else None,
        }


def probe() -> Permits:
    """Look at what this process may do on the network (loopback only; under a second)."""
    blocked = set()
    for name, (family, kind, protocol) in FAMILIES.items():
        try:
            socket.socket(family, kind, protocol).close()
        except OSError as error:
            if error.errno == errno.EAFNOSUPPORT:
                blocked.add(name)
    loopback = family_blocked("AF_INET") if "AF_INET" in blocked else loopback_problem()
    return Permits(frozenset(blocked), loopback, interfaces())


def loopback_problem(timeout_s: float = 2.0) -> str | None:
    """Why a TCP connection from this process to itself on 127.0.0.1 fails, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        try:
            server.bind((LOOPBACK, 0))
            server.listen(1)
        except OSError as error:
            return (
                f"binding {LOOPBACK} fails with {_errno_name(error)}: the loopback "
                "interface has no such address"
            )
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as client:
            client.settimeout(timeout_s)
            try:
                client.connect(server.getsockname())
            except OSError as error:
                if error.errno == errno.EPERM:
                    return (
                        f"connecting to {LOOPBACK} fails with EPERM: the unit's "
                        "IPAddressDeny=any needs IPAddressAllow=localhost"
                    )
                if error.errno == errno.ENETUNREACH:
                    return (
                        f"connecting to {LOOPBACK} fails with ENETUNREACH: the loopback "
                        "interface is down (PrivateNetwork=yes brings it up)"
                    )
                return f"connecting to {LOOPBACK} fails with {_errno_name(error)}"
    return None


def interfaces() -> tuple[str, ...] | None:
    """The interface names of this process's network namespace, sorted; None if unreadable."""
    try:
        lines = NET_DEV.read_text().splitlines()[2:]
    except OSError:
        return None
    return tuple(sorted(line.split(":", 1)[0].strip() for line in lines if ":" in line))


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this host's loopback: ``localhost`` or a loopback address."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _family_of(host: str) -> str:
    try:
        return "AF_INET6" if ipaddress.ip_address(host.strip("[]")).version == 6 else "AF_INET"
    except ValueError:
        return "AF_INET"  # a name: AF_INET at least is needed to reach what it resolves to


def reach_refusal(host: str, permits: Permits, what: str) -> str | None:
    """Why ``what`` (a listener bound on, or a connection to, ``host``) cannot work in this
    sandbox, or None; the reason names the unit's setting and the documented drop-in."""
    family = _family_of(host)
    if family in permits.blocked_families:
        return f"{what} needs TCP, but {family_blocked(family)} ({DOCS})"
    if is_loopback(host):
        if permits.loopback is not None and family == "AF_INET":
            return f"{what} needs TCP on loopback, but {permits.loopback} ({DOCS})"
        return None
    if permits.loopback_only:
        return (
            f"{what} needs a network beyond loopback, but this daemon's network namespace "
            f"has the loopback interface alone (the unit's PrivateNetwork=yes): lift it with "
            f"the network drop-in ({DOCS})"
        )
    return None


def job_refusal(count: int, permits: Permits, launcher: str) -> str | None:
    """Why intake refuses a job of ``count`` processes in this sandbox (it would fail at run
    time), or None.

    The members of a multi-process job started on this host reach their coordinator
    and each other's gloo collectives over TCP on 127.0.0.1, and gloo looks for its
    interface with ``getifaddrs()``, which asks the kernel over AF_NETLINK.
    """
    if count < 2 or launcher in CLUSTER_LAUNCHERS:
        return None
    members = f"run.processes: the {count} members of this job"
    if permits.loopback is not None:
        return (
            f"{members} reach their coordinator and each other (gloo) over TCP on "
            f"{LOOPBACK}, which this daemon's sandbox blocks: {permits.loopback} ({DOCS})"
        )
    if "AF_NETLINK" in permits.blocked_families:
        return (
            f"{members} join gloo collectives, which list the interfaces with getifaddrs(), "
            f"but {family_blocked('AF_NETLINK')} ({DOCS})"
        )
    return None


def launcher_refusal(launcher: str, permits: Permits) -> str | None:
    """Why ``launcher`` cannot work in this sandbox, or None: a cluster's client tools talk
    TCP to its controller, which is not on the namespace's loopback alone."""
    if launcher not in CLUSTER_LAUNCHERS:
        return None
    return reach_refusal("controller", permits, f"--launcher {launcher} (its client tools)")
