"""``wardenctl inspect FILE``: a checkpoint's identity and verdict, without a daemon.

Operators use it to see which checkpoint a recovery accepted: step, state
hash, provenance, sizes, and whether the checksum verifies.  A damaged file
is still described from its header where the header is readable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobwarden.checkpoint import format
from jobwarden.checkpoint.errors import CheckpointError
from jobwarden.proof.shardview import describe_step, render_step
from jobwarden.shards.read import is_record

VALUES_LIMIT = 4096


def describe(path: Path, values: bool = False) -> dict[str, Any]:
    """Everything `inspect` reports about ``path``, JSON-ready (a sharded step by its record)."""
    if is_record(path):
        return describe_step(path, values)
    record: dict[str, Any] = {"file": str(path)}
    checkpoint: format.Checkpoint | None = None
    try:
        checkpoint = format.read(path)
        manifest, checksum, size = checkpoint.manifest, checkpoint.checksum, checkpoint.size
        record["verdict"] = {
            "ok": True,
            "checks": list(checkpoint.checks),
            "message": f"checksum {checksum} verified",
        }
    except CheckpointError as error:
        record["verdict"] = {"ok": False, **error.as_record()}
        try:
            manifest, checksum, size = format.read_manifest(path)
        except CheckpointError:
            return record
    prov = manifest.provenance
    record.update(
        {
            "step": manifest.step,
            "task": manifest.task,
            "job_id": manifest.job_id,
            "schema_version": manifest.schema_version,
            "bytes": size,
            "checksum": checksum,
            "state_hash": manifest.state_hash,
            "components": dict(manifest.components),
            "key_impl": manifest.key_impl,
            "train": dict(manifest.train),
            "provenance": {
                "config_hash": prov.config_hash,
                "data_hash": prov.data_hash,
                "source_hash": prov.source_hash,
                "runtime": dict(prov.runtime),
                "writer_generation": prov.writer_generation,
            },
            "created": manifest.created,
            "leaves": [
                {
                    "path": leaf.path,
                    "dtype": leaf.dtype,
                    "shape": list(leaf.shape),
                    "bytes": leaf.nbytes,
                }
                for leaf in manifest.leaves
            ],
        }
    )
    if values and checkpoint is not None:
        record["values"] = {
            path: array.tolist()
            if array.size <= VALUES_LIMIT
            else f"{array.size} elements; over the {VALUES_LIMIT}-element display limit"
            for path, array in checkpoint.leaves()
        }
    return record


def render(record: dict[str, Any]) -> str:
    """The description as text for a terminal."""
    if record.get("sharded"):
        return render_step(record)
    verdict = record["verdict"]
    lines = [
        f"file: {record['file']}",
        "verdict: "
        + (
            "accepted: " + verdict["message"]
            if verdict["ok"]
            else f"REFUSED {verdict['code']}: {verdict['message']}"
        ),
    ]
    if "step" not in record:
        return "\n".join(lines)
    lines += [
        f"step: {record['step']}   task: {record['task']}   job: {record['job_id']}   "
        f"bytes: {record['bytes']}   schema: {record['schema_version']}",
        f"state hash: {record['state_hash']}",
        "components: "
        + ", ".join(f"{k}={v[:12]}" for k, v in sorted(record["components"].items())),
        f"key: {record['key_impl']}   writer generation: "
        f"{record['provenance']['writer_generation']}",
        "train: " + ", ".join(f"{k}={v!r}" for k, v in sorted(record["train"].items())),
    ]
    prov = record["provenance"]
    lines += [f"{name}: {prov[name]}" for name in ("config_hash", "data_hash", "source_hash")]
    lines.append("runtime: " + ", ".join(f"{k}={v}" for k, v in sorted(prov["runtime"].items())))
    lines.append("leaves:")
    lines += [
        f"  {leaf['path']:<40} {leaf['dtype']:<9} {leaf['shape']!s:<16} {leaf['bytes']} B"
        for leaf in record["leaves"]
    ]
    if "values" in record:
        lines.append("values:")
        lines += [f"  {path} = {value}" for path, value in record["values"].items()]
    return "\n".join(lines)
