"""What a checkpoint says about itself: the manifest, its leaves and their dtypes.

Parsed once from the file's header into frozen objects; anything missing,
mistyped or impossible (an unsupported dtype, a negative extent, a leaf path
twice) makes the file unreadable.  The container around it is `format`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from jobwarden.checkpoint.errors import SchemaMismatch, UnreadableCheckpoint
from jobwarden.decoding import loads_json
from jobwarden.hashing import Leaves

SCHEMA_VERSION = 1

SAFETENSORS_DTYPES: dict[str, str] = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
}
NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
    for name in SAFETENSORS_DTYPES
}


@dataclass(frozen=True)
class LeafSpec:
    """One leaf of the saved state: its path, numpy dtype name and shape."""

    path: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes this leaf occupies in the data region."""
        count = 1
        for extent in self.shape:
            count *= extent
        return count * NUMPY_DTYPES[self.dtype].itemsize


@dataclass(frozen=True)
class Provenance:
    """Where a checkpoint came from; compared field by field on restore."""

    config_hash: str
    data_hash: str
    source_hash: str
    runtime: Mapping[str, str]
    writer_generation: int


@dataclass(frozen=True)
class Manifest:
    """Everything about a checkpoint except its array bytes."""

    task: str
    job_id: str
    step: int
    key_impl: str
    leaves: tuple[LeafSpec, ...]
    train: Mapping[str, Any]
    provenance: Provenance
    state_hash: str
    components: Mapping[str, str]
    created: float
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> str:
        """The manifest as the compact JSON text stored in the header."""
        record = {
            "schema_version": self.schema_version,
            "task": self.task,
            "job_id": self.job_id,
            "step": self.step,
            "key_impl": self.key_impl,
            "leaves": [[leaf.path, leaf.dtype, list(leaf.shape)] for leaf in self.leaves],
            "train": dict(self.train),
            "provenance": {
                "config_hash": self.provenance.config_hash,
                "data_hash": self.provenance.data_hash,
                "source_hash": self.provenance.source_hash,
                "runtime": dict(self.provenance.runtime),
                "writer_generation": self.provenance.writer_generation,
            },
            "state_hash": self.state_hash,
            "components": dict(self.components),
            "created": self.created,
        }
        return json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, path: str, text: str) -> Manifest:
        """Parse manifest text; any missing or mistyped field makes the file unreadable."""
        try:
            raw = loads_json(text)
            version = raw["schema_version"]
            if version != SCHEMA_VERSION:
                raise SchemaMismatch(path, "schema_version", version, SCHEMA_VERSION)
            prov = raw["provenance"]
            leaves = tuple(
                LeafSpec(str(p), str(d), tuple(_extent(n) for n in s)) for p, d, s in raw["leaves"]
            )
            for leaf in leaves:
                if leaf.dtype not in NUMPY_DTYPES:
                    raise ValueError(f"leaf {leaf.path} has unsupported dtype {leaf.dtype}")
            if len({leaf.path for leaf in leaves}) != len(leaves):
                raise ValueError("a leaf path appears twice")
            return cls(
                task=str(raw["task"]),
                job_id=str(raw["job_id"]),
                step=_int(raw["step"]),
                key_impl=str(raw["key_impl"]),
                leaves=leaves,
                train=dict(raw["train"]),
                provenance=Provenance(
                    config_hash=str(prov["config_hash"]),
                    data_hash=str(prov["data_hash"]),
                    source_hash=str(prov["source_hash"]),
                    runtime={str(k): str(v) for k, v in prov["runtime"].items()},
                    writer_generation=_int(prov["writer_generation"]),
                ),
                state_hash=str(raw["state_hash"]),
                components={str(k): str(v) for k, v in raw["components"].items()},
                created=float(raw["created"]),
            )
        except SchemaMismatch:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise UnreadableCheckpoint(path, f"manifest is malformed: {error!r}") from error


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, found {value!r}")
    return value


def _extent(value: Any) -> int:
    """A shape extent: a non-negative integer (a negative one could balance a huge one)."""
    if _int(value) < 0:
        raise ValueError(f"negative shape extent {value}")
    return int(value)


def leaf_specs(leaves: Leaves) -> tuple[LeafSpec, ...]:
    """Describe ``leaves`` for a manifest; refuses dtypes safetensors cannot hold."""
    specs = []
    for path, array in leaves:
        if array.dtype.name not in SAFETENSORS_DTYPES:
            raise TypeError(f"leaf {path}: dtype {array.dtype} cannot be checkpointed")
        specs.append(LeafSpec(path, array.dtype.name, tuple(array.shape)))
    return tuple(specs)
