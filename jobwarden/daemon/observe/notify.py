"""The systemd notify protocol: datagrams to ``$NOTIFY_SOCKET``, and the watchdog.

``READY=1`` once the spool watcher and the control socket are up,
``STATUS=`` lines with job counts, ``WATCHDOG=1`` pings sent by a task on the
daemon's own loop (a blocked loop stops pinging, so systemd restarts it), and
``STOPPING=1`` on shutdown.  Abstract-namespace addresses (``@name``) are
supported, and ``WATCHDOG_USEC`` is honoured only when ``WATCHDOG_PID`` is
unset or names this process.  Without ``$NOTIFY_SOCKET`` every call is a no-op.

Those variables are the daemon's alone: `child_environment` gives workers an
allow-listed environment that leaves them, and everything else unlisted, out.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


class Notifier:
    """Sends notify datagrams to the service manager, if there is one."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):
            address = "\0" + address[1:]
        self.address = address or None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        mine = not pid or (pid.isdigit() and int(pid) == os.getpid())
        self.watchdog_usec = int(usec) if usec.isdigit() and mine else 0
        self.sent = 0
        self.errors = 0

    @property
    def watchdog_interval_s(self) -> float | None:
        """Seconds between pings (half the watchdog timeout), or None without a watchdog."""
        return self.watchdog_usec / 2e6 if self.address and self.watchdog_usec else None

    def send(self, *fields: str) -> bool:
        """Send one datagram of ``KEY=value`` lines; False when there is no manager or it fails."""
        if self.address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto("\n".join(fields).encode(), self.address)
        except OSError:
            self.errors += 1
            return False
        self.sent += 1
        return True

    def ready(self, status: str) -> bool:
        """READY=1 with a first status line."""
        return self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, status: str) -> bool:
        """A STATUS= line."""
        return self.send(f"STATUS={status}")

    def watchdog(self) -> bool:
        """One WATCHDOG=1 ping."""
        return self.send("WATCHDOG=1")

    def stopping(self, status: str) -> bool:
        """STOPPING=1."""
        return self.send("STOPPING=1", f"STATUS={status}")


WORKER_ENV = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "PYTHONPATH",
        "PYTHONHASHSEED",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
        "PYTHONWARNINGS",
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "NPROC",
        "TF_CPP_MIN_LOG_LEVEL",
        "JOBWARDEN_TEST_FAULT",
        "JOBWARDEN_COMPILE_CACHE",
    }
)
"""The daemon's variables a worker inherits by name (docs/daemon.md, "Worker environment")."""

WORKER_ENV_PREFIXES = ("LC_", "JAX_", "XLA_")
"""... and by prefix: the locale, and JAX's and XLA's own knobs."""


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment for workers: only the allow-listed variables of ``environ``.

    Everything else stays with the daemon: credentials and other secrets, the
    notify variables (which are the daemon's), the client's ``JOBWARDEN_ROOT``
    and ``JOBWARDEN_SOCKET``.  The launcher adds ``JOBWARDEN_SUPERVISOR_PID``.
    """
    return {
        name: value
        for name, value in environ.items()
        if name in WORKER_ENV or name.startswith(WORKER_ENV_PREFIXES)
    }
