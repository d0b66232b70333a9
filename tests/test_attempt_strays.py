"""Through the daemon: a program's detached child never writes beside the next attempt."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil

from jobwarden.daemon.launch.base import ATTEMPT_ENV
from tests.daemon import Daemon
from tests.test_command_jobs import command_job

FORKER = """\
import json, os, sys, time
from pathlib import Path

run = json.loads(Path(os.environ["JOBWARDEN_RUN_FILE"]).read_text())
writes = Path(run["checkpoint_dir"]) / "writes"
attempt = Path(os.environ["JOBWARDEN_ATTEMPT_FOLDER"]).name
with writes.open("a") as out:
    out.write(f"start {attempt} {time.time()}\\n")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:  # detached: a session of its own, stdio on /dev/null
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        for _ in range(400):
            with writes.open("a") as out:
                out.write(f"child {attempt} {time.time()}\\n")
            time.sleep(0.05)
    os._exit(0)
time.sleep(0.5)
sys.exit(1)
"""
"""A program whose grandchild keeps appending to the checkpoint directory for 20 s while
the program itself fails at once."""


def test_no_child_of_an_attempt_writes_during_the_next_or_outlives_the_job(
    tmp_path: Path, compile_cache: Path
) -> None:
    """Attempt 1 and 2 fail leaving a writer each: no write of attempt n's child after
    attempt n+1 started, and none of them alive once the job has failed."""
    program = tmp_path / "forker.py"
    program.write_text(FORKER)
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        text = command_job(
            "forker",
            [sys.executable, str(program)],
            sdk=False,
            supervision={"restart_backoff_s": 0.1, "max_restarts": 1},
        )
        daemon.drop("forker.toml", text)
        status = daemon.wait("forker", timeout=60)
        job_folder = str(daemon.job_folder("forker"))
        left = []
        for proc in psutil.process_iter():
            try:
                if proc.environ().get(ATTEMPT_ENV, "").startswith(job_folder + os.sep):
                    left.append(proc.pid)
            except psutil.Error:
                continue
        for pid in left:
            psutil.Process(pid).kill()
        writes = (daemon.root / "checkpoints").rglob("writes")
        lines = [line.split() for path in writes for line in path.read_text().splitlines()]
    assert (status["state"], status["attempt"]) == ("failed", 2)
    assert left == []
    starts = {int(n): float(t) for kind, n, t in lines if kind == "start"}
    ends = {n - 1: t for n, t in starts.items()}  # attempt n-1 is over once n starts
    late = [n for kind, n, t in lines if kind == "child" and float(t) > ends.get(int(n), 1e18)]
    assert sorted(starts) == [1, 2]
    assert late == [], f"{len(late)} writes of attempt 1's child after attempt 2 started"


UNWAITED = """\
import os, sys, time

if os.fork() == 0:  # a session of its own, ended at once, never waited for
    os.setsid()
    os._exit(0)
time.sleep(0.3)
sys.exit(1)
"""
"""A program that leaves a setsid child it never waits for: a zombie, re-parented to the
subreaper daemon when the program exits."""


def test_a_setsid_child_left_unwaited_is_no_zombie_of_the_daemon(
    tmp_path: Path, compile_cache: Path
) -> None:
    """Three attempts each leave a setsid child unreaped: once the job has failed, within
    the reaper's 2 s grace and a sample more, the daemon has no zombie child left (before,
    one per attempt stayed for good: a child leading a session was taken for the daemon's
    own)."""
    program = tmp_path / "unwaited.py"
    program.write_text(UNWAITED)
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        text = command_job(
            "unwaited",
            [sys.executable, str(program)],
            sdk=False,
            supervision={"restart_backoff_s": 0.1, "max_restarts": 2},
        )
        daemon.drop("unwaited.toml", text)
        status = daemon.wait("unwaited", timeout=60)
        deadline = time.monotonic() + 10
        zombies = [-1]
        while zombies and time.monotonic() < deadline:
            time.sleep(0.2)
            zombies = [
                child.pid
                for child in psutil.Process(daemon.pid).children()
                if child.status() == psutil.STATUS_ZOMBIE
            ]
    assert (status["state"], status["attempt"]) == ("failed", 3)
    assert zombies == [], f"zombies of the daemon 10 s after the job failed: {zombies}"
