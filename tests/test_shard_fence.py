"""A member of a sharded job that does not hold the writer lock is fenced before each rename
of its shard: by ``writer.json``'s generation, and where writers take the lease (under
Slurm, where flock may be node-local) by the lease as well.

Real lock, real files; the members' processes are left out: the fence is what each
member calls before its rename (tests/test_sharded_commit.py drives whole members).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwarden.checkpoint import lease
from jobwarden.checkpoint.errors import WriterFenced
from jobwarden.checkpoint.lease import LeaseLost
from jobwarden.checkpoint.lock import WriterLock
from jobwarden.shards.attach import generation_fence


def test_a_newer_writer_fences_a_member_of_the_older_generation(tmp_path: Path) -> None:
    with WriterLock(tmp_path) as first:
        fence = generation_fence(tmp_path, first.generation)
        fence()  # the generation its member 0 holds: the rename may go ahead
    with WriterLock(tmp_path), pytest.raises(WriterFenced, match="names generation 2"):
        fence()


def test_under_a_lease_a_member_is_fenced_by_the_lease_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """writer.json still names the member's generation (say a writer on another node took
    the lease and has not written writer.json yet): the lease alone fences the member,
    and the member's check does not renew the holder's claim."""
    monkeypatch.setenv(lease.LEASE_ENV, "1")
    with WriterLock(tmp_path) as holder:
        generation = holder.generation
        fence = generation_fence(tmp_path, generation)
        claim = tmp_path / f"{lease.LEASE_NAME}.{generation}"
        before = claim.stat().st_mtime_ns
        fence()
        assert claim.stat().st_mtime_ns == before
        lease.take(tmp_path, generation + 1, "4242")
        with pytest.raises(LeaseLost, match="names generation 2"):
            fence()
    monkeypatch.delenv(lease.LEASE_ENV)
    generation_fence(tmp_path, generation)()  # no lease wanted: writer.json alone
