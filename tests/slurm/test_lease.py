"""The writer lease: of two writers racing on one checkpoint directory, the older is fenced.

The second writer stands for an attempt on another node, where flock does not
see the first one's lock (node-local on many shared filesystems): it claims
the lease directly, as its own WriterLock would there.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from jobwarden.checkpoint import lease
from jobwarden.checkpoint.lock import WriterLock
from jobwarden.checkpoint.store import CheckpointStore
from jobwarden.daemon.launch.slurm.lease import LeaseState, judge, judge_directory
from jobwarden.daemon.launch.slurm.state import SlurmJob
from tests import samples
from tests.helpers import wait_until
from tests.slurm.cluster import Cluster


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

    def test_every_commit_renews_the_writers_own_claim(self, tmp_path: Path) -> None:
        """A commit's check touches writer.lease.1 (never writer.lease): the renewal time moves."""
        ck = tmp_path / "ck"
        with WriterLock(ck) as lock:
            claim = ck / f"{lease.LEASE_NAME}.{lock.generation}"
            os.utime(claim, (1000.0, 1000.0))
            commit(CheckpointStore(ck, lock), 2)
            renewed = lease.renewed(ck, lock.generation)
        assert (renewed or 0.0) > 1000.0


def running(state: str) -> SlurmJob:
    """Slurm job 101 in ``state``."""
    return SlurmJob("101", state)


class TestJudgement:
    HELD = lease.Lease(1, "101", "node1", 42, 0.0)
    """A lease renewed at the epoch: as old as a clock could make it."""

    def test_a_running_job_keeps_its_lease_live_however_old_the_renewal(self) -> None:
        """RUNNING, PENDING, COMPLETING: live; the renewal time does not enter."""
        states = [judge(self.HELD, running(s)).state for s in ("RUNNING", "PENDING", "COMPLETING")]
        assert states == [LeaseState.LIVE] * 3

    def test_an_ended_requeued_or_forgotten_job_leaves_a_stale_lease(self) -> None:
        """COMPLETED, NODE_FAIL, requeued, and a job Slurm no longer knows: stale."""
        requeued = SlurmJob("101", "PENDING", restarts=1)
        jobs = [running("COMPLETED"), running("NODE_FAIL"), requeued, None]
        assert [judge(self.HELD, job).state for job in jobs] == [LeaseState.STALE] * 4

    def test_what_cannot_be_judged_is_unknown(self) -> None:
        """No Slurm job in the lease, or no answer from slurmctld: unknown, never stale."""
        off_slurm = lease.Lease(1, None, "node1", 42, 0.0)
        found = [judge(off_slurm, None).state, judge(self.HELD, None, known=False).state]
        assert (found, judge(None, None).state) == ([LeaseState.UNKNOWN] * 2, LeaseState.NONE)


@pytest.mark.slow
def test_a_lease_is_judged_from_the_real_slurm_job_it_names(slurm: Cluster, tmp_path: Path) -> None:
    """A lease naming a running Slurm job is live; once scancel ended it, stale."""
    job_id = slurm.run("sbatch", "--parsable", "--output=/dev/null", "--wrap=sleep 60").strip()
    ck = tmp_path / "ck"
    ck.mkdir()
    lease.take(ck, 1, job_id)
    wait_until(
        lambda: asyncio.run(judge_directory(ck)),
        lambda judged: judged.state is LeaseState.LIVE,
        timeout=20,
        what=f"a live lease of Slurm job {job_id}",
    )
    slurm.run("scancel", job_id)
    stale = wait_until(
        lambda: asyncio.run(judge_directory(ck)),
        lambda judged: judged.state is LeaseState.STALE,
        timeout=30,
        what=f"a stale lease once Slurm job {job_id} is cancelled",
    )
    assert (stale.why, stale.held and stale.held.generation) == (
        f"Slurm job {job_id} is CANCELLED",
        1,
    )
