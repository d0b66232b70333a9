"""The combined state hash of a state laid out over two real JAX processes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jobwarden.checkpoint.shardrecord import Box
from jobwarden.hashing import StateHasher, state_hash
from jobwarden.shards.hash import layout_state_hash
from tests import sharded_members

MEMBER = Path(__file__).with_name("sharded_members.py")
ROOT = MEMBER.parent.parent


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_members(*extra: str) -> list[dict[str, Any]]:
    """Both members' reports, in member order."""
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(MEMBER), str(i), "2", port, *extra],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def layout_from(report: dict[str, Any]) -> dict[str, tuple[tuple[Box, int], ...]]:
    """The layout a member printed, as `jobwarden.shards.hash.Layout`."""
    return {
        path: tuple((tuple((a, b) for a, b in box), owner) for box, owner in boxes)
        for path, boxes in report["layout"].items()
    }


@pytest.fixture(scope="module")
def reports() -> list[dict[str, Any]]:
    """The two members' hashes of the unchanged state."""
    return run_members()


class TestCombinedHash:
    """Each member hashes its own boxes; the combination is one hash."""

    def test_every_member_computes_the_same_hash(self, reports: list[dict[str, Any]]) -> None:
        """Member 0 and member 1 print the same combined hash."""
        assert reports[0]["sharded"] == reports[1]["sharded"]

    def test_the_layout_splits_each_laid_out_leaf_between_the_members(
        self, reports: list[dict[str, Any]]
    ) -> None:
        """Three leaves are laid out, each in two boxes, one owned by each member."""
        layout = layout_from(reports[0])
        assert sorted(sharded_members.SPLIT) == sorted(layout)
        assert all([owner for _, owner in boxes] == [0, 1] for boxes in layout.values())

    def test_equals_the_one_process_hash_through_the_same_layout(
        self, reports: list[dict[str, Any]]
    ) -> None:
        """The state held whole in this process, hashed through the layout, is the same."""
        leaves = list(sharded_members.state_values().items())
        expected, components = layout_state_hash(leaves, 5, layout_from(reports[0]))
        assert expected == reports[0]["sharded"]
        assert components == reports[1]["components"]

    def test_equals_the_hash_of_the_same_state_replicated(
        self, reports: list[dict[str, Any]]
    ) -> None:
        """The same arrays replicated over the same mesh hash the same through the layout."""
        assert [r["replicated"] for r in reports] == [r["sharded"] for r in reports]

    def test_one_bit_in_one_members_shard_changes_the_hash_seen_by_both(
        self, reports: list[dict[str, Any]]
    ) -> None:
        """Member 1 flips a bit of its own shard: both members' combined hash changes."""
        flipped = run_members("flip")
        assert flipped[0]["sharded"] == flipped[1]["sharded"]
        assert flipped[0]["sharded"] != reports[0]["sharded"]


class TestWithoutLayout:
    """A state with no laid-out leaf hashes exactly as before."""

    def test_an_empty_layout_is_the_plain_state_hash(self) -> None:
        """`layout_state_hash` with no layout equals `hashing.state_hash` and `StateHasher`."""
        leaves = list(sharded_members.state_values().items())
        expected = state_hash(leaves, 5)
        assert expected == layout_state_hash(leaves, 5, {})
        assert expected == StateHasher()(leaves, 5)

    def test_the_layout_changes_the_hash_of_the_same_values(self) -> None:
        """Through boxes the hash is another construction than the flat one, by design."""
        leaves = list(sharded_members.state_values().items())
        box: Box = ((0, 4), (0, 6))
        other: Box = ((4, 8), (0, 6))
        layout = {"params/w1": ((box, 0), (other, 1))}
        assert layout_state_hash(leaves, 5, layout)[0] != state_hash(leaves, 5)[0]
        assert np.asarray(leaves[0][1]).shape == (8, 6)


class TestShardedMLP:
    """The built-in ``sharded_mlp`` task in two real processes."""

    def test_lays_out_every_weight_bias_and_moment_and_repeats_bit_for_bit(self) -> None:
        """Two runs of 3 updates give one combined hash; params, mu and nu are laid out."""
        first, second = run_members("task", "3"), run_members("task", "3")
        assert first[0]["sharded"] == first[1]["sharded"] == second[0]["sharded"]
        laid_out = first[0]["laid_out"]
        assert "params/layer00/w" in laid_out
        assert "opt_state/0/mu/layer01/w" in laid_out
        assert "opt_state/0/nu/layer02/w" in laid_out
        assert "key" not in laid_out

    def test_a_different_number_of_updates_is_a_different_state(self) -> None:
        """After 2 updates the hash is not the one after 3."""
        assert run_members("task", "2")[0]["sharded"] != run_members("task", "3")[0]["sharded"]


def test_split_axis_prefers_the_last_axis_then_the_first() -> None:
    """A (64, 1) weight splits on its rows, a (16, 64) one on its columns, (1,) not at all."""
    from jobwarden.tasks.sharded_mlp import split_axis

    assert [
        split_axis((16, 64), 2),
        split_axis((64, 1), 2),
        split_axis((1,), 2),
        split_axis((16, 64), 1),
    ] == [1, 0, None, None]
