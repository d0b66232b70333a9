"""What the unit's network settings allow, emulated without systemd as init: a real wardend in
a network namespace of its own with loopback alone (``PrivateNetwork=yes``), under a seccomp
filter letting socket(2) make only the unit's families (``RestrictAddressFamilies=``,
`tests.families`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.daemon import sandbox
from tests.daemon import Daemon, ctl, linreg_job
from tests.helpers import wait_until

PROJECT = Path(__file__).resolve().parent.parent
FAMILIES = PROJECT / "tests" / "families.py"
SHIPPED = "AF_UNIX,AF_INET,AF_INET6,AF_NETLINK"
"""The families the shipped unit allows."""
UNIX_ONLY = "AF_UNIX"
"""The families an earlier unit allowed: no TCP at all."""
METRICS = "127.0.0.1:9464"
TRAIN = {"seed": 3, "learning_rate": 0.04, "momentum": 0.8, "batch_size": 8}


class Sandboxed(Daemon):
    """wardend in a new network namespace (loopback brought up unless ``loopback=False``),
    under the seccomp filter of ``families``; its pid is the daemon's (each step execs)."""

    def __init__(self, root: Path, *extra: str, families: str, loopback: bool = True) -> None:
        super().__init__(root, None, *extra)
        self.families = families
        self.loopback = loopback

    def argv(self) -> list[str]:
        """unshare --net, lo up, the filter, then wardend's own command line."""
        up = "ip link set lo up && " if self.loopback else ""
        restricted = [sys.executable, str(FAMILIES), self.families, "--", *super().argv()]
        return ["unshare", "--net", "sh", "-c", f'{up}exec "$@"', "sh", *restricted]

    def wait_rejected(self) -> list[Path]:
        """The error files in spool/rejected, once there is one."""
        rejected = self.root / "spool" / "rejected"
        return wait_until(
            lambda: sorted(rejected.glob("*.error.json")), timeout=60, what="a rejection"
        )

    def inside(self, code: str) -> str:
        """Run Python ``code`` in the daemon's network namespace; its stdout."""
        done = subprocess.run(
            ["nsenter", f"--net=/proc/{self.pid}/ns/net", sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout


@pytest.fixture(autouse=True)
def tools() -> None:
    """The namespaces need util-linux's unshare and nsenter, iproute2's ip, and root."""
    missing = [tool for tool in ("unshare", "nsenter", "ip") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        pytest.fail(f"needs root and {', '.join(missing) or 'unshare, nsenter, ip'}")


@pytest.fixture
def stopped() -> Iterator[list[Sandboxed]]:
    """Daemons to stop on the way out, whatever the test did."""
    daemons: list[Sandboxed] = []
    yield daemons
    for daemon in daemons:
        if daemon.alive():
            daemon.stop()


def two_process_job(job_id: str) -> str:
    """A linreg job of 2 members, 8 steps."""
    run = {"steps": 8, "checkpoint_every": 2, "processes": 2}
    return linreg_job(job_id, job_id, train=TRAIN, run=run)


def logged(root: Path, event: str) -> str:
    """The daemon log's lines of ``event``."""
    lines = (root / "wardend.log").read_text().splitlines()
    return "\n".join(line for line in lines if f'"{event}"' in line)


@pytest.mark.slow
def test_a_two_process_job_and_metrics_work_under_the_shipped_units_network(
    tmp_path: Path, stopped: list[Sandboxed]
) -> None:
    """Loopback alone and the shipped families: a 2-member job completes, and /metrics is
    served on loopback inside the namespace."""
    daemon = Sandboxed(tmp_path / "root", "--metrics-listen", METRICS, families=SHIPPED)
    stopped.append(daemon)
    daemon.start()
    daemon.drop("pair.toml", two_process_job("pair"))
    status = daemon.wait("pair", timeout=180)
    assert status["state"] == "completed", daemon.stderr_path.read_text()[-3000:]
    url = f"http://{METRICS}/metrics"
    scrape = f"import urllib.request; print(urllib.request.urlopen({url!r}).read().decode())"
    assert "jobwarden_" in daemon.inside(scrape)
    found = logged(daemon.root, "wardend.sandbox")
    assert '"tcp_loopback": "works"' in found
    assert '"interfaces": ["lo"]' in found
    assert daemon.stop() == 0


def test_under_unix_sockets_alone_a_two_process_job_is_refused_at_intake(
    tmp_path: Path, stopped: list[Sandboxed]
) -> None:
    """With AF_UNIX alone, the daemon starts, and rejects a 2-member job at intake (dropped
    in the spool, or sent by wardenctl submit) with a reason naming RestrictAddressFamilies=."""
    daemon = Sandboxed(tmp_path / "root", families=UNIX_ONLY)
    stopped.append(daemon)
    daemon.start()
    daemon.drop("pair.toml", two_process_job("pair"))
    (error_file,) = daemon.wait_rejected()
    problems = error_file.read_text()
    assert "run.processes: the 2 members" in problems
    assert "RestrictAddressFamilies= does not list AF_INET" in problems
    assert daemon.status("pair") is None
    job_file = tmp_path / "again.toml"
    job_file.write_text(two_process_job("again"))
    submitted = ctl(daemon, "submit", str(job_file))
    assert submitted.returncode != 0
    assert "RestrictAddressFamilies= does not list AF_INET" in submitted.stdout + submitted.stderr


def test_without_netlink_a_two_process_job_is_refused_naming_it(
    tmp_path: Path, stopped: list[Sandboxed]
) -> None:
    """TCP allowed but not AF_NETLINK (gloo's getifaddrs() needs it): the 2-member job is
    refused at intake, naming AF_NETLINK."""
    daemon = Sandboxed(tmp_path / "root", families="AF_UNIX,AF_INET,AF_INET6")
    stopped.append(daemon)
    daemon.start()
    daemon.drop("pair.toml", two_process_job("pair"))
    (error_file,) = daemon.wait_rejected()
    problems = error_file.read_text()
    assert "getifaddrs()" in problems
    assert "RestrictAddressFamilies= does not list AF_NETLINK" in problems


def test_with_loopback_down_a_two_process_job_is_refused_naming_it(
    tmp_path: Path, stopped: list[Sandboxed]
) -> None:
    """In a namespace whose loopback is down, the refusal says so."""
    daemon = Sandboxed(tmp_path / "root", families=SHIPPED, loopback=False)
    stopped.append(daemon)
    daemon.start()
    daemon.drop("pair.toml", two_process_job("pair"))
    (error_file,) = daemon.wait_rejected()
    assert "fails with ENETUNREACH: the loopback interface is down" in error_file.read_text()


@pytest.mark.parametrize(
    ("families", "extra", "expected"),
    [
        (
            UNIX_ONLY,
            ("--metrics-listen", METRICS),
            f"wardend: --metrics-listen '{METRICS}': the listener needs TCP, but "
            "socket(AF_INET) fails with EAFNOSUPPORT: the unit's RestrictAddressFamilies= "
            "does not list AF_INET",
        ),
        (
            SHIPPED,
            ("--metrics-listen", "0.0.0.0:9464"),
            "wardend: --metrics-listen '0.0.0.0:9464': the listener needs a network beyond "
            "loopback, but this daemon's network namespace has the loopback interface alone "
            "(the unit's PrivateNetwork=yes)",
        ),
        (
            SHIPPED,
            ("--notify-webhook", "https://hooks.example.org/jobwarden"),
            "wardend: --notify-webhook 'https://hooks.example.org/jobwarden': the webhook "
            "needs a network beyond loopback",
        ),
        (
            UNIX_ONLY,
            ("--notify-webhook", "http://[::1]:8080/hook"),
            "the webhook needs TCP, but socket(AF_INET6) fails with EAFNOSUPPORT",
        ),
    ],
)
def test_an_option_the_sandbox_defeats_is_refused_at_start(
    tmp_path: Path, families: str, extra: tuple[str, ...], expected: str
) -> None:
    """--metrics-listen or --notify-webhook that cannot work here: exit 2 at start, one line
    naming the unit's setting."""
    daemon = Sandboxed(tmp_path / "root", *extra, families=families)
    status = daemon.start_or_exit(timeout=60)
    assert status == 2
    assert expected in daemon.stderr_path.read_text()


class TestReachRefusal:
    """`sandbox.reach_refusal`, on permits made by hand."""

    def test_everything_permitted_refuses_nothing(self) -> None:
        """The default permits refuse neither loopback nor a remote host."""
        assert sandbox.reach_refusal("10.1.2.3", sandbox.Permits(), "x") is None
        assert sandbox.reach_refusal("localhost", sandbox.Permits(), "x") is None

    def test_ip_address_deny_on_loopback_is_named(self) -> None:
        """A loopback reason found by the probe is carried into the refusal."""
        permits = sandbox.Permits(loopback="connecting to 127.0.0.1 fails with EPERM")
        refused = sandbox.reach_refusal("127.0.0.1", permits, "the listener")
        assert refused is not None
        assert "fails with EPERM" in refused

    def test_a_cluster_launcher_needs_more_than_loopback(self) -> None:
        """The Slurm launcher is refused in a namespace of loopback alone, a local one not."""
        permits = sandbox.Permits(interfaces=("lo",))
        refused = sandbox.launcher_refusal("slurm", permits)
        assert refused is not None
        assert "PrivateNetwork=yes" in refused
        assert sandbox.launcher_refusal("local", permits) is None

    def test_a_cluster_launchers_jobs_need_no_loopback_here(self) -> None:
        """A multi-process Slurm job is not refused for this host's loopback."""
        permits = sandbox.Permits(loopback="connecting to 127.0.0.1 fails with ENETUNREACH")
        assert sandbox.job_refusal(2, permits, "slurm") is None
        assert sandbox.job_refusal(1, permits, "local") is None
        assert sandbox.job_refusal(2, permits, "local") is not None


def test_the_probe_here_finds_loopback_working() -> None:
    """On this test host (no sandbox), TCP on loopback works and no family is blocked."""
    found = sandbox.probe()
    assert found.loopback is None
    assert frozenset() == found.blocked_families
    assert found.interfaces is not None
    assert "lo" in found.interfaces
