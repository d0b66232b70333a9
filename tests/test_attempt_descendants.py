"""Nothing a local attempt started outlives it, and the leader's own exit ends it."""

from __future__ import annotations

import asyncio
import signal
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from jobwarden.daemon.launch.base import ExitInfo, LaunchSpec
from jobwarden.daemon.launch.local import LocalLauncher

FOLLOW_BOUND_S = 15.0
"""Far more than an attempt's end takes; far less than the children's 60 s of life."""

CHILD = """
    import os, sys, time
    folder = sys.argv[1]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:  # a grandchild in a session of its own, parent gone
            if {detach}:
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
            with open(os.path.join(folder, "child.pid"), "w") as out:
                out.write(str(os.getpid()))
            signal_ignored = __import__("signal")
            signal_ignored.signal(signal_ignored.SIGTERM, signal_ignored.SIG_IGN)
            with open(os.path.join(folder, "writes"), "a") as out:
                for _ in range(1200):
                    out.write("x")
                    out.flush()
                    time.sleep(0.05)
        os._exit(0)
    while not os.path.exists(os.path.join(folder, "child.pid")):
        time.sleep(0.01)
    print('{{"event": "ready", "step": 0}}', flush=True)
    {end}
"""


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie has)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def run(folder: Path, detach: bool, end: str, stop: bool = False) -> tuple[ExitInfo, bool]:
    """Start the attempt, follow it to its end (bounded); its exit, and whether the grandchild
    was still alive once the attempt had ended (killed then by the test, never left behind)."""
    code = textwrap.dedent(CHILD.format(detach=detach, end=end))
    spec = LaunchSpec("j", 1, folder, [sys.executable, "-c", code, str(folder)], {})
    attempt = await LocalLauncher().spawn(spec, "stderr.log")
    following = asyncio.ensure_future(attempt.follow(lambda e: None, lambda m: None))
    try:
        if stop:
            while not (folder / "child.pid").exists():
                await asyncio.sleep(0.02)
            await asyncio.wait_for(attempt.stop(1.0), FOLLOW_BOUND_S)
        info = await asyncio.wait_for(following, FOLLOW_BOUND_S)
    finally:
        pid = int((folder / "child.pid").read_text()) if (folder / "child.pid").exists() else 0
        survived = bool(pid) and not gone(pid)
        if survived:
            psutil.Process(pid).kill()
    return info, survived


@pytest.mark.parametrize("detach", [False, True], ids=["keeps-stdout", "detached"])
def test_a_leader_that_exits_on_its_own_leaves_no_descendant(tmp_path: Path, detach: bool) -> None:
    """A grandchild in a session of its own (stdout kept or detached) is killed when the leader
    exits 1; the end is the leader's, not the pipe's; the writes stop with the attempt."""
    info, survived = asyncio.run(run(tmp_path, detach, "sys.exit(1)"))
    assert (info.status, survived) == (1, False)


def test_a_killed_leader_is_ended_while_a_helper_holds_its_events_pipe(tmp_path: Path) -> None:
    """An SDK-like leader SIGKILLed with a helper holding stdout ends at once, as a SIGKILL."""
    started = time.monotonic()
    info, survived = asyncio.run(run(tmp_path, False, "os.kill(os.getpid(), 9)"))
    assert (info.signal, survived) == ("SIGKILL", False)
    assert time.monotonic() - started < FOLLOW_BOUND_S
    assert (tmp_path / "events.jsonl").read_text().startswith('{"event": "ready"')


def test_a_stopped_attempt_leaves_no_descendant_that_ignores_sigterm(tmp_path: Path) -> None:
    """A cancel (SIGTERM to the leader) also kills the grandchild that ignores SIGTERM."""
    info, survived = asyncio.run(run(tmp_path, True, "time.sleep(60)", stop=True))
    assert (info.status, survived) == (-signal.SIGTERM, False)


ORPHAN = """
import os, sys, time
folder = sys.argv[1]
if os.fork() == 0:
    if os.fork() == 0:  # orphaned at once (its parent leaves), ends on its own soon after
        with open(os.path.join(folder, "child.pid"), "w") as out:
            out.write(str(os.getpid()))
        time.sleep(0.2)
    os._exit(0)
time.sleep(1.0)
"""


def test_a_descendant_orphaned_during_the_attempt_is_not_left_a_zombie(tmp_path: Path) -> None:
    """A grandchild orphaned (re-parented to the subreaper) that ends by itself while the
    attempt runs is reaped: no zombie of it is left once the attempt has ended."""
    spec = LaunchSpec("j", 1, tmp_path, [sys.executable, "-c", ORPHAN, str(tmp_path)], {})

    async def run() -> ExitInfo:
        attempt = await LocalLauncher().spawn(spec, "stderr.log")
        return await asyncio.wait_for(attempt.follow(lambda e: None, lambda m: None), 15)

    assert asyncio.run(run()).status == 0
    pid = int((tmp_path / "child.pid").read_text())
    zombies = [c.pid for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE]
    assert pid not in zombies
