"""Spool intake: `Spool.take` on real files, for every way a request is accepted or refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jobwarden.daemon.intake.spool import Rejection, Spool
from jobwarden.daemon.store.layout import Root
from jobwarden.jobfile import MAX_JOB_FILE_BYTES, Job

GOOD = b'id = "good"\ntask = "linreg"\n'


@pytest.fixture
def root(tmp_path: Path) -> Root:
    """A daemon root with every folder created."""
    created = Root(tmp_path / "root")
    created.create()
    return created


@pytest.fixture
def spool(root: Root) -> Spool:
    """A spool whose daemon knows no job yet."""
    return Spool(root, known=lambda job_id: False)


def arrive(root: Root, name: str, data: bytes) -> Path:
    """A request written the Maildir way: created in spool/tmp, renamed into spool/incoming."""
    tmp = root.spool_tmp / name
    tmp.write_bytes(data)
    path = root.incoming / name
    os.rename(tmp, path)
    return path


def refused(root: Root, result: Job | Rejection | None, name: str) -> list[str]:
    """The problems of a rejection, after checking it was kept beside its error file."""
    assert isinstance(result, Rejection)
    assert (result.name, result.kept_at) == (name, root.rejected / name)
    error = json.loads((root.rejected / f"{name}.error.json").read_text())
    assert result.problems == error["problems"]
    assert os.listdir(root.incoming) + os.listdir(root.claimed) == []
    return result.problems


class TestAccepted:
    def test_a_valid_request_becomes_a_job_folder(self, root: Root, spool: Spool) -> None:
        """A valid TOML request returns its Job; its folder holds the request and job.json."""
        job = spool.take(arrive(root, "good.toml", GOOD))
        assert isinstance(job, Job)
        assert job.id == "good"
        assert (root.job("good") / "request.toml").read_bytes() == GOOD
        assert json.loads((root.job("good") / "job.json").read_text())["id"] == "good"
        assert os.listdir(root.incoming) + os.listdir(root.claimed) == []
        assert os.listdir(root.rejected) == []

    def test_a_json_request_is_kept_as_request_json(self, root: Root, spool: Spool) -> None:
        """A .json request is parsed as JSON and kept under its own suffix."""
        data = json.dumps({"id": "j", "task": "linreg"}).encode()
        job = spool.take(arrive(root, "j.json", data))
        assert isinstance(job, Job)
        assert (root.job("j") / "request.json").read_bytes() == data

    def test_a_request_of_exactly_the_size_limit_is_accepted(
        self, root: Root, spool: Spool
    ) -> None:
        """The limit is inclusive: MAX_JOB_FILE_BYTES bytes is still a request."""
        data = GOOD + b"#" * (MAX_JOB_FILE_BYTES - len(GOOD) - 1) + b"\n"
        assert len(data) == MAX_JOB_FILE_BYTES
        assert isinstance(spool.take(arrive(root, "edge.toml", data)), Job)

    def test_a_leftover_claimed_request_is_taken_where_it_lies(
        self, root: Root, spool: Spool
    ) -> None:
        """A request claimed before a crash is validated from spool/claimed under its name."""
        claimed = root.claimed / "1.good.toml"
        claimed.write_bytes(GOOD)
        job = spool.take(claimed)
        assert isinstance(job, Job)
        assert (root.job("good") / "request.toml").read_bytes() == GOOD
        assert os.listdir(root.claimed) == []


class TestNotTaken:
    def test_a_request_claimed_by_someone_else_first_is_none(
        self, root: Root, spool: Spool
    ) -> None:
        """A file gone from incoming before the claim: None, and nothing is written."""
        assert spool.take(root.incoming / "gone.toml") is None
        assert os.listdir(root.claimed) + os.listdir(root.rejected) + os.listdir(root.jobs) == []

    def test_dot_files_are_ignored_and_left_in_place(self, root: Root, spool: Spool) -> None:
        """A name starting with a dot is a writer's temporary file: None, not claimed."""
        path = arrive(root, ".good.toml.swp", GOOD)
        assert spool.take(path) is None
        assert os.listdir(root.incoming) == [".good.toml.swp"]
        assert os.listdir(root.claimed) + os.listdir(root.jobs) == []

    def test_an_already_accepted_claimed_file_is_dropped(self, root: Root, spool: Spool) -> None:
        """A claimed file that is the job folder's request (a crash mid-accept): None, unlinked."""
        assert isinstance(spool.take(arrive(root, "good.toml", GOOD)), Job)
        claimed = root.claimed / "1.good.toml"
        os.link(root.job("good") / "request.toml", claimed)
        assert spool.take(claimed) is None
        assert os.listdir(root.claimed) + os.listdir(root.rejected) == []
        assert (root.job("good") / "request.toml").read_bytes() == GOOD


