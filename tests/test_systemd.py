"""The systemd unit: verified, scored, installable, and the daemon working under its sandbox."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from jobwarden.control import client
from jobwarden.control.client import DaemonUnreachable
from jobwarden.states import SETTLED
from tests.helpers import wait_until

PROJECT = Path(__file__).resolve().parent.parent
UNIT = PROJECT / "systemd" / "wardend.service"
NOBODY = 65534
SANDBOX = """
set -eu
mount --make-rprivate /
mount -t tmpfs -o mode=0755 tmpfs /mnt
mkdir -p /mnt/jw/project /mnt/jw/python /mnt/jw/state /mnt/jw/run
mount --bind "$PROJECT" /mnt/jw/project
mount --bind "$PYBASE" /mnt/jw/python
mount --bind "$STATE" /mnt/jw/state
mount --bind "$RUN" /mnt/jw/run
# ProtectHome=yes, PrivateTmp=yes
for d in /root /home /tmp /var/tmp; do mount -t tmpfs -o mode=0755 tmpfs "$d"; done
chmod 1777 /tmp /var/tmp
# StateDirectory= and RuntimeDirectory=
mount -t tmpfs -o mode=0755 tmpfs /var/lib
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /var/lib/jobwarden /run/jobwarden "$PROJECT" "$PYBASE"
mount --bind /mnt/jw/state /var/lib/jobwarden
mount --bind /mnt/jw/run /run/jobwarden
mount --bind /mnt/jw/project "$PROJECT"
mount --bind /mnt/jw/python "$PYBASE"
# ProtectSystem=strict: everything else read-only, the code too
mount -o remount,bind,ro /
mount -o remount,bind,ro "$PROJECT"
mount -o remount,bind,ro "$PYBASE"
# ProtectProc=invisible, in a pid namespace of its own
mount -t proc -o hidepid=invisible proc /proc
# User=, NoNewPrivileges=yes, CapabilityBoundingSet=, UMask=0077; PrivateNetwork by unshare -n
exec setpriv --reuid=65534 --regid=65534 --clear-groups --no-new-privs --inh-caps=-all \\
    --bounding-set=-all sh -c 'umask 0077; exec "$0" -m jobwarden.daemon \\
    --root /var/lib/jobwarden --socket /run/jobwarden/control.sock --group nogroup' "$PYTHON"
"""


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    """systemd-analyze on the unit as installed for this checkout."""
    return subprocess.run(
        ["systemd-analyze", *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def rendered_unit(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this checkout's wardend, as install.sh renders it."""
    path = tmp_path / "wardend.service"
    venv = Path(sys.prefix)
    path.write_text(UNIT.read_text().replace("/opt/jobwarden/venv", str(venv)))
    return path


def test_unit_verifies_cleanly(rendered_unit: Path) -> None:
    """systemd-analyze verify reports nothing."""
    done = analyze("verify", str(rendered_unit))
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == ""


def exposure(unit: Path) -> tuple[float, str]:
    """systemd-analyze security --offline's overall score of ``unit`` (its drop-ins read in),
    and the scan's text."""
    done = analyze("security", "--offline=true", "--threshold=20", str(unit))
    assert done.returncode == 0, done.stdout[-2000:]
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout)
    assert found is not None, done.stdout[-2000:]
    return float(found.group(1)), done.stdout


def test_unit_exposure_is_at_most_2(rendered_unit: Path) -> None:
    """systemd-analyze security --offline scores the unit at 2.0 or less."""
    score, scan = exposure(rendered_unit)
    assert score <= 2.0
    assert "MemoryDenyWriteExecute=" in scan


def drop_in(heading: str) -> str:
    """The drop-in docs/deploy.md gives after ``heading`` (its first ini block)."""
    text = (PROJECT / "docs" / "deploy.md").read_text()
    section = text[text.index(heading) :]
    found = re.search(r"```ini\n(.*?)```", section, re.DOTALL)
    assert found is not None, f"docs/deploy.md has no drop-in block after {heading}"
    return found.group(1)


def home_drop_in() -> str:
    """The drop-in docs/deploy.md gives for code under /home."""
    return drop_in("**Code under `/home`.**")


def test_the_home_drop_in_of_the_docs_verifies_and_keeps_the_score(
    rendered_unit: Path,
) -> None:
    """The documented drop-in, beside the unit as systemctl edit puts it: systemd-analyze
    verify reports nothing, the security scan sees its ProtectHome=tmpfs, and the exposure
    stays what the unit's is."""
    alone, _ = exposure(rendered_unit)
    drop_ins = rendered_unit.parent / "wardend.service.d"
    drop_ins.mkdir()
    (drop_ins / "override.conf").write_text(home_drop_in())
    done = analyze("verify", str(rendered_unit))
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == ""
    score, scan = exposure(rendered_unit)
    assert "fake empty home directories" in scan  # ProtectHome=tmpfs, read in
    assert score == alone


