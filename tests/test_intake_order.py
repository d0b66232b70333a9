"""Intake's order of work: each outcome is applied once it is durable, and every file of a
staging folder, and the folder, is fsynced before the folder is renamed into place.

Real files and the real intake thread; the fsyncs are recorded by wrapping ``os.fsync``
(the kill at each instant is `tests/test_intake_safety.py`'s).
"""

from __future__ import annotations

import asyncio
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from jobwarden.daemon.intake.queue import Intake
from jobwarden.daemon.intake.spool import Rejection, Spool
from jobwarden.daemon.store import jobs, staging
from jobwarden.daemon.store.layout import Root
from jobwarden.jobfile import Job
from tests.test_intake_safety import GOOD, arrive

WAIT_S = 10.0
"""The longest a take waits for the loop to admit the request before it (a bound, not a
figure: the loop is idle meanwhile)."""


@pytest.fixture
def root(tmp_path: Path) -> Root:
    """A daemon root with every folder created."""
    created = Root(tmp_path / "root")
    created.create()
    return created


def fsynced_paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the path of every descriptor ``os.fsync`` is called on, in order."""
    seen: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


class TestEachOutcomeAtOnce:
    """An accepted request is admitted as soon as its folder is durable."""

    def test_a_request_is_admitted_before_the_next_of_its_batch_is_taken(self, root: Root) -> None:
        """The second take of one batch finds the first job admitted already."""
        admitted: list[Job | Rejection] = []
        found_admitted: list[int] = []

        class Watching(Spool):
            def take(self, path: Path) -> Job | Rejection | None:
                if path.name == "r1.toml":
                    deadline = time.monotonic() + WAIT_S
                    while not admitted and time.monotonic() < deadline:
                        time.sleep(0.005)
                    found_admitted.append(len(admitted))
                return super().take(path)

        paths = [
            arrive(root, f"r{i}.toml", f'id = "r{i}"\ntask = "linreg"\n'.encode()) for i in (0, 1)
        ]

        async def run() -> list[Any]:
            queue = Intake(Watching(root, known=lambda job_id: False), admitted.append)
            outcomes = await asyncio.gather(*(queue.put(path) for path in paths))
            await queue.close()
            return outcomes

        outcomes = asyncio.run(run())
        assert found_admitted == [1]
        assert [job.id for job in admitted if isinstance(job, Job)] == ["r0", "r1"]
        assert [job.id for job in outcomes] == ["r0", "r1"]

    def test_requests_taken_after_close_are_not_admitted(self, root: Root) -> None:
        """A take that ends once intake has closed resolves None and admits nothing."""
        admitted: list[Job | Rejection] = []
        closed = threading.Event()

        class Slow(Spool):
            def take(self, path: Path) -> Job | Rejection | None:
                closed.wait(WAIT_S)
                return super().take(path)

        path = arrive(root, "late.toml", GOOD)

        queue = Intake(Slow(root, known=lambda job_id: False), admitted.append)

        async def run() -> Any:
            future = queue.put(path)
            await asyncio.sleep(0.05)
            await queue.close()
            closed.set()
            return await future

        assert asyncio.run(run()) is None
        queue.executor.shutdown(wait=True)  # the take under way ends (its job is durable)
        assert (root.job("good") / "state.json").is_file()
        assert admitted == []


class TestStagingFiles:
    """`staging.write_new_files`: every file and the folder durable on return."""

    def test_each_file_and_the_folder_is_fsynced(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """One fsync per file and one of the folder, the folder's before the files'."""
        folder = tmp_path / "staging"
        folder.mkdir()
        seen = fsynced_paths(monkeypatch)
        staging.write_new_files(folder, {"a": b"1", "b": b"22", "c": b""})
        assert [str(folder)] + [str(folder / n) for n in "abc"] == seen

    def test_the_files_hold_their_bytes_privately(self, tmp_path: Path) -> None:
        """Each file holds exactly its bytes, mode 0600."""
        staging.write_new_files(tmp_path, {"x.toml": GOOD, "y.json": b"{}\n"})
        assert (tmp_path / "x.toml").read_bytes() == GOOD
        assert (tmp_path / "y.json").read_bytes() == b"{}\n"
        assert stat.S_IMODE((tmp_path / "x.toml").stat().st_mode) == 0o600

    def test_a_name_taken_already_is_refused_and_nothing_left_open(self, tmp_path: Path) -> None:
        """FileExistsError for an existing name; the descriptors opened before it are closed."""
        (tmp_path / "b").write_bytes(b"theirs")
        before = len(os.listdir("/proc/self/fd"))
        with pytest.raises(FileExistsError):
            staging.write_new_files(tmp_path, {"a": b"1", "b": b"2"})
        assert before == len(os.listdir("/proc/self/fd"))
        assert (tmp_path / "b").read_bytes() == b"theirs"

    def test_a_job_folder_is_durable_before_it_is_renamed_into_place(
        self, root: Root, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """create_folder fsyncs the staging folder and its three files, then ``jobs/``."""
        seen = fsynced_paths(monkeypatch)
        job = Spool(root, known=lambda job_id: False)._validate(
            arrive(root, "g.toml", GOOD), "g.toml"
        )
        assert job[1] is not None
        jobs.create_folder(root, job[1][0], GOOD, ".toml", claim="1.g.toml", request_name="g.toml")
        staged = root.jobs / f"{jobs.STAGING_PREFIX}good"
        expected = [staged] + [staged / n for n in ("request.toml", "job.json", "state.json")]
        assert [str(p) for p in expected] + [str(root.jobs)] == seen
        assert (root.job("good") / "request.toml").read_bytes() == GOOD