class TestRejected:
    def test_a_symbolic_link_is_refused_and_kept_as_a_link(
        self, root: Root, spool: Spool, tmp_path: Path
    ) -> None:
        """A symlink is refused without being followed; the link itself is kept."""
        target = tmp_path / "elsewhere.toml"
        target.write_bytes(GOOD)
        os.symlink(target, root.incoming / "link.toml")
        (problem,) = refused(root, spool.take(root.incoming / "link.toml"), "link.toml")
        assert "symbolic link" in problem
        assert os.readlink(root.rejected / "link.toml") == str(target)
        assert os.listdir(root.jobs) == []

    def test_a_fifo_is_refused_as_not_a_regular_file(self, root: Root, spool: Spool) -> None:
        """A FIFO is refused by its mode, never opened (opening it would block)."""
        os.mkfifo(root.incoming / "fifo.toml")
        (problem,) = refused(root, spool.take(root.incoming / "fifo.toml"), "fifo.toml")
        assert "not a regular file (mode p" in problem

    def test_a_directory_is_refused_as_not_a_regular_file(self, root: Root, spool: Spool) -> None:
        """A directory renamed in is refused by its mode."""
        (root.incoming / "dir.toml").mkdir()
        (problem,) = refused(root, spool.take(root.incoming / "dir.toml"), "dir.toml")
        assert "not a regular file (mode d" in problem

    def test_a_file_over_the_size_limit_is_refused_and_kept_whole(
        self, root: Root, spool: Spool
    ) -> None:
        """One byte over MAX_JOB_FILE_BYTES: refused by size, the file kept byte for byte."""
        data = GOOD + b"#" * (MAX_JOB_FILE_BYTES + 1 - len(GOOD))
        (problem,) = refused(root, spool.take(arrive(root, "big.toml", data)), "big.toml")
        assert f"over the {MAX_JOB_FILE_BYTES}-byte limit" in problem
        assert (root.rejected / "big.toml").read_bytes() == data

    @pytest.mark.parametrize(
        ("name", "data", "expected"),
        [
            ("syntax.toml", b'id = "x\n', "syntax: "),
            ("syntax.json", b'{"id": "x", ', "syntax: "),
            ("unknown.toml", GOOD + b'colour = "red"\n', "colour: unknown field"),
            ("type.toml", GOOD + b'[train]\nseed = "three"\n', "train.seed: "),
        ],
    )
    def test_an_invalid_job_file_is_refused_with_its_problem(
        self, root: Root, spool: Spool, name: str, data: bytes, expected: str
    ) -> None:
        """Bad TOML or JSON, an unknown field, a wrong type: refused, the problem named first."""
        problems = refused(root, spool.take(arrive(root, name, data)), name)
        assert problems[0].startswith(expected), problems
        assert (root.rejected / name).read_bytes() == data

    def test_every_problem_of_a_request_is_listed(self, root: Root, spool: Spool) -> None:
        """Two mistakes in one file: both are listed, nothing is silently fixed."""
        data = GOOD + b'colour = "red"\n[train]\nseed = "three"\n'
        problems = refused(root, spool.take(arrive(root, "two.toml", data)), "two.toml")
        assert sorted(p.split(":")[0] for p in problems) == ["colour", "train.seed"]

    def test_an_id_the_daemon_knows_is_refused_as_a_duplicate(self, root: Root) -> None:
        """known(id) true: refused naming the id, no job folder made."""
        spool = Spool(root, known=lambda job_id: job_id == "good")
        (problem,) = refused(root, spool.take(arrive(root, "good.toml", GOOD)), "good.toml")
        assert "duplicate job id 'good'" in problem
        assert os.listdir(root.jobs) == []

    def test_an_id_whose_job_folder_exists_is_refused_as_a_duplicate(
        self, root: Root, spool: Spool
    ) -> None:
        """A second request with an accepted job's id is refused; the first job is untouched."""
        assert isinstance(spool.take(arrive(root, "good.toml", GOOD)), Job)
        again = GOOD + b"[run]\nsteps = 2\n"
        (problem,) = refused(root, spool.take(arrive(root, "good.toml", again)), "good.toml")
        assert "duplicate job id 'good'" in problem
        assert (root.job("good") / "request.toml").read_bytes() == GOOD

    @pytest.mark.parametrize(
        ("raw_name", "expected"),
        [
            (b"a" * 236 + b".toml", "name: 241 bytes, over the"),
            (b"bad\x01.toml", "name: holds control characters"),
            (b"bad\xff.toml", "name: not UTF-8 text"),
        ],
    )
    def test_an_unusable_name_is_refused_and_kept_under_a_safe_one(
        self, root: Root, spool: Spool, raw_name: bytes, expected: str
    ) -> None:
        """Too long to claim, control characters, not UTF-8: refused, kept under another name."""
        name = os.fsdecode(raw_name)
        result = spool.take(arrive(root, name, GOOD))
        assert isinstance(result, Rejection)
        assert result.name == name
        assert result.kept_at.parent == root.rejected
        assert result.kept_at.read_bytes() == GOOD
        error = json.loads(
            result.kept_at.with_name(result.kept_at.name + ".error.json").read_text()
        )
        assert error["problems"] == result.problems
        assert result.problems[0].startswith(expected), result.problems
        assert os.listdir(root.incoming) + os.listdir(root.claimed) + os.listdir(root.jobs) == []

    def test_a_second_rejection_of_the_same_name_keeps_both(self, root: Root, spool: Spool) -> None:
        """Rejected files never overwrite each other: the second one gets a numbered name."""
        spool.take(arrive(root, "bad.toml", b"first ="))
        second = spool.take(arrive(root, "bad.toml", b"second ="))
        assert isinstance(second, Rejection)
        assert second.kept_at == root.rejected / "bad.toml.1"
        assert (root.rejected / "bad.toml").read_bytes() == b"first ="
        assert (root.rejected / "bad.toml.1").read_bytes() == b"second ="