def test_the_network_drop_in_of_the_docs_verifies_and_stays_at_most_2(
    rendered_unit: Path,
) -> None:
    """The documented network drop-in (a Slurm controller, a webhook host, a scraper): verify
    reports nothing, the scan reads its PrivateNetwork=no and its non-loopback allow-list,
    and the exposure stays at 2.0 or less."""
    alone, scan = exposure(rendered_unit)
    assert "Service has no access to the host's network" in scan
    drop_ins = rendered_unit.parent / "wardend.service.d"
    drop_ins.mkdir()
    (drop_ins / "network.conf").write_text(drop_in("**The network drop-in.**"))
    done = analyze("verify", str(rendered_unit))
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == ""
    score, scan = exposure(rendered_unit)
    assert "Service has access to the host's network" in scan
    assert "IP address allow list with non-localhost entries" in scan
    assert alone < score <= 2.0


def test_the_units_network_is_what_the_docs_say() -> None:
    """The unit allows the families and addresses docs/deploy.md lists, in a private
    namespace."""
    settings = dict(re.findall(r"^(\w+)=(.*)$", UNIT.read_text(), re.MULTILINE))
    families = "AF_UNIX AF_INET AF_INET6 AF_NETLINK"
    assert families == settings["RestrictAddressFamilies"]
    assert (
        settings["PrivateNetwork"],
        settings["IPAddressDeny"],
        settings["IPAddressAllow"],
    ) == ("yes", "any", "localhost")
    docs = (PROJECT / "docs" / "deploy.md").read_text()
    assert f"`RestrictAddressFamilies={families}`" in docs


def test_unit_settings_the_daemon_relies_on() -> None:
    """Type=notify with a watchdog, graceful KillMode, and a stop timeout above the grace."""
    text = UNIT.read_text()
    settings = dict(re.findall(r"^(\w+)=(.*)$", text, re.MULTILINE))
    assert settings["Type"] == "notify"
    assert settings["KillMode"] == "mixed"
    assert int(settings["TimeoutStopSec"]) > 30
    assert int(settings["WatchdogSec"]) > 0
    assert settings["Restart"] == "on-failure"
    assert int(settings["RestartSec"]) * int(settings["StartLimitBurst"]) > int(
        settings["StartLimitIntervalSec"]
    )
    assert settings["UMask"] == "0077"
    assert settings["MemoryDenyWriteExecute"] == "no"


