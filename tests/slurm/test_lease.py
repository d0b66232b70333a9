"""The writer lease: of two writers racing on one checkpoint directory, the older is fenced.

The second writer stands for an attempt on another node, where flock does not
see the first one's lock (node-local on many shared filesystems): it claims
the lease directly, as its own WriterLock would there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwarden.checkpoint import lease
from jobwarden.checkpoint.lock import WriterLock
from jobwarden.checkpoint.store import CheckpointStore
from tests import samples


@pytest.fixture(autouse=True)
def under_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer runs as Slurm job 101, so its WriterLock takes the lease."""
    monkeypatch.setenv(lease.SLURM_JOB_ENV, "101")


def commit(store: CheckpointStore, step: int) -> None:
    """Commit the sample state at ``step``."""
    state = samples.leaves()
    store.commit(step, samples.manifest(state, step), state)


class TestLease:
    def test_the_writer_holds_the_lease_of_its_generation_and_slurm_job(
        self, tmp_path: Path
    ) -> None:
        """WriterLock under Slurm: writer.lease names generation 1 and Slurm job 101."""
        with WriterLock(tmp_path / "ck") as lock:
            held = lease.read(tmp_path / "ck")
        assert (lock.leased, held and held.generation, held and held.slurm_job) == (True, 1, "101")

    def test_the_older_writers_commit_is_refused_once_a_newer_one_holds_the_lease(
        self, tmp_path: Path
    ) -> None:
        """A commits step 2; B (generation 2, Slurm job 202) takes over; A's step 4 is refused."""
        ck = tmp_path / "ck"
        with WriterLock(ck) as older:
            store = CheckpointStore(ck, older)
            commit(store, 2)
            lease.take(ck, older.generation + 1, "202")
            with pytest.raises(lease.LeaseLost) as refused:
                commit(store, 4)
        assert [step for step, _ in CheckpointStore(ck).committed()] == [2]
        assert CheckpointStore(ck).pending() == []
        evidence = refused.value.evidence
        assert (evidence["generation"], evidence["current_generation"]) == (1, 2)
        assert evidence["current_slurm_job"] == "202"
        assert refused.value.code == "writer.lease_lost"

    def test_two_writers_of_the_same_generation_cannot_both_claim_it(self, tmp_path: Path) -> None:
        """Both read generation 0 and take 1: O_EXCL lets exactly one have the lease."""
        ck = tmp_path / "ck"
        with WriterLock(ck):
            with pytest.raises(lease.LeaseLost, match="already claimed"):
                lease.take(ck, 1, "202")
            held = lease.read(ck)
        assert (held and held.slurm_job) == "101"

    def test_a_lease_never_goes_back_to_an_older_generation(self, tmp_path: Path) -> None:
        """Generation 3 holds it: a late claim of generation 2 is refused, the lease unchanged."""
        ck = tmp_path / "ck"
        ck.mkdir()
        lease.take(ck, 3, "303")
        with pytest.raises(lease.LeaseLost, match="a newer writer holds it"):
            lease.take(ck, 2, "202")
        assert (held := lease.read(ck)) is not None
        assert (held.generation, held.slurm_job) == (3, "303")
