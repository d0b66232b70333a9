"""The checkpoint written in one pass (`jobwarden.checkpoint.onepass`): the same bytes as
`format.encode`, verified on load, through ``O_DIRECT`` and through the page cache alike.

Real files and real fsync in pytest's temporary directory.  Sizes straddle the
4096-byte blocks a direct write is cut into, and a state over the size from
which the direct path is taken runs it for real.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from jobwarden.checkpoint import format, onepass
from jobwarden.checkpoint.errors import ChecksumMismatch
from jobwarden.checkpoint.store import CheckpointStore
from jobwarden.hashing import Leaves
from tests.test_checkpoint import manifest_for, sample_leaves

KEY = b"k" * 32
BIG = onepass.DIRECT_MIN_BYTES


def large_leaves(seed: int, extra: int = 0) -> Leaves:
    """A state past the direct-write size whose leaves end off every block boundary."""
    rng = np.random.default_rng(seed)
    return [
        ("key", np.array([seed, 3], np.uint32)),
        ("opt_state/mu", rng.standard_normal(BIG // 8 + 1023 + extra, dtype=np.float32)),
        ("opt_state/count", np.array(seed, np.int32)),
        ("params/w", rng.standard_normal(BIG // 8 + 7, dtype=np.float32)),
        ("params/big_endian", np.arange(5001, dtype=">f8")),
    ]


def written(
    path: Path, manifest: format.Manifest, leaves: Leaves, key: bytes | None, direct: bool
) -> bytes:
    """The bytes `onepass.write` puts in a new file; it leaves the file without ``O_DIRECT``."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        size, _ = onepass.write(fd, manifest, leaves, key, direct)
        assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT
    finally:
        os.close(fd)
    data = path.read_bytes()
    assert size == len(data)
    return data


@pytest.mark.parametrize("key", [None, KEY], ids=["unsigned", "signed"])
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "cached"])
@pytest.mark.parametrize("extra", [0, 1])
def test_one_pass_writes_the_bytes_encode_gives(
    tmp_path: Path, key: bytes | None, direct: bool, extra: int
) -> None:
    """Byte for byte the two-pass encoding, however the data falls on blocks, signed or not."""
    leaves = large_leaves(1, extra)
    manifest = manifest_for(leaves)
    expected = b"".join(bytes(view) for view in format.encode(manifest, leaves, key))
    found = written(tmp_path / "f", manifest, leaves, key, direct)
    assert len(expected) == len(found)
    assert expected == found


@pytest.mark.parametrize("key", [None, KEY], ids=["unsigned", "signed"])
def test_a_small_state_is_the_same_bytes_too(tmp_path: Path, key: bytes | None) -> None:
    """Below the direct-write size: the same bytes as `format.encode`."""
    leaves = sample_leaves()
    manifest = manifest_for(leaves)
    expected = b"".join(bytes(view) for view in format.encode(manifest, leaves, key))
    assert expected == written(tmp_path / "f", manifest, leaves, key, direct=True)


def many_small_leaves(count: int) -> Leaves:
    """More small leaves than one gathered write takes, of sizes that vary."""
    return [(f"params/l{i:04d}", np.arange(i % 7 + 1, dtype=np.float32) + i) for i in range(count)]


@pytest.mark.parametrize("short_by", [0, 1, 5], ids=["whole", "short", "shorter"])
def test_gathered_writes_of_small_leaves_give_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, short_by: int
) -> None:
    """The small leaves go out several to a system call, at most `MAX_GATHERED` to one; a
    call that writes less than it was given (here 1 or 5 bytes short of the first piece) is
    finished piece by piece: the file is byte for byte `format.encode`'s."""
    leaves = many_small_leaves(2 * onepass.MAX_GATHERED + 17)
    manifest = manifest_for(leaves)
    calls: list[int] = []
    real = os.pwritev

    def pwritev(fd: int, views: list[memoryview], offset: int) -> int:
        calls.append(len(views))
        if not short_by:
            return real(fd, views, offset)
        return os.pwrite(fd, bytes(views[0][: max(len(views[0]) - short_by, 0)]), offset)

    monkeypatch.setattr(onepass.os, "pwritev", pwritev)
    expected = b"".join(bytes(view) for view in format.encode(manifest, leaves, None))
    assert expected == written(tmp_path / "f", manifest, leaves, None, direct=False)
    assert max(calls) == onepass.MAX_GATHERED
    assert len(calls) == 3


