"""Intake under crashes and hostile files: nothing accepted is lost, nothing escapes as an error.

The unit tests drive `Spool` and `JobTable` on real files in milliseconds; a
kill at an exact instant is stood for by `Killed`, raised in place of the
n-th file-system call (a fake: the real kills are in `TestKilledDaemon`,
which SIGKILLs a real wardend at random instants of a stream of requests).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobwarden.control import client
from jobwarden.daemon.intake import spool
from jobwarden.daemon.intake.queue import Intake
from jobwarden.daemon.intake.spool import MAX_NAME_BYTES, Rejection, Spool, pending_requests
from jobwarden.daemon.store import jobs
from jobwarden.daemon.store.jobs import JobTable, read_folder
from jobwarden.daemon.store.layout import Root
from jobwarden.jobfile import Job
from tests.daemon import Daemon, linreg_job
from tests.helpers import wait_until

GOOD = b'id = "good"\ntask = "linreg"\n[run]\nsteps = 1\n'
DEEP_TOML = b'id = "deep"\ntask = "linreg"\n[train]\nx = ' + b"[" * 5000 + b"]" * 5000 + b"\n"
DEEP_JSON = b'{"id": "deep", "task": "linreg", "train": {"x": ' + b"[" * 5000 + b"]" * 5000 + b"}}"


@pytest.fixture
def root(tmp_path: Path) -> Root:
    """A daemon root with every folder created."""
    created = Root(tmp_path / "root")
    created.create()
    return created


def arrive(root: Root, name: str | bytes, data: bytes) -> Path:
    """A request written the Maildir way: created in spool/tmp, renamed into spool/incoming."""
    raw = os.fsencode(name)
    tmp = os.path.join(os.fsencode(root.spool_tmp), raw)
    with open(tmp, "wb") as stream:
        stream.write(data)
    target = os.path.join(os.fsencode(root.incoming), raw)
    os.rename(tmp, target)
    return Path(os.fsdecode(target))


def restart(root: Root) -> tuple[JobTable, list[Job | Rejection | None]]:
    """What a daemon start does to intake: load the jobs, take every request left.

    Returns the jobs known afterwards (loaded again) and the outcome of each request taken.
    """
    table = JobTable(root)
    table.load()
    fresh = Spool(root, known=lambda job_id: job_id in table)
    taken = [fresh.take(path) for path in pending_requests(root, settle_s=0)]
    after = JobTable(root)
    after.load()
    return after, taken


def spool_files(root: Root) -> list[str]:
    """Everything still waiting in the spool."""
    return sorted(os.listdir(root.incoming) + os.listdir(root.claimed))


def error_files(root: Root) -> list[str]:
    """The error files in spool/rejected."""
    return sorted(p.name for p in root.rejected.glob("*.error.json"))


class Killed(BaseException):
    """Stands for SIGKILL at this instant: nothing after it runs (BaseException: no handler
    of the code under test may swallow it)."""


MUTATING = ("open", "write", "fsync", "rename", "replace", "unlink", "mkdir", "rmdir", "link")


@contextlib.contextmanager
def killed_at(monkeypatch: pytest.MonkeyPatch, instant: int) -> Iterator[list[int]]:
    """Raise `Killed` in place of the ``instant``-th file-system call (1-based)."""
    calls = [0]
    for name in MUTATING:
        real = getattr(os, name)

        def wrapper(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] == instant:
                raise Killed(f"killed at file-system call {instant}")
            return _real(*args, **kwargs)

        monkeypatch.setattr(os, name, wrapper)
    try:
        yield calls
    finally:
        monkeypatch.undo()


class TestKilledAtEveryInstant:
    """A kill at any file-system call of one intake, then a restart: exactly one outcome."""

    @pytest.mark.parametrize(
        ("data", "existing", "outcome"),
        [
            (GOOD, False, "accepted"),
            (b'id = "bad"\ntask = "linreg"\n[run]\nsteps = -1\n', False, "rejected"),
            (GOOD, True, "duplicate"),
        ],
        ids=["accepted", "rejected", "duplicate"],
    )
    def test_the_request_ends_accepted_or_rejected_exactly_once(
        self,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        data: bytes,
        existing: bool,
        outcome: str,
    ) -> None:
        """Every instant of the intake is tried; the request is never lost, never doubled."""
        instant = 0
        finished = False
        while not finished:
            instant += 1
            root = Root(tmp_path / f"root{instant}")
            root.create()
            if existing:
                first = Spool(root, known=lambda job_id: False).take(arrive(root, "a.toml", GOOD))
                assert isinstance(first, Job)
            path = arrive(root, "req.toml", data)
            with killed_at(monkeypatch, instant) as calls:
                try:
                    Spool(root, known=lambda job_id: False).take(path)
                    finished = True
                except Killed:
                    pass
            table, _ = restart(root)
            assert spool_files(root) == [], instant
            assert not list(root.jobs.glob(jobs.STAGING_PREFIX + "*")), instant
            if outcome == "rejected":
                assert list(table) == [], instant
            else:
                assert [r.id for r in table] == ["good"], instant
                assert (root.job("good") / "request.toml").read_bytes() == GOOD
                assert read_folder(root.job("good")).claim is not None
            if outcome == "accepted":
                assert error_files(root) == [], instant
            else:
                assert error_files(root) == ["req.toml.error.json"], instant
                assert (root.rejected / "req.toml").read_bytes() == data
        assert instant == calls[0] + 1 > 5


class TestHalfMadeFolders:
    """Job folders an older daemon left behind when it was killed mid-intake."""

    def claimed(self, root: Root) -> Path:
        path = root.claimed / "1700000000000000000.good.toml"
        path.write_bytes(GOOD)
        return path

    def test_an_empty_folder_is_removed_and_its_claimed_request_accepted(self, root: Root) -> None:
        """Killed after mkdir: the request still in claimed is accepted, not a duplicate."""
        self.claimed(root)
        root.job("good").mkdir()
        _, taken = restart(root)
        assert [type(t) for t in taken] == [Job]
        assert [r.id for r in JobTable(root).load()] == ["good"]
        assert error_files(root) == []

    def test_a_folder_holding_only_its_request_is_completed(self, root: Root) -> None:
        """Killed after the claimed file was unlinked, before job.json: the job is not lost."""
        root.job("good").mkdir()
        (root.job("good") / "request.toml").write_bytes(GOOD)
        table, taken = restart(root)
        (record,) = list(table)
        assert (record.id, record.state.value, taken) == ("good", "queued", [])
        assert "intake completed at daemon start" in record.reason
        assert read_folder(root.job("good")).id == "good"

    def test_a_linked_request_left_claimed_is_recognised(self, root: Root) -> None:
        """Killed between link and unlink: completed once, the claimed twin dropped."""
        claimed = self.claimed(root)
        root.job("good").mkdir()
        os.link(claimed, root.job("good") / "request.toml")
        (root.job("good") / "job.json.pending").write_text("{")
        table, taken = restart(root)
        assert ([r.id for r in table], taken) == (["good"], [None])
        assert spool_files(root) + error_files(root) == []

    def test_a_kept_request_that_no_longer_validates_goes_back_to_the_spool(
        self, root: Root
    ) -> None:
        """A half-made folder whose request is refused now: rejected with its error file."""
        root.job("gone").mkdir()
        (root.job("gone") / "request.toml").write_bytes(b'id = "gone"\ntask = "resnet"\n')
        table, taken = restart(root)
        assert list(table) == []
        assert isinstance(taken[0], Rejection)
        assert "unknown task 'resnet'" in taken[0].problems[0]
        assert not root.job("gone").exists()

    def test_a_staging_folder_is_discarded_and_its_request_taken_again(self, root: Root) -> None:
        """Killed while the folder was built: the staging copy goes, the request is accepted."""
        self.claimed(root)
        staging = root.jobs / f"{jobs.STAGING_PREFIX}good"
        staging.mkdir()
        (staging / "request.toml").write_bytes(GOOD)
        _, taken = restart(root)
        assert [type(t) for t in taken] == [Job]
        assert not staging.exists()

    def test_an_unreadable_folder_does_not_stop_the_others_loading(self, root: Root) -> None:
        """A corrupt state.json is logged and left; the other jobs load."""
        Spool(root, known=lambda job_id: False).take(arrive(root, "good.toml", GOOD))
        root.job("broken").mkdir()
        (root.job("broken") / "state.json").write_text("{")
        (root.job("broken") / "job.json").write_text("[" * 100_000)
        assert [r.id for r in JobTable(root).load()] == ["good"]
        assert (root.job("broken") / "state.json").read_text() == "{"


class TestHostileRequests:
    """Requests that used to escape as exceptions, claims that failed, kept files that moved."""

    @pytest.fixture
    def take(self, root: Root) -> Any:
        """Take one request by name and data; every outcome leaves the spool empty."""
        requests = Spool(root, known=lambda job_id: False)

        def run(name: str | bytes, data: bytes) -> Job | Rejection | None:
            taken = requests.take(arrive(root, name, data))
            assert spool_files(root) == []
            return taken

        return run

    @pytest.mark.parametrize(("name", "data"), [("deep.toml", DEEP_TOML), ("deep.json", DEEP_JSON)])
    def test_deep_nesting_is_a_rejection_not_a_recursion_error(
        self, root: Root, take: Any, name: str, data: bytes
    ) -> None:
        """10 KB of nested arrays: rejected with its error file naming the nesting."""
        taken = take(name, data)
        assert isinstance(taken, Rejection)
        assert "nested deeper than 32 levels" in taken.problems[0]
        assert (root.rejected / name).read_bytes() == data

    def test_nan_in_a_json_request_is_refused_at_the_syntax(self, take: Any) -> None:
        """NaN is not JSON: refused before validation."""
        taken = take("nan.json", b'{"id": "n", "task": "linreg", "train": {"seed": NaN}}')
        assert isinstance(taken, Rejection)
        assert taken.problems == ["syntax: NaN is not a JSON number"]

    def test_a_name_too_long_to_claim_is_rejected_under_a_safe_name(
        self, root: Root, take: Any
    ) -> None:
        """240 characters: the claim would exceed NAME_MAX; rejected at once, error file beside."""
        name = "x" * 236 + ".toml"
        taken = take(name, GOOD)
        assert isinstance(taken, Rejection)
        assert f"over the {MAX_NAME_BYTES}-byte limit" in taken.problems[0]
        error = json.loads(taken.kept_at.with_name(taken.kept_at.name + ".error.json").read_text())
        assert (error["submitted_as"], len(taken.kept_at.name) < 100) == (name, True)
        assert taken.kept_at.read_bytes() == GOOD
        assert os.listdir(root.jobs) == []

    def test_a_name_of_exactly_the_limit_is_accepted(self, root: Root, take: Any) -> None:
        """MAX_NAME_BYTES bytes still fits the claim's stamp."""
        assert isinstance(take("y" * (MAX_NAME_BYTES - 5) + ".toml", GOOD), Job)

    def test_a_name_that_is_not_utf8_is_rejected_under_a_safe_name(
        self, root: Root, take: Any
    ) -> None:
        """Bytes that are not UTF-8 in a name: rejected, shown escaped, kept byte for byte."""
        taken = take(b"caf\xe9.toml", GOOD)
        assert isinstance(taken, Rejection)
        assert "not UTF-8" in taken.problems[0]
        assert taken.kept_at.name.isascii()
        error = json.loads(taken.kept_at.with_name(taken.kept_at.name + ".error.json").read_text())
        assert error["submitted_as"] == "caf\\xe9.toml"

    def test_a_failure_inside_validation_is_a_rejection(
        self, root: Root, take: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Any exception while validating becomes the rejection's reason."""

        def explode(*args: object) -> None:
            raise RuntimeError("validator bug")

        monkeypatch.setattr(spool, "job_from_bytes", explode)
        taken = take("x.toml", GOOD)
        assert isinstance(taken, Rejection)
        assert taken.problems == ["validation failed: RuntimeError: validator bug"]

    def test_a_hard_linked_request_is_kept_as_the_daemons_own_copy(
        self, root: Root, take: Any, tmp_path: Path
    ) -> None:
        """A link kept outside cannot edit the request as accepted."""
        outside = tmp_path / "outside.toml"
        outside.write_bytes(GOOD)
        os.link(outside, root.spool_tmp / "linked.toml")
        os.rename(root.spool_tmp / "linked.toml", root.incoming / "linked.toml")
        requests = Spool(root, known=lambda job_id: False)
        assert isinstance(requests.take(root.incoming / "linked.toml"), Job)
        kept = root.job("good") / "request.toml"
        outside.write_bytes(b'id = "evil"\n')
        assert kept.read_bytes() == GOOD
        assert (os.stat(kept).st_nlink, os.stat(outside).st_nlink) == (1, 1)


class TestDrop:
    """The daemon's own Maildir drop for submit."""

    def test_a_failed_drop_leaves_nothing_in_tmp(
        self, root: Root, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The rename into incoming fails: the written file in spool/tmp is removed."""

        def refuse(*args: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "rename", refuse)
        with pytest.raises(OSError, match="No space"):
            spool.drop(root, "x.toml", GOOD)
        assert os.listdir(root.spool_tmp) + os.listdir(root.incoming) == []


class TestIntakeQueue:
    """The intake thread and the loop's batches."""

    def test_one_failing_file_does_not_stop_the_others_or_the_next_scan(self, root: Root) -> None:
        """An exception in one take is logged; the rest are taken, and a rescan still runs."""

        class Flaky(Spool):
            def take(self, path: Path) -> Job | Rejection | None:
                if path.name.startswith("boom"):
                    raise RuntimeError("boom")
                return super().take(path)

        for index in range(40):
            arrive(root, f"r{index:02d}.toml", f'id = "r{index:02d}"\ntask = "linreg"\n'.encode())
        arrive(root, "boom.toml", GOOD)
        admitted: list[Job | Rejection] = []

        async def run() -> None:
            queue = Intake(Flaky(root, known=lambda job_id: False), admitted.append)
            futures = [queue.put(p) for p in sorted(root.incoming.iterdir())]
            outcomes = await asyncio.gather(*futures)
            assert sum(isinstance(o, Job) for o in outcomes) == 40
            arrive(root, "late.toml", b'id = "late"\ntask = "linreg"\n')
            os.utime(root.incoming / "late.toml", (0, 0))
            queue.rescan()
            await asyncio.sleep(0)
            while queue._task is not None:
                await asyncio.sleep(0.01)
            await queue.close()

        asyncio.run(run())
        assert sorted(j.id for j in admitted if isinstance(j, Job))[-1] == "r39"
        assert os.listdir(root.incoming) == ["boom.toml"]
        assert (root.job("late") / "job.json").is_file()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def _workers_of(daemon: Daemon) -> list[int]:
    """Pids of the daemon's worker processes (children), to wait for after a kill."""
    assert daemon.proc is not None
    children = Path(f"/proc/{daemon.proc.pid}/task/{daemon.proc.pid}/children")
    with contextlib.suppress(OSError):
        return [int(pid) for pid in children.read_text().split()]
    return []


@pytest.mark.slow
class TestKilledDaemon:
    """SIGKILL of a real wardend at random instants while requests stream in."""

    def test_no_request_is_lost_or_doubled_across_random_kills(self, tmp_path: Path) -> None:
        """Rounds of 16 requests, each daemon killed 0-150 ms in; all accounted for at the end."""
        rng = random.Random(20261201)
        wardend = Daemon(tmp_path / "root", None, "--max-concurrent", "1")
        root = Root(tmp_path / "root")
        good: list[str] = []
        bad: list[str] = []
        orphans: list[int] = []
        for round_number in range(8):
            wardend.start()
            for index in range(16):
                job_id = f"k{round_number}-{index:02d}"
                if index % 4 == 3:
                    bad.append(f"{job_id}.toml")
                    text = f'id = "{job_id}"\ntask = "linreg"\n[run]\nsteps = 0\n'
                else:
                    good.append(job_id)
                    text = linreg_job(job_id, run={"steps": 1})
                wardend.drop(f"{job_id}.toml", text)
            time.sleep(rng.uniform(0, 0.15))
            orphans += _workers_of(wardend)
            assert wardend.stop(signal.SIGKILL) == -signal.SIGKILL
        with wardend:
            wait_until(
                lambda: (spool_files(root), len(wardend.ask("status")["jobs"])),
                lambda seen: seen == ([], len(good)),
                timeout=60,
                what=f"the spool emptied and {len(good)} jobs known",
            )
            known = [row["id"] for row in wardend.ask("status")["jobs"]]
            orphans += _workers_of(wardend)
        assert sorted(known) == sorted(good)
        assert error_files(root) == sorted(f"{name}.error.json" for name in bad)
        for job_id in good:
            assert read_folder(root.job(job_id)).id == job_id
        wait_until(
            lambda: [pid for pid in orphans if _alive(pid)],
            lambda alive: not alive,
            timeout=30,
            what="orphaned workers exiting",
        )


@pytest.mark.slow
class TestHostileFilesAtStart:
    """A daemon never fails to start, nor stops serving, because of one file in its spool."""

    def test_a_deeply_nested_request_left_claimed_does_not_stop_the_start(
        self, tmp_path: Path
    ) -> None:
        """Deep nesting in claimed/ and incoming/ at start: the daemon answers and rejects both."""
        root = Root(tmp_path / "root")
        root.create()
        (root.claimed / "1700000000000000000.deep.toml").write_bytes(DEEP_TOML)
        (root.incoming / "deep.json").write_bytes(DEEP_JSON)
        os.utime(root.incoming / "deep.json", (0, 0))
        with Daemon(root.path, None, "--max-concurrent", "1") as wardend:
            # The error file is written before its request is moved beside it: wait for both.
            wait_until(
                lambda: (error_files(root), spool_files(root)),
                lambda found: len(found[0]) == 2 and not found[1],
                timeout=20,
                what="two error files and an empty spool",
            )
            assert error_files(root) == ["deep.json.error.json", "deep.toml.error.json"]
            assert spool_files(root) == []
            arrive(root, "x" * 240 + ".toml", GOOD)
            wait_until(
                lambda: (error_files(root), spool_files(root)),
                lambda found: len(found[0]) == 3 and not found[1],
                timeout=20,
                what="the long name's error file and an empty spool",
            )
            assert wardend.ask("status")["jobs"] == []
            assert spool_files(root) == []


@pytest.mark.slow
class TestBusySpool:
    """Thousands of files in the spool: the control socket keeps answering."""

    def test_status_answers_within_a_second_during_a_large_intake(self, tmp_path: Path) -> None:
        """2,000 invalid requests at start: every status during their intake answered < 1 s."""
        root = Root(tmp_path / "root")
        root.create()
        count = 2000
        for index in range(count):
            (root.incoming / f"bad{index:05d}.toml").write_bytes(b"id = ")
        past = time.time() - 10
        for path in root.incoming.iterdir():
            os.utime(path, (past, past))
        began = time.monotonic()
        with Daemon(root.path, None, "--max-concurrent", "1") as wardend:
            started = time.monotonic() - began
            latencies = []
            while len(os.listdir(root.rejected)) < 2 * count:
                sent = time.monotonic()
                client.request(wardend.socket, "status", timeout=5)
                latencies.append(time.monotonic() - sent)
                time.sleep(0.005)
                assert time.monotonic() - began < 120
        latencies.sort()
        assert started < 5
        assert len(latencies) > 20
        assert latencies[-1] < 1.0, latencies[-5:]
