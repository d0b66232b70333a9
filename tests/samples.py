"""Small checkpoint states, manifests and expectations for the safety and signing tests."""

from __future__ import annotations

import dataclasses
import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import xxhash

from jobwarden.checkpoint import format
from jobwarden.checkpoint.manifest import SAFETENSORS_DTYPES
from jobwarden.checkpoint.validate import Expected
from jobwarden.hashing import Leaves, state_hash

TRAIN = {"seed": 3}
RUNTIME = {"backend": "cpu"}


def leaves(scale: float = 1.0) -> Leaves:
    """A small state: params, momentum and a key."""
    return [
        ("key", np.array([0, 3], np.uint32)),
        ("opt_state/velocity", np.arange(4, dtype=np.float32) * scale),
        ("params", np.linspace(-1, 1, 4, dtype=np.float32) * scale),
    ]


def manifest(state: Leaves, step: int = 2, generation: int = 1) -> format.Manifest:
    """A manifest describing ``state``."""
    digest, components = state_hash(state, step)
    return format.Manifest(
        task="t",
        job_id="j",
        step=step,
        key_impl="threefry2x32",
        leaves=format.leaf_specs(state),
        train=TRAIN,
        provenance=format.Provenance("cfg", "data", "src", RUNTIME, generation),
        state_hash=digest,
        components=components,
        created=time.time(),
    )


def expected(state: Leaves, **changes: object) -> Expected:
    """What a restoring attempt of the same experiment expects."""
    base = Expected(
        task="t",
        train=TRAIN,
        config_hash="cfg",
        data_hash="data",
        source_hash="src",
        runtime=RUNTIME,
        leaves=format.leaf_specs(state),
        max_step=100,
        generation=1,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def lying_file(path: Path, claimed: list[tuple[str, str, list[int]]], checksum_ok: bool) -> Path:
    """A sparse file whose header claims ``claimed`` leaves (path, dtype, shape) of zeros.

    Its header is consistent and its size what the header implies, but the
    data region is a hole: on disk it costs nothing, in memory what it claims.
    ``checksum_ok`` stores the true checksum of those zeros (a forger's file)
    instead of a wrong one.
    """
    specs = tuple(format.LeafSpec(p, d, tuple(s)) for p, d, s in claimed)
    fake = dataclasses.replace(manifest(leaves()), leaves=specs)
    text = fake.to_json()
    total = sum(spec.nbytes for spec in specs)
    digest = "xxh3-128:" + "0" * 32
    if checksum_ok:
        hasher = xxhash.xxh3_128(text.encode())
        zeros = bytes(16 << 20)
        for start in range(0, total, len(zeros)):
            hasher.update(zeros[: min(len(zeros), total - start)])
        digest = f"xxh3-128:{hasher.hexdigest()}"
    table: dict[str, object] = {"__metadata__": {"jobwarden": text, "checksum": digest}}
    offset = 0
    for spec in specs:
        dtype = SAFETENSORS_DTYPES[spec.dtype]
        table[spec.path] = {
            "dtype": dtype,
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    header = json.dumps(table, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(header)) + header)
        out.truncate(8 + len(header) + total)
    return path


def try_lock_in_child(directory: Path) -> str:
    """Acquire the writer lock on ``directory`` in a new process; ``taken`` or the refusal code."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\nfrom pathlib import Path\n"
            "from jobwarden.checkpoint.lock import WriterLock\n"
            "from jobwarden.errors import JobwardenError\n"
            "try:\n    WriterLock(Path(sys.argv[1])).acquire()\n"
            "except JobwardenError as e:\n    print(e.code)\nelse:\n    print('taken')\n",
            str(directory),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout.strip()