def test_the_checksum_written_in_one_pass_is_the_one_verified_on_load(tmp_path: Path) -> None:
    """A store's commit reads back with every leaf equal, and a byte flipped in the first
    block's data, in a direct block or in the cached tail is a checksum mismatch."""
    leaves = large_leaves(2)
    path, size = CheckpointStore(tmp_path).commit(4, manifest_for(leaves), leaves)
    loaded = format.read(path)
    for name, array in leaves:
        assert np.array_equal(array, loaded.arrays[name]), name
    start = onepass.header_size(loaded.manifest, signed=False)
    for at in (start, start + (-start % onepass.BLOCK) + 5, size // 2, size - 1):
        damaged = tmp_path / f"damaged-{at}.safetensors"
        data = bytearray(path.read_bytes())
        data[at] ^= 0x40
        damaged.write_bytes(bytes(data))
        with pytest.raises(ChecksumMismatch):
            format.read(damaged)


def test_a_changed_leaf_is_written_and_checksummed_afresh(tmp_path: Path) -> None:
    """Two commits of states alike but for one element: the second file holds the change and
    its own checksum, nothing of the first."""
    store = CheckpointStore(tmp_path)
    first = large_leaves(3)
    changed = [(name, array.copy()) for name, array in first]
    changed[3][1][-1] += 1.0
    one, _ = store.commit(1, manifest_for(first, step=1), first)
    two, _ = store.commit(2, manifest_for(changed, step=2), changed)
    loaded = [format.read(path) for path in (one, two)]
    assert loaded[0].checksum != loaded[1].checksum
    assert loaded[1].arrays["params/w"][-1] == changed[3][1][-1]
    assert loaded[0].arrays["params/w"][-1] == first[3][1][-1]


class DirectWrites:
    """``os.pwrite`` as it is, but recording each write's offset and length and whether the
    file had ``O_DIRECT``, failing a chosen direct write with a chosen error: a fake for a
    file system that accepts the flag and then refuses a write, or a device that fails one."""

    def __init__(self, fail_at: int | None, code: int) -> None:
        self.real = os.pwrite
        self.fail_at = fail_at
        self.code = code
        self.direct = 0
        self.calls: list[tuple[int, int, bool]] = []

    def __call__(self, fd: int, data: memoryview, offset: int) -> int:
        is_direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
        self.calls.append((offset, len(data), is_direct))
        if is_direct:
            self.direct += 1
            if self.fail_at is not None and self.direct >= self.fail_at:
                del data  # as the real call, keep no view of the buffer in the traceback
                raise OSError(self.code, os.strerror(self.code))
        return self.real(fd, data, offset)


@pytest.mark.parametrize("fail_at", [1, 3], ids=["first", "third"])
def test_a_direct_write_refused_goes_through_the_cache_with_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: int
) -> None:
    """``O_DIRECT`` accepted at fcntl and refused at a write (EINVAL), first or mid-way: the
    rest goes through the page cache, the bytes still those of `format.encode`."""
    leaves = large_leaves(4, extra=1)
    manifest = manifest_for(leaves)
    expected = b"".join(bytes(view) for view in format.encode(manifest, leaves, KEY))
    writes = DirectWrites(fail_at, errno.EINVAL)
    monkeypatch.setattr(os, "pwrite", writes)
    found = written(tmp_path / "f", manifest, leaves, KEY, direct=True)
    assert expected == found
    assert fail_at == writes.direct


def test_the_data_is_written_in_order_one_piece_after_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The direct pieces are written in order, each where the one before ended, and the data's
    writes cover the file once, the header's write at offset 0 last."""
    leaves = large_leaves(5)
    manifest = manifest_for(leaves)
    writes = DirectWrites(None, 0)
    monkeypatch.setattr(os, "pwrite", writes)
    data = written(tmp_path / "f", manifest, leaves, None, direct=True)
    assert writes.calls[-1][0] == 0
    ends = [offset + length for offset, length, _ in writes.calls[:-1]]
    starts = [offset for offset, _, _ in writes.calls[1:-1]]
    assert ends[:-1] == starts
    assert len(data) == ends[-1]
    assert writes.calls[-1][1] == writes.calls[0][0]
    assert sum(direct for _, _, direct in writes.calls) >= BIG // onepass.DIRECT_PIECE


def test_a_failed_direct_write_is_raised_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device error on a direct write mid-way reaches the committer as itself, no pending
    or committed file is left behind, and the writer's thread is gone (the piece queued
    behind the failed one may still be tried)."""
    leaves = large_leaves(6)
    store = CheckpointStore(tmp_path)
    before = set(tmp_path.iterdir())
    threads = threading.active_count()
    writes = DirectWrites(3, errno.EIO)
    monkeypatch.setattr(os, "pwrite", writes)
    with pytest.raises(OSError, match=os.strerror(errno.EIO)) as raised:
        store.commit(7, manifest_for(leaves, step=7), leaves)
    assert raised.value.errno == errno.EIO
    assert writes.direct in (3, 4)
    assert before == set(tmp_path.iterdir())
    assert threads == threading.active_count()
