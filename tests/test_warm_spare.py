"""Warm spares through a real wardend: a crash recovered by a pre-started worker, verified."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from jobwarden.checkpoint import format
from tests.daemon import Daemon, linreg_job
from tests.helpers import AttemptResult, kinds, wait_until

pytestmark = pytest.mark.slow

SLOW_FIRST_ATTEMPT = {"step_delay_s": 2.0}
"""16 s for attempt 1's 8 updates: time for the spare to be ready, whatever the load."""


def log_records(daemon: Daemon, event: str) -> list[dict[str, Any]]:
    """The daemon's structlog records named ``event``."""
    lines = (daemon.root / "wardend.log").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("event") == event]


def wait_spare_ready(daemon: Daemon) -> int:
    """The pid of the first spare that reported ready."""
    ready = wait_until(lambda: log_records(daemon, "spare.ready"), timeout=90, what="a spare ready")
    pid: int = ready[0]["pid"]
    return pid


def open_under(pid: int, folder: Path) -> list[str]:
    """What process ``pid`` holds open under ``folder`` (files and directories alike: a
    writer lock is held on an open descriptor)."""
    targets = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return [t for t in targets if t == str(folder) or t.startswith(f"{folder}/")]


def final_arrays(path: Path) -> dict[str, bytes]:
    """The raw bytes of every leaf of a checkpoint file."""
    return {p: a.tobytes() for p, a in format.read(path).arrays.items()}


def test_a_crash_is_recovered_through_the_spare_verified_and_exact(
    tmp_path: Path, compile_cache: Path, reference: AttemptResult
) -> None:
    """SIGKILL of attempt 1 -> attempt 2 is the spare's process, verified, state exact."""
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        daemon.drop("crash.toml", linreg_job("crash", faults=SLOW_FIRST_ATTEMPT))
        spare = wait_spare_ready(daemon)
        status = wait_until(
            lambda: daemon.state("crash"), lambda st: st["step"] >= 3, timeout=60, what="update 3"
        )
        assert status["step"] < 8, "attempt 1 finished before the spare was ready"
        os.kill(status["pid"], signal.SIGKILL)
        status = daemon.wait("crash")
        (handed,) = log_records(daemon, "spare.handed")
        resumed = daemon.events("crash", 2)
        (incident,) = daemon.incidents("crash")
    assert (status["state"], status["attempt"]) == ("completed", 2)
    assert (handed["pid"], handed["attempt"]) == (spare, 2)
    assert [e["pid"] for e in resumed if e["event"] == "started"] == [spare]
    assert (incident["kind"], incident["status"]) == ("crash", "verified")
    checks = incident["verification"]["checks"]
    assert [c["ok"] for c in checks] == [True] * len(checks) != []
    assert [e["event"] for e in resumed][:3] == ["started", "restored", "ready"]
    newest = sorted((daemon.root / "checkpoints" / "crash").glob("ckpt-*.safetensors"))[-1]
    expected = final_arrays(Path(kinds(reference, "completed")[0]["file"]))
    assert final_arrays(newest) == expected


def test_a_spare_holds_no_lock_and_writes_nothing_before_its_handoff(
    tmp_path: Path, compile_cache: Path
) -> None:
    """Ready and waiting, a spare has no file of any checkpoint directory open, none of its
    own in checkpoints/, its own session, and it ends with the daemon."""
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        daemon.drop("slow.toml", linreg_job("slow", faults=SLOW_FIRST_ATTEMPT))
        pid = wait_spare_ready(daemon)
        spare = psutil.Process(pid)
        checkpoints = daemon.root / "checkpoints"
        assert "jobwarden.worker.spare" in spare.cmdline()
        assert daemon.proc is not None
        assert os.getpgid(pid) == pid != os.getpgid(daemon.proc.pid)
        assert sorted(p.name for p in checkpoints.iterdir()) == ["slow"]
        assert open_under(pid, checkpoints) == []
        assert open_under(daemon.state("slow")["pid"], checkpoints) != []  # the writer's lock
    wait_until(lambda: not spare.is_running(), timeout=10, what="the spare gone with wardend")


def test_no_warm_spare_starts_every_attempt_cold(tmp_path: Path, compile_cache: Path) -> None:
    """--no-warm-spare: a crash is recovered by a new worker process, and no spare starts."""
    with Daemon(tmp_path / "root", compile_cache, "--no-warm-spare") as daemon:
        daemon.drop("cold.toml", linreg_job("cold", faults={"crash_after": 3}))
        status = daemon.wait("cold")
        assert (status["state"], status["attempt"]) == ("completed", 2)
        assert log_records(daemon, "spare.started") == []
        (incident,) = daemon.incidents("cold")
        assert incident["status"] == "verified"
