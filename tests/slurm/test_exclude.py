"""Which nodes a job's next attempt excludes, how members are spread and find their
coordinator: pure, no Slurm."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwarden.daemon.launch.base import LaunchSpec
from jobwarden.daemon.launch.slurm.exclude import failed, plan
from jobwarden.daemon.launch.slurm.script import SlurmSettings, member_script
from jobwarden.sdk.distributed import (
    Membership,
    MembershipError,
    await_coordinator,
    publish_coordinator,
)

STATES = {"n1": "IDLE", "n2": "DOWN+NOT_RESPONDING", "n3": "MIXED"}


class TestFailed:
    def test_down_drained_and_not_responding_nodes_have_failed(self) -> None:
        """DOWN, DRAIN, NOT_RESPONDING flags and a trailing * mark a failed node."""
        states = ["DOWN+NOT_RESPONDING", "IDLE+DRAIN", "MIXED*", "IDLE", "ALLOCATED", "MIXED"]
        assert [failed(s) for s in states] == [True, True, True, False, False, False]


class TestPlan:
    def test_a_failed_node_the_attempt_ran_on_is_excluded(self) -> None:
        """Of the nodes the attempt ran on, the one Slurm reports down is excluded."""
        assert plan(set(), {"n1", "n2"}, STATES, 2) == ["n2"]

    def test_an_earlier_exclusion_is_kept_once_the_node_is_back(self) -> None:
        """A node excluded before stays excluded though Slurm has it idle again."""
        back = {**STATES, "n2": "IDLE"}
        assert plan({"n2"}, {"n1", "n3"}, back, 2) == ["n2"]

    def test_nothing_is_excluded_when_too_few_nodes_would_be_left(self) -> None:
        """With 3 nodes and 3 needed, the failed one is not excluded (sbatch would refuse)."""
        assert plan(set(), {"n1", "n2"}, STATES, 3) == []


def spec(tmp_path: Path) -> LaunchSpec:
    """A launch of 3 members."""
    return LaunchSpec(job_id="j", attempt=2, argv=["worker"], folder=tmp_path, env={}, processes=3)


class TestPlacement:
    def test_members_are_spread_over_the_nodes_asked_for(self, tmp_path: Path) -> None:
        """3 members over 2 nodes: --nodes=2, at most 2 a node, and the exclusion."""
        settings = SlurmSettings(nodes=2, exclude=("n2",))
        options = settings.sbatch_options(spec(tmp_path))
        wanted = ["--nodes=2", "--ntasks-per-node=2", "--exclude=n2", "--ntasks=3"]
        assert [option in options for option in wanted] == [True] * 4

    def test_the_coordinator_is_the_first_node_of_the_allocation(self, tmp_path: Path) -> None:
        """The member script takes the coordinator's host from the job's node list and
        names the rendezvous file in the attempt folder; it picks no port itself."""
        script = member_script(spec(tmp_path))
        assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1' in script
        assert f"JOBWARDEN_COORDINATOR_FILE={tmp_path / 'coordinator'}" in script


class TestRendezvous:
    def test_member_0_publishes_a_port_the_others_read(self, tmp_path: Path) -> None:
        """Member 0 writes host:port with a port free on its node; a member reads the same."""
        path = tmp_path / "coordinator"
        published = publish_coordinator("n1", path)
        host, port = published.split(":")
        assert (host, int(port) > 0, await_coordinator(path, 1.0)) == ("n1", True, published)

    def test_no_publication_in_time_is_a_membership_error(self, tmp_path: Path) -> None:
        """A member that finds nothing published within its timeout says where it looked."""
        path = tmp_path / "coordinator"
        with pytest.raises(MembershipError) as raised:
            await_coordinator(path, 0.1)
        assert str(path) == raised.value.evidence["path"]

    def test_the_membership_names_the_rendezvous_file(self) -> None:
        """JOBWARDEN_COORDINATOR_FILE reaches the membership beside the coordinator's host."""
        env = {
            "JOBWARDEN_PROCESS_ID": "1",
            "JOBWARDEN_PROCESSES": "2",
            "JOBWARDEN_COORDINATOR": "n1",
            "JOBWARDEN_COORDINATOR_FILE": "attempt/coordinator",
        }
        assert Membership(1, 2, "n1", "attempt/coordinator") == Membership.from_environ(env)
