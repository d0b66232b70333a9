"""Adversarial checkpoint directories: planted links, stolen locks, fenced writers, lying headers.

Each test plants what an attacker with write access to the directory (or a
confused operator) could, and checks that nothing lands outside the directory,
that a second writer is never admitted, and that a header cannot decide an
allocation.  Real files and, where it matters, real processes.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import tracemalloc
from pathlib import Path

import pytest

from jobwarden import files
from jobwarden.checkpoint import format
from jobwarden.checkpoint.errors import (
    ChecksumMismatch,
    ShapeMismatch,
    TreeMismatch,
    UnreadableCheckpoint,
    UnsafeCheckpointDirectory,
    WriterFenced,
    WriterLockLost,
)
from jobwarden.checkpoint.lock import GENERATION_NAME, LOCK_NAME, WriterLock
from jobwarden.checkpoint.store import CheckpointStore, file_name
from jobwarden.errors import WriterLockedError
from jobwarden.worker.command import worker_argv
from tests import samples
from tests.helpers import job

NOBODY = 65534


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the checkpoint directory that no write may reach."""
    path = tmp_path / "outside" / "victim"
    path.parent.mkdir()
    path.write_bytes(b"precious\n")
    return path


def commit_step(store: CheckpointStore, step: int, scale: float = 1.0) -> Path:
    """Commit the sample state at ``step`` through ``store``."""
    state = samples.leaves(scale)
    path, _ = store.commit(step, samples.manifest(state, step), state)
    return path


class TestPlantedLinks:
    """A link planted at any name a writer creates is replaced, never written through."""

    def test_writer_lock_symlink(self, tmp_path: Path, victim: Path) -> None:
        """A symlink at .writer.lock: the lock is taken and the victim is untouched."""
        ck = tmp_path / "ck"
        ck.mkdir(mode=0o700)
        (ck / LOCK_NAME).symlink_to(victim)
        with WriterLock(ck):
            assert victim.read_bytes() == b"precious\n"
            assert stat.S_ISREG((ck / LOCK_NAME).lstat().st_mode)

    def test_generation_pending_symlink(self, tmp_path: Path, victim: Path) -> None:
        """A symlink at writer.json.pending: writer.json is a real file, the victim untouched."""
        ck = tmp_path / "ck"
        ck.mkdir(mode=0o700)
        (ck / (GENERATION_NAME + ".pending")).symlink_to(victim)
        with WriterLock(ck):
            assert victim.read_bytes() == b"precious\n"
            assert stat.S_ISREG((ck / GENERATION_NAME).lstat().st_mode)

    @pytest.mark.parametrize("plant", ["symlink", "hardlink"])
    def test_future_checkpoint_pending_link(self, tmp_path: Path, victim: Path, plant: str) -> None:
        """A link at the pending name of a future step: the commit lands in the directory only."""
        ck = tmp_path / "ck"
        ck.mkdir(mode=0o700)
        pending = ck / (file_name(6) + ".pending")
        if plant == "symlink":
            pending.symlink_to(victim)
        else:
            os.link(victim, pending)
        path = commit_step(CheckpointStore(ck), 6)
        assert victim.read_bytes() == b"precious\n"
        assert format.read(path).manifest.step == 6
        assert not pending.exists()

    def test_quarantine_symlink(self, tmp_path: Path) -> None:
        """quarantine/ as a link to elsewhere: refused, nothing moved through it."""
        ck = tmp_path / "ck"
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        ck.mkdir(mode=0o700)
        store = CheckpointStore(ck)
        damaged = commit_step(store, 2)
        damaged.write_bytes(b"garbage")
        (ck / "quarantine").symlink_to(elsewhere)
        with pytest.raises(UnsafeCheckpointDirectory, match="symbolic link") as caught:
            store.select(samples.expected(samples.leaves()))
        assert caught.value.path == str(ck / "quarantine")
        assert list(elsewhere.iterdir()) == []
        assert damaged.read_bytes() == b"garbage"

    def test_quarantine_owned_by_another_user(self, tmp_path: Path) -> None:
        """A quarantine/ directory that is not ours is refused naming its owner."""
        ck = tmp_path / "ck"
        ck.mkdir(mode=0o700)
        commit_step(CheckpointStore(ck), 2).write_bytes(b"garbage")
        (ck / "quarantine").mkdir()
        os.chown(ck / "quarantine", NOBODY, NOBODY)
        with pytest.raises(UnsafeCheckpointDirectory) as caught:
            CheckpointStore(ck).select(samples.expected(samples.leaves()))
        assert caught.value.evidence["owner"] == NOBODY

    def test_pid_lock_symlink(self, tmp_path: Path, victim: Path) -> None:
        """The root lock's pid file planted as a link is refused, the victim untouched."""
        (tmp_path / "wardend.lock").symlink_to(victim)
        with pytest.raises(files.UnsafePathError, match="symbolic link"):
            files.pid_lock(tmp_path / "wardend.lock")
        assert victim.read_bytes() == b"precious\n"

    def test_reading_a_fifo_does_not_hang(self, tmp_path: Path) -> None:
        """A FIFO where a checkpoint should be is unreadable at once, not a hang."""
        os.mkfifo(tmp_path / file_name(2))
        with pytest.raises(UnreadableCheckpoint, match="not a regular file"):
            format.read(tmp_path / file_name(2))

    def test_created_files_get_the_mode_asked_for(self, tmp_path: Path) -> None:
        """commit and write_text_atomic create 0600 by default, or the mode given."""
        files.write_text_atomic(tmp_path / "private", "x")
        files.write_text_atomic(tmp_path / "shared", "x", mode=0o640)
        files.commit(tmp_path / "blob", [memoryview(b"x")], mode=0o604)
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
        assert modes == {"private": 0o600, "shared": 0o640, "blob": 0o604}


