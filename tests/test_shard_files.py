"""A member's shard file written in one pass, and retention of sharded steps split between
the members: member 0 removes the dropped steps' records first, then each member removes
only its own shard files."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np
import pytest

from jobwarden.checkpoint import format
from jobwarden.checkpoint.lock import open_directory
from jobwarden.checkpoint.onepass import DIRECT_MIN_BYTES
from jobwarden.checkpoint.shardrecord import record_name, shard_name
from jobwarden.events import Emitter
from jobwarden.shards.commit import Group, ShardCommitter
from jobwarden.shards.files import ShardFiles
from jobwarden.shards.write import write_shard_file

MEMBERS = 2


def files(directory: Path, member: int) -> ShardFiles:
    """Member ``member``'s view of ``directory``, unfenced."""
    return ShardFiles(directory, member, MEMBERS, lambda: None)


@pytest.fixture
def steps(tmp_path: Path) -> Path:
    """Steps 1-3 committed (a record and two shards each), step 4's shards without a record,
    a pending leftover of step 1 and a shard of step 2 from a 4-member layout."""
    for step in (1, 2, 3, 4):
        for member in range(MEMBERS):
            (tmp_path / shard_name(step, member, MEMBERS)).write_bytes(b"shard")
        if step < 4:
            (tmp_path / record_name(step)).write_bytes(b"{}")
    (tmp_path / (shard_name(1, 1, MEMBERS) + ".pending")).write_bytes(b"half")
    (tmp_path / shard_name(2, 3, 4)).write_bytes(b"other layout")
    return tmp_path


def names(directory: Path) -> set[str]:
    """The names in ``directory``."""
    return {p.name for p in directory.iterdir()}


class TestRetainRecords:
    def test_removes_only_the_dropped_steps_records_and_pending_leftovers(
        self, steps: Path
    ) -> None:
        """Keeping 1: the records of steps 1 and 2 (and step 1's pending file) go, no shard."""
        before = names(steps)
        removed = files(steps, 0).retain_records(keep=1)
        expected = {record_name(1), record_name(2), shard_name(1, 1, MEMBERS) + ".pending"}
        assert expected == set(removed)
        assert before - expected == names(steps)

    def test_the_dropped_steps_are_no_longer_selectable(self, steps: Path) -> None:
        """Only the kept step still has a record."""
        files(steps, 0).retain_records(keep=1)
        assert files(steps, 1).steps() == [3]


class TestRetainShards:
    def test_each_member_removes_only_its_own_shards(self, steps: Path) -> None:
        """Member 1 removes its shards of steps 1 and 2, nothing of member 0's."""
        files(steps, 0).retain_records(keep=1)
        removed = files(steps, 1).retain_shards()
        assert {shard_name(1, 1, MEMBERS), shard_name(2, 1, MEMBERS)} == set(removed)
        assert {shard_name(1, 0, MEMBERS), shard_name(2, 0, MEMBERS)} <= names(steps)

    def test_member_0_also_takes_files_no_member_of_this_layout_owns(self, steps: Path) -> None:
        """Member 0 removes its own shards of the dropped steps and the other layout's."""
        files(steps, 0).retain_records(keep=1)
        removed = files(steps, 0).retain_shards()
        expected = {shard_name(1, 0, MEMBERS), shard_name(2, 0, MEMBERS), shard_name(2, 3, 4)}
        assert expected == set(removed)

    def test_the_newest_step_and_a_newer_uncommitted_one_are_kept(self, steps: Path) -> None:
        """After both parts, step 3 is whole and step 4's shards (no record yet) remain."""
        files(steps, 0).retain_records(keep=1)
        for member in range(MEMBERS):
            files(steps, member).retain_shards()
        expected = {record_name(3)} | {
            shard_name(step, member, MEMBERS) for step in (3, 4) for member in range(MEMBERS)
        }
        assert expected == names(steps)

    def test_before_the_records_go_no_shard_of_a_committed_step_is_removed(
        self, steps: Path
    ) -> None:
        """Without `retain_records` first, a member removes nothing of steps 1-3."""
        assert files(steps, 1).retain_shards() == []


