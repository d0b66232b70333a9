"""A full root: the daemon keeps supervising, and everything is written once space returns.

The root is a small tmpfs (we run as root), filled while a job runs: its
events, its checkpoints, its state and its incident all meet ENOSPC.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.protocol import ControlError
from tests.daemon import Daemon, linreg_job
from tests.helpers import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def small_root(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs mounted as the daemon's root, unmounted afterwards."""
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m,mode=0700", "tmpfs", str(root)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def fill(path: Path) -> None:
    """Write ``path`` until the filesystem refuses another byte."""
    block = b"\0" * (1 << 20)
    with path.open("wb", buffering=0) as filler:
        with contextlib.suppress(OSError):
            while True:
                filler.write(block)
        with contextlib.suppress(OSError):
            while True:
                filler.write(b"\0" * 4096)
    probe = path.with_name("probe")
    with pytest.raises(OSError, match="No space left") as full:
        probe.write_bytes(b"\0" * 8192)
    assert full.value.errno == errno.ENOSPC


def test_a_full_root_is_survived_and_recorded_when_space_returns(
    small_root: Path, compile_cache: Path
) -> None:
    """ENOSPC under a running job: escalated as disk_full, slot freed, state and incident
    written after space returns, and the job resumes to completion."""
    with Daemon(small_root, compile_cache, "--sample-interval", "0.2") as daemon:
        daemon.drop(
            "full.toml",
            linreg_job(
                "full",
                run={"steps": 60, "checkpoint_every": 4},
                faults={"step_delay_s": 0.05},
                supervision={"stall_timeout_s": 30},
            ),
        )
        wait_until(
            lambda: daemon.state("full")["step"],
            lambda step: step >= 3,
            timeout=60,
            what="step 3",
            retry=(ControlError,),
        )
        filler = small_root / "filler"
        fill(filler)
        stuck = daemon.wait("full", ("escalated", "failed"), timeout=60)
        on_disk = json.loads((daemon.job_folder("full") / "state.json").read_text())
        assert (stuck["state"], on_disk["state"]) == ("escalated", "running")
        assert stuck["pid"] is None
        assert daemon.ask("version")["pid"] == daemon.proc.pid  # type: ignore[union-attr]
        os.unlink(filler)
        wait_until(
            lambda: json.loads((daemon.job_folder("full") / "state.json").read_text())["state"],
            lambda state: state == "escalated",
            timeout=10,
            what="state.json rewritten after space returned",
        )
        (incident,) = wait_until(
            lambda: daemon.incidents("full"), bool, timeout=10, what="the incident written"
        )
        assert (incident["kind"], incident["status"]) == ("disk_full", "escalated")
        assert "checkpoint.disk_full" in incident["symptom"]
        daemon.ask("resume", job="full")
        assert daemon.wait("full", timeout=120)["state"] == "completed"