class TestCheckpointDirectory:
    """The checkpoint directory itself must be a real directory of ours, closed to others."""

    def test_symlinked_directory_is_refused(self, tmp_path: Path) -> None:
        """A checkpoint directory that is a symlink is refused; its target stays empty."""
        target = tmp_path / "target"
        target.mkdir(mode=0o700)
        (tmp_path / "ck").symlink_to(target)
        with pytest.raises(UnsafeCheckpointDirectory, match="symbolic link") as caught:
            WriterLock(tmp_path / "ck").acquire()
        assert caught.value.evidence["target"] == str(target)
        assert list(target.iterdir()) == []

    def test_directory_of_another_user_is_refused(self, tmp_path: Path) -> None:
        """Owned by another uid: refused naming the owner and mode."""
        ck = tmp_path / "ck"
        ck.mkdir(mode=0o700)
        os.chown(ck, NOBODY, NOBODY)
        with pytest.raises(UnsafeCheckpointDirectory, match=f"uid {NOBODY}") as caught:
            WriterLock(ck).acquire()
        assert (caught.value.evidence["owner"], caught.value.evidence["mode"]) == (NOBODY, "0700")
        assert list(ck.iterdir()) == []

    @pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
    def test_directory_others_may_write_is_refused(self, tmp_path: Path, mode: int) -> None:
        """Group- or world-writable: refused naming the mode; nothing written."""
        ck = tmp_path / "ck"
        ck.mkdir()
        ck.chmod(mode)
        with pytest.raises(UnsafeCheckpointDirectory, match=f"mode {mode:04o}"):
            WriterLock(ck).acquire()
        assert list(ck.iterdir()) == []

    def test_a_new_directory_is_private(self, tmp_path: Path) -> None:
        """The writer creates a missing checkpoint directory mode 0700."""
        with WriterLock(tmp_path / "a" / "ck"):
            assert stat.S_IMODE((tmp_path / "a" / "ck").stat().st_mode) == 0o700

    def test_worker_refuses_a_symlinked_directory(self, tmp_path: Path) -> None:
        """The worker exits 14 with checkpoint.directory_unsafe and writes nothing."""
        target = tmp_path / "target"
        target.mkdir(mode=0o700)
        (tmp_path / "ck").symlink_to(target)
        done = subprocess.run(
            worker_argv(job(tmp_path / "j.toml", "links"), tmp_path / "ck"),
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert done.returncode == UnsafeCheckpointDirectory.exit_status == 14
        failed = json.loads(done.stdout.splitlines()[-1])
        assert (failed["code"], failed["path"]) == (
            "checkpoint.directory_unsafe",
            str(tmp_path / "ck"),
        )
        assert list(target.iterdir()) == []


class TestOneWriter:
    """The writer lock survives deletion of its file; a fenced writer never commits."""

    def test_deleting_the_lock_file_admits_no_second_writer(self, tmp_path: Path) -> None:
        """With .writer.lock deleted (or replaced), another process is still refused."""
        ck = tmp_path / "ck"
        with WriterLock(ck):
            (ck / LOCK_NAME).unlink()
            assert samples.try_lock_in_child(ck) == "writer.locked"
            (ck / LOCK_NAME).write_text("1\n")
            assert samples.try_lock_in_child(ck) == "writer.locked"
        assert samples.try_lock_in_child(ck) == "taken"

    def test_a_replaced_directory_stops_the_writer(self, tmp_path: Path) -> None:
        """The directory moved away and a new one made at its path: the commit is refused."""
        ck = tmp_path / "ck"
        with WriterLock(ck) as lock:
            store = CheckpointStore(ck, lock)
            commit_step(store, 2)
            ck.rename(tmp_path / "moved")
            ck.mkdir(mode=0o700)
            with pytest.raises(WriterLockLost) as caught:
                commit_step(store, 4)
        assert isinstance(caught.value, WriterLockedError)
        assert sorted(p.name for p in (tmp_path / "moved").iterdir()) == sorted(
            [file_name(2), LOCK_NAME, GENERATION_NAME]
        )
        assert list(ck.iterdir()) == []

    @pytest.mark.parametrize("current", [2, 0])
    def test_a_fenced_generation_never_commits(self, tmp_path: Path, current: int) -> None:
        """writer.json naming another generation (newer or older) refuses the commit."""
        ck = tmp_path / "ck"
        with WriterLock(ck) as lock:
            store = CheckpointStore(ck, lock)
            commit_step(store, 2)
            files.write_text_atomic(ck / GENERATION_NAME, json.dumps({"generation": current}))
            with pytest.raises(WriterFenced) as caught:
                commit_step(store, 4)
        assert (
            caught.value.evidence["generation"],
            caught.value.evidence["current_generation"],
        ) == (
            1,
            current,
        )
        assert [s for s, _ in CheckpointStore(ck).committed()] == [2]
        assert CheckpointStore(ck).pending() == []

    def test_fencing_between_write_and_rename_leaves_nothing(self, tmp_path: Path) -> None:
        """Fenced while the pending file was written: it is removed and nothing committed."""
        ck = tmp_path / "ck"
        with WriterLock(ck) as lock:
            store = CheckpointStore(ck, lock)
            state = samples.leaves()

            def fence(pending: Path) -> None:
                files.write_text_atomic(ck / GENERATION_NAME, json.dumps({"generation": 2}))

            with pytest.raises(WriterFenced):
                store.commit(4, samples.manifest(state, 4), state, fence)
        assert sorted(p.name for p in ck.iterdir()) == [LOCK_NAME, GENERATION_NAME]

    @pytest.mark.slow
    def test_worker_stops_when_fenced(self, tmp_path: Path, compile_cache: Path) -> None:
        """A running worker whose directory gets a newer generation exits 16, committing nothing."""
        ck = tmp_path / "ck"
        spec = job(
            tmp_path / "f.toml",
            "fenced",
            run={"steps": 400, "checkpoint_every": 2},
            faults={"step_delay_s": 0.01},
        )
        with subprocess.Popen(
            worker_argv(spec, ck, compile_cache),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        ) as proc:
            assert proc.stdout is not None
            events = []
            for line in proc.stdout:
                events.append(json.loads(line))
                if events[-1]["event"] == "checkpoint":
                    files.write_text_atomic(ck / GENERATION_NAME, json.dumps({"generation": 7}))
                    break
            events += [json.loads(line) for line in proc.stdout]
            status = proc.wait(timeout=60)
        assert status == WriterFenced.exit_status == 16
        assert events[-1]["event"] == "failed"
        assert events[-1]["code"] == "writer.fenced"
        reported = {e["step"] for e in events if e["event"] == "checkpoint"}
        assert {s for s, _ in CheckpointStore(ck).committed()} <= reported
        assert not any(p.name.endswith(".pending") for p in ck.iterdir())


class TestLyingHeaders:
    """A header cannot decide an allocation: it is checked against the file and the job first."""

    BIG = 16 << 20  # float32 elements a forged header claims: 64 MiB of (sparse) data

    def select_peak(self, ck: Path) -> tuple[object, int]:
        """Run a restore selection for the sample state; its outcome and peak traced bytes."""
        tracemalloc.start()
        try:
            outcome: object = CheckpointStore(ck).select(samples.expected(samples.leaves()))
        except Exception as error:  # noqa: BLE001 - the refusal is the outcome under test
            outcome = error
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return outcome, peak

    def test_a_forged_size_with_a_wrong_checksum_is_corrupt_and_costs_no_memory(
        self, tmp_path: Path
    ) -> None:
        """256 MiB claimed by a sparse newest file: quarantined as damage, the older one used."""
        ck = tmp_path / "ck"
        ck.mkdir(mode=0o700)
        commit_step(CheckpointStore(ck), 2)
        claimed = [("key", "uint32", [2]), ("params", "float32", [self.BIG])]
        samples.lying_file(ck / file_name(4), claimed, checksum_ok=False)
        selection, peak = self.select_peak(ck)
        assert peak < 32 << 20
        assert selection.checkpoint.manifest.step == 2  # type: ignore[attr-defined]
        assert [s.code for s in selection.skipped] == [ChecksumMismatch.code]  # type: ignore[attr-defined]
        assert (ck / "quarantine" / file_name(4)).stat().st_size > self.BIG

    @pytest.mark.parametrize(
        ("claimed", "error"),
        [
            ([("key", "uint32", [2]), ("params", "float32", [BIG])], TreeMismatch),
            (
                [
                    ("key", "uint32", [2]),
                    ("opt_state/velocity", "float32", [BIG]),
                    ("params", "float32", [4]),
                ],
                ShapeMismatch,
            ),
        ],
    )
    def test_a_sound_file_of_another_tree_is_incompatible_and_costs_no_memory(
        self, tmp_path: Path, claimed: list[tuple[str, str, list[int]]], error: type[Exception]
    ) -> None:
        """A forged file whose checksum holds but whose tree differs is incompatible, as today."""
        ck = tmp_path / "ck"
        ck.mkdir(mode=0o700)
        samples.lying_file(ck / file_name(4), claimed, checksum_ok=True)
        outcome, peak = self.select_peak(ck)
        assert peak < 32 << 20
        assert isinstance(outcome, error)
        assert (ck / file_name(4)).exists()

    def test_negative_extents_cannot_balance_a_huge_one(self, tmp_path: Path) -> None:
        """Shapes [n] and [-n] sum to no data: the header is unreadable, not a crash."""
        path = samples.lying_file(
            tmp_path / "f", [("a", "float32", [4]), ("b", "float32", [-4])], checksum_ok=True
        )
        with pytest.raises(UnreadableCheckpoint, match="negative"):
            format.read(path)
