"""One real single-node Slurm per test session, shared by every Slurm test, and one of
several nodes for the tests that need them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.slurm.cluster import Cluster, Unavailable, ensure_installed
from tests.slurm.nodes import Nodes


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """munged, slurmctld and slurmd on loopback, installed with apt-get when missing."""
    lock = tmp_path_factory.getbasetemp().parent / "slurm-install.lock"
    try:
        ensure_installed(lock)
    except Unavailable as error:
        pytest.skip(f"SLURM TESTS SKIPPED: the Slurm packages cannot be installed: {error}")
    cluster = Cluster()
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture
def slurm(slurm_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Cluster:
    """The session's cluster, with SLURM_CONF set for the daemons this test starts."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    return slurm_cluster


@pytest.fixture(scope="session")
def slurm_nodes_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    """Three nodes, each slurmd in its own network namespace (the repo's ``slurm/cluster.sh``)."""
    lock = tmp_path_factory.getbasetemp().parent / "slurm-install.lock"
    try:
        ensure_installed(lock)
    except Unavailable as error:
        pytest.skip(f"SLURM TESTS SKIPPED: the Slurm packages cannot be installed: {error}")
    cluster = Nodes().start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def slurm_nodes(slurm_nodes_cluster: Nodes, monkeypatch: pytest.MonkeyPatch) -> Nodes:
    """The session's several-node cluster, with SLURM_CONF set for the daemons this test starts."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_nodes_cluster.conf))
    return slurm_nodes_cluster
