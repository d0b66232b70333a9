"""The checkpoint written in one pass (`jobwarden.checkpoint.onepass`): the same bytes as
`format.encode`, verified on load, through ``O_DIRECT`` and through the page cache alike.

Real files and real fsync in pytest's temporary directory.  Sizes straddle the
4096-byte blocks a direct write is cut into, and a state over the size from
which the direct path is taken runs it for real.
"""

from __future__ import annotations

import fcntl
import os
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
