"""A worker running on a warm spare is found after the daemon's restart, as a cold one is."""

from __future__ import annotations

import asyncio
import os
import stat
from dataclasses import replace
from pathlib import Path

from jobwarden.daemon.config import LaunchSettings
from jobwarden.daemon.launch.base import LaunchSpec, RunningAttempt
from jobwarden.daemon.launch.local import LocalLauncher
from jobwarden.daemon.launch.members import GroupAttempt
from jobwarden.jobfile import job_from_bytes
from jobwarden.worker.command import WorkerCall
from tests.daemon import linreg_job

FAKE_PYTHON = """#!/bin/sh
case "$*" in *worker.spare*) echo '{"spare": "ready"}'; read line || exit 0;; esac
exec sleep 60
"""
"""Stands for the interpreter: ready at once as a spare, then a worker that runs on."""


def spec(root: Path, job_id: str, python: Path) -> LaunchSpec:
    """Attempt 1 of job ``job_id``, a built-in task with the fake interpreter."""
    job = job_from_bytes(linreg_job("key").encode(), "job.toml", "toml")
    folder = root / "jobs" / job_id / "attempts" / "1"
    call = WorkerCall(folder / "job.json", root / "checkpoints" / job_id, python=str(python))
    env = {"PATH": os.environ["PATH"]}
    return LaunchSpec(job_id, 1, folder, call.argv(), env, job=job, worker=call)


async def hand_over(root: Path, python: Path) -> tuple[LocalLauncher, list[RunningAttempt]]:
    """Job a starts cold (a spare of its key starts beside it); job b is handed that spare."""
    launcher = LocalLauncher(LaunchSettings(warm_spares=True))
    assert launcher.spares is not None
    cold = await launcher.start(spec(root, "a", python))
    for _ in range(500):
        if any(s.usable() for s in launcher.spares.spares.values()):
            break
        await asyncio.sleep(0.02)
    handed = await launcher.start(spec(root, "b", python))
    return launcher, [cold, handed]


def test_a_worker_handed_to_a_spare_is_found_by_its_job(tmp_path: Path) -> None:
    """find_orphans of job b names the spare that runs b's attempt, and only b's."""
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(stat.S_IRWXU)
    root = tmp_path / "root"

    async def scenario() -> tuple[list[int], list[int], list[int]]:
        launcher, (cold, handed) = await hand_over(root, python)
        try:
            assert launcher.spares is not None
            assert launcher.spares.handed == 1
            found_b = [pid for pid, _ in launcher.find_orphans(root / "jobs" / "b")]
            found_a = [pid for pid, _ in launcher.find_orphans(root / "jobs" / "a")]
            return found_b, found_a, [cold.pid or 0, handed.pid or 0]
        finally:
            await launcher.close()
            for running in (cold, handed):
                running.kill()
                # Waited for through the loop, which then closes its transport: a wait by
                # psutil would reap the child behind asyncio's back, and the transport, never
                # told, would warn as unclosed in whichever test of this process came next.
                await asyncio.wait_for(running.proc.wait(), 5)

    found_b, found_a, (cold_pid, handed_pid) = asyncio.run(scenario())
    assert found_b == [handed_pid]
    assert found_a == [cold_pid]


FAKE_MEMBER_PYTHON = """#!/bin/sh
case "$*" in *worker.spare*)
  echo '{"spare": "ready"}'; read line || exit 0; echo '{"spare": "taken"}';;
esac
exec sleep 60
"""
"""Stands for the interpreter of a group spare's member: ready at once, answers its handoff."""


def test_the_members_of_a_handed_group_spare_are_found_by_their_job(tmp_path: Path) -> None:
    """A 2-process job's attempt 2 handed to its group: find_orphans names every member of
    both attempts (the group's through their ``handed`` files), and no other process."""
    python = tmp_path / "python"
    python.write_text(FAKE_MEMBER_PYTHON)
    python.chmod(stat.S_IRWXU)
    root = tmp_path / "root"

    def group_spec(attempt: int) -> LaunchSpec:
        first = spec(root, "g", python)
        folder = first.folder.parent / str(attempt)
        return replace(first, attempt=attempt, folder=folder, processes=2)

    async def scenario() -> tuple[list[int], list[int], list[int]]:
        launcher = LocalLauncher(LaunchSettings(warm_spares=True))
        assert launcher.groups is not None
        attempts: list[GroupAttempt] = []
        try:
            cold = await launcher.start(group_spec(1))
            assert isinstance(cold, GroupAttempt)
            attempts.append(cold)
            for _ in range(500):
                if any(g.usable() for g in launcher.groups.groups.values()):
                    break
                await asyncio.sleep(0.02)
            handed = await launcher.start(group_spec(2))
            assert isinstance(handed, GroupAttempt)
            attempts.append(handed)
            found = [pid for pid, _ in launcher.find_orphans(root / "jobs" / "g")]
            cold_pids = [m.running.pid or 0 for m in cold.members]
            return found, cold_pids, [m.running.pid or 0 for m in handed.members]
        finally:
            await launcher.close()
            for attempt in attempts:
                attempt.kill()
                for member in attempt.members:
                    await asyncio.wait_for(member.running.proc.wait(), 5)

    found, cold_pids, handed_pids = asyncio.run(scenario())
    assert sorted(found) == sorted(cold_pids + handed_pids)
    assert not set(cold_pids) & set(handed_pids)
