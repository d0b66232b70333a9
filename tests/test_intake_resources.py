"""Intake short of descriptors: a real EMFILE (this process's RLIMIT_NOFILE lowered for a
moment) never rejects or drops a request; it is kept in the spool and taken at a rescan."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.daemon.intake.queue import Intake, Kept, Taken
from jobwarden.daemon.intake.spool import Rejection, Spool
from jobwarden.daemon.store import jobs
from jobwarden.daemon.store.layout import Root
from jobwarden.jobfile import Job, job_from_bytes

GOOD = b'id = "good"\ntask = "linreg"\n'


@pytest.fixture
def root(tmp_path: Path) -> Root:
    """A daemon root with every folder created."""
    created = Root(tmp_path / "root")
    created.create()
    return created


def arrive(root: Root, name: str, data: bytes) -> Path:
    """A request written the Maildir way: created in spool/tmp, renamed into spool/incoming."""
    tmp = root.spool_tmp / name
    tmp.write_bytes(data)
    path = root.incoming / name
    os.rename(tmp, path)
    return path


@contextlib.contextmanager
def no_descriptors() -> Iterator[None]:
    """Every open, socket and pipe of this process fails EMFILE until the block ends."""
    lowest_free = os.open("/dev/null", os.O_RDONLY)  # a new descriptor is the lowest free
    os.close(lowest_free)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class TestOutOfDescriptors:
    """Takes and scans that meet EMFILE."""

    def test_the_limit_really_bites(self) -> None:
        """Inside the block an open fails with EMFILE (else the tests below prove nothing)."""
        with no_descriptors(), pytest.raises(OSError, match="Too many open files") as raised:
            os.open("/dev/null", os.O_RDONLY)
        assert raised.value.errno == errno.EMFILE

    def test_a_request_met_by_emfile_is_kept_then_taken_at_the_next_scan(self, root: Root) -> None:
        """Kept in spool/claimed (none rejected), then accepted by a rescan once fds return."""
        admitted: list[Job | Rejection] = []

        async def main() -> tuple[Taken, int]:
            intake = Intake(Spool(root, known=lambda job_id: False), admitted.append)
            path = arrive(root, "good.toml", GOOD)
            with no_descriptors():
                kept = await intake.put(path)
                intake.rescan()  # its listing fails too: part of the same episode
                await asyncio.sleep(0.2)
            put_off = intake.put_off
            intake.rescan()
            for _ in range(100):
                if admitted:
                    break
                await asyncio.sleep(0.05)
            await intake.close()
            return kept, put_off

        kept, put_off = asyncio.run(main())
        assert isinstance(kept, Kept)
        assert "EMFILE" in kept.problem
        assert put_off == 2
        assert [job.id for job in admitted if isinstance(job, Job)] == ["good"]
        assert os.listdir(root.rejected) + os.listdir(root.claimed) == []

    def test_whether_a_folder_holds_the_request_is_not_guessed_without_descriptors(
        self, root: Root
    ) -> None:
        """holds_request raises EMFILE instead of a "no" that would reject a duplicate."""
        spool = Spool(root, known=lambda job_id: False)
        assert isinstance(spool.take(arrive(root, "good.toml", GOOD)), Job)
        claimed = root.claimed / "1.good.toml"
        claimed.write_bytes(GOOD)
        with no_descriptors(), pytest.raises(OSError, match="Too many open files") as raised:
            jobs.holds_request(root.job("good"), claimed)
        assert raised.value.errno == errno.EMFILE

    def test_a_job_folder_made_by_a_take_cut_short_is_adopted_by_the_next(self, root: Root) -> None:
        """The folder made, the take failed before its unlink: the next take returns the job."""
        claimed = root.claimed / "7.good.toml"
        claimed.write_bytes(GOOD)
        job = job_from_bytes(GOOD, "good.toml", "toml")
        made = jobs.create_folder(
            root, job, GOOD, ".toml", claim=claimed.name, request_name="good.toml"
        )
        spool = Spool(root, known=lambda job_id: False)
        taken = spool.take(claimed)
        assert isinstance(taken, Job)
        assert made.id == spool.adopted(taken).id
        assert os.listdir(root.claimed) + os.listdir(root.rejected) == []