def test_retain_in_one_process_is_both_parts(steps: Path) -> None:
    """A tool's `retain` keeping 2 removes step 1 whole and nothing of the steps kept."""
    files(steps, 0).retain(keep=2)
    expected = {record_name(2), record_name(3), shard_name(2, 3, 4)} | {
        shard_name(step, member, MEMBERS) for step in (2, 3, 4) for member in range(MEMBERS)
    }
    assert expected == names(steps)


class TestOnePassWrite:
    @pytest.fixture
    def pieces(self) -> list[tuple[str, np.ndarray]]:
        """A piece large enough to be written directly, a big-endian one, a strided view and
        a scalar."""
        rng = np.random.default_rng(5)
        big = rng.standard_normal(DIRECT_MIN_BYTES // 4 + 777, dtype=np.float32)
        return [
            ("params/w@0:9", big),
            ("params/b", np.arange(6, dtype=">f8")),
            ("opt/v", rng.standard_normal((8, 6)).astype(np.float32)[:, ::2]),
            ("step", np.array(7, np.int64)),
        ]

    def test_writes_the_bytes_the_container_encoding_gives(
        self, tmp_path: Path, pieces: list[tuple[str, np.ndarray]]
    ) -> None:
        """The file equals `format.encode`'s buffers joined, and its checksum is theirs."""
        manifest = fake_manifest(pieces)
        with open_directory(tmp_path) as handle:
            checksum, size = write_shard_file(handle, "s.safetensors", manifest, pieces, skip)
        expected = b"".join(bytes(b) for b in format.encode(manifest, pieces))
        assert expected == (tmp_path / "s.safetensors").read_bytes()
        assert (len(expected), format.read(tmp_path / "s.safetensors").checksum) == (
            size,
            checksum,
        )

    def test_a_failed_write_leaves_no_pending_file(
        self, tmp_path: Path, pieces: list[tuple[str, np.ndarray]]
    ) -> None:
        """A piece that cannot be written removes the pending file and raises."""
        broken = [*pieces, ("bad", np.array([object()]))]
        with open_directory(tmp_path) as handle, pytest.raises(TypeError):
            write_shard_file(handle, "s.safetensors", fake_manifest(pieces), broken, skip)
        assert set() == names(tmp_path)


class TestCommitterRetention:
    def test_the_dropped_steps_shards_are_gone_once_settled(self, tmp_path: Path) -> None:
        """One member, keep 1: after three commits and `settle`, only step 3's files remain
        and no removal thread is left running."""
        leaves = [("w", np.arange(8.0))]
        one = ShardFiles(tmp_path, 0, 1, lambda: None)
        group = Group(0, (1,), {}, {}, lambda rows: rows[None], one)
        with (tmp_path / "events").open("w") as stream:
            committer = ShardCommitter(group, Emitter(stream), keep=1)
            for step in (1, 2, 3):
                manifest = dataclasses.replace(fake_manifest(leaves), step=step)
                committer.commit(step, manifest, leaves, None)
            committer.settle()
        running = [t.name for t in threading.enumerate() if t.name == "shard-retention"]
        expected = {"events", record_name(3), shard_name(3, 0, 1)}
        assert (expected, []) == (names(tmp_path), running)


def fake_manifest(pieces: list[tuple[str, np.ndarray]]) -> format.Manifest:
    """A manifest for ``pieces``."""
    provenance = format.Provenance("c", "d", "s", {}, 0)
    return format.Manifest(
        "t", "j", 3, "threefry2x32", format.leaf_specs(pieces), {}, provenance, "h", {}, 0.0
    )


def skip(pending: Path) -> None:
    """No hook before the rename."""