@pytest.mark.slow
def test_daemon_runs_and_recovers_under_the_units_sandbox(tmp_path: Path) -> None:
    """As uid nobody, umask 0077, read-only system, private tmp, no network, hidden /proc."""
    if shutil.which("unshare") is None or shutil.which("setpriv") is None:
        pytest.fail("util-linux unshare and setpriv are needed for this test")
    state, run = tmp_path / "state", tmp_path / "run"
    for folder in (state, run):
        folder.mkdir()
        os.chown(folder, NOBODY, NOBODY)
    state.chmod(0o700)
    run.chmod(0o750)
    env = {
        **os.environ,
        "PROJECT": str(PROJECT),
        "PYBASE": os.path.realpath(sys.base_prefix),
        "STATE": str(state),
        "RUN": str(run),
        "PYTHON": sys.executable,
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    with (tmp_path / "wardend.stderr").open("wb") as stderr:
        daemon = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--net",
                "--pid",
                "--fork",
                "--kill-child=SIGKILL",
                "sh",
                "-c",
                SANDBOX,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    sock = run / "control.sock"

    def version() -> object:
        assert daemon.poll() is None, (tmp_path / "wardend.stderr").read_text()[-3000:]
        return client.request(sock, "version")

    try:
        wait_until(
            version,
            timeout=60,
            what="the sandboxed daemon answering",
            retry=(DaemonUnreachable, OSError),
        )
        assert stat.S_IMODE(sock.stat().st_mode) == 0o660
        name = "crash.toml"
        (state / "spool" / "tmp" / name).write_text(
            'id = "crash"\ntask = "linreg"\n[faults]\nfail_after = 3\n'
        )
        os.chown(state / "spool" / "tmp" / name, NOBODY, NOBODY)
        os.rename(state / "spool" / "tmp" / name, state / "spool" / "incoming" / name)
        status = wait_until(
            lambda: client.request(sock, "status", job="crash"),
            lambda status: status["state"] in {state.value for state in SETTLED},
            timeout=120,
            what="job crash settled",
            retry=(client.ControlError,),
        )
        assert status["state"] == "completed", (tmp_path / "wardend.stderr").read_text()[-3000:]
        (incident,) = client.request(sock, "incidents", job="crash")
        assert incident["status"] == "verified"
        sample = client.request(sock, "status")["daemon"]
        assert sample["pid"] > 0
    finally:
        try:
            client.request(sock, "shutdown")
            daemon.wait(60)
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait()
    for path in [
        state / "jobs" / "crash" / "state.json",
        *(state / "checkpoints" / "crash").glob("ckpt-*"),
    ]:
        info = path.stat()
        assert info.st_uid == NOBODY, path
        assert stat.S_IMODE(info.st_mode) & 0o077 == 0, path
    cache = state / "cache" / "jax"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert any(cache.iterdir()), "the compilation cache stayed empty"
    log = [json.loads(line) for line in (state / "wardend.log").read_text().splitlines()]
    assert any(e["event"] == "wardend.stopped" for e in log)


def private_python(folder: Path) -> Path:
    """A pyenv-like interpreter in a private folder (a copied venv, mode 0700 above it)."""
    folder.mkdir(mode=0o700)
    subprocess.run(
        [SYSTEM_PYTHON, "-m", "venv", "--without-pip", "--copies", folder / "py"],
        check=True,
        timeout=120,
    )
    return folder / "py" / "bin" / "python3"


SYSTEM_PYTHON = "/usr/bin/python3"


def test_install_refuses_an_interpreter_the_service_user_cannot_run(tmp_path: Path) -> None:
    """PYTHON= naming an interpreter in a private folder (or a home) is refused, naming
    it and why, before anything is made."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"LOUD SKIP: no {SYSTEM_PYTHON} here to copy a private interpreter from")
    python = private_python(tmp_path / "private")
    env = {**os.environ, "DESTDIR": str(tmp_path / "stage"), "PYTHON": str(python)}
    done = subprocess.run(
        [PROJECT / "systemd" / "install.sh", "install"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"refusing the interpreter {python}: {python} is under /tmp" in done.stderr
    assert "PYTHON=/usr/bin/python3" in done.stderr
    assert not (tmp_path / "stage" / "opt").exists()
    home = Path(os.path.realpath(sys.base_prefix))
    if home.is_relative_to("/root") or home.is_relative_to("/home"):
        env["PYTHON"] = str(home / "bin" / "python3")
        done = subprocess.run(
            [PROJECT / "systemd" / "install.sh"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 2
        assert "which the unit's ProtectHome= hides" in done.stderr


@pytest.mark.slow
def test_staged_install_is_idempotent_and_uninstall_removes_it(tmp_path: Path) -> None:
    """install.sh twice into a staging root (the second changes nothing), then uninstall.

    The `python3` first on PATH is a private one, as a pyenv's in a home is: the install
    says so and builds on the system's python3 instead; it links wardenctl onto PATH, and
    uninstall removes that link, an enable link and the emptied prefix."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"LOUD SKIP: no {SYSTEM_PYTHON} here to install from")
    private = private_python(tmp_path / "private")
    env = {
        **os.environ,
        "DESTDIR": str(tmp_path / "stage"),
        "PREFIX": "/opt/jobwarden",
        "PATH": f"{private.parent}:{os.environ['PATH']}",
        # pip's --compile off: byte-compiling the ~650 MB of dependencies is a third of the
        # install's CPU time, and nothing here depends on it.
        "PIP_COMPILE": "0",
    }
    env.pop("PYTHON", None)
    script = PROJECT / "systemd" / "install.sh"

    def run(action: str) -> str:
        done = subprocess.run(
            [str(script), action], env=env, capture_output=True, text=True, timeout=900, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    first = run("install")
    stage = tmp_path / "stage"
    assert f"{private}: {private} is under /tmp" in first
    assert f"using {SYSTEM_PYTHON} instead" in first
    link = stage / "usr" / "local" / "bin" / "wardenctl"
    assert os.readlink(link) == "/opt/jobwarden/venv/bin/wardenctl"
    unit = stage / "etc" / "systemd" / "system" / "wardend.service"
    assert f"created virtual environment {stage}/opt/jobwarden/venv" in first
    assert f"installed {unit}" in first
    assert "daemon-reload skipped" in first
    assert "ExecStart=/usr/bin/env /opt/jobwarden/venv/bin/wardend" in unit.read_text()
    assert (stage / "usr" / "lib" / "sysusers.d" / "jobwarden.conf").is_file()
    wardend = stage / "opt" / "jobwarden" / "venv" / "bin" / "wardend"
    assert (
        subprocess.run(
            [str(wardend), "--help"], capture_output=True, check=False, timeout=60
        ).returncode
        == 0
    )
    second = run("install")
    assert "exists" in second
    assert f"unchanged {unit}" in second
    assert "installed /" not in second.replace("installed jobwarden", "")
    assert f"unchanged {link}" in second
    wants = stage / "etc" / "systemd" / "system" / "multi-user.target.wants"
    wants.mkdir()
    (wants / "wardend.service").symlink_to("/etc/systemd/system/wardend.service")
    removed = run("uninstall")
    assert f"removed {unit}" in removed
    assert not (stage / "opt" / "jobwarden" / "venv").exists()
    assert not (wants / "wardend.service").is_symlink()
    assert not link.is_symlink()
    assert not (stage / "opt" / "jobwarden").exists()
    assert f"absent {unit}" in run("uninstall")
