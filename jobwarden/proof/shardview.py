"""``wardenctl inspect`` of a sharded step, named by its commit record: shards per member.

It reports the record's verdict (its own checksum, then each member's shard file against
its checksum and the one the record names), the step's identity and layout, and per
member its file, size, checksum and the pieces it holds.  With ``values`` each leaf's
global value is printed, put together from the members' boxes: this is a tool reading
files, not a member of the job, so it may hold a leaf whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from jobwarden.checkpoint import format
from jobwarden.checkpoint.errors import CheckpointError
from jobwarden.checkpoint.manifest import NUMPY_DTYPES, Manifest
from jobwarden.checkpoint.shardrecord import CommitRecord, describe, piece_path
from jobwarden.shards.hash import slices_of
from jobwarden.shards.read import read_record

VALUES_LIMIT = 4096


def describe_step(path: Path, values: bool = False) -> dict[str, Any]:
    """Everything `inspect` reports about the sharded step whose record is ``path``."""
    out: dict[str, Any] = {"file": str(path), "sharded": True}
    try:
        record = read_record(path)
    except (CheckpointError, OSError) as error:
        code = getattr(error, "code", "checkpoint.unreadable")
        out["verdict"] = {"ok": False, "code": code, "message": str(error)}
        return out
    members, shards, problems = [], {}, []
    for index, member in enumerate(record.members):
        row: dict[str, Any] = {"member": index, "file": member.file, "bytes": member.bytes}
        row["checksum"] = member.checksum
        try:
            shard = format.read(path.parent / member.file)
        except (CheckpointError, OSError) as error:
            problems.append(f"member {index}: {error}")
            row["verified"] = False
        else:
            row["verified"] = shard.checksum == member.checksum
            if not row["verified"]:
                problems.append(f"member {index}: checksum {shard.checksum} is not the record's")
            shards[index] = shard
            row["pieces"] = [
                {"path": s.path, "dtype": s.dtype, "shape": list(s.shape), "bytes": s.nbytes}
                for s in shard.manifest.leaves
            ]
        members.append(row)
    checked = f"record and {len(members)} shard file(s) verified against their checksums"
    out["verdict"] = (
        {"ok": True, "message": checked}
        if not problems
        else {"ok": False, "code": "checkpoint.checksum", "message": "; ".join(problems)}
    )
    out.update(_identity(record.manifest))
    out["layout"] = describe(record.devices, record.layout)
    out["bytes"] = sum(m.bytes for m in record.members)
    out["members"] = members
    if values and len(shards) == len(record.members):
        out["values"] = _values(record, shards)
    return out


def _identity(manifest: Manifest) -> dict[str, Any]:
    """The step's identity from the record's manifest (global shapes)."""
    prov = manifest.provenance
    return {
        "step": manifest.step,
        "task": manifest.task,
        "job_id": manifest.job_id,
        "state_hash": manifest.state_hash,
        "components": dict(manifest.components),
        "train": dict(manifest.train),
        "writer_generation": prov.writer_generation,
        "leaves": [
            {"path": s.path, "dtype": s.dtype, "shape": list(s.shape), "bytes": s.nbytes}
            for s in manifest.leaves
        ],
    }


def _values(record: CommitRecord, shards: dict[int, format.Checkpoint]) -> dict[str, Any]:
    """Each leaf's global value, from its boxes (laid out) or member 0's copy."""
    found: dict[str, Any] = {}
    for leaf in record.manifest.leaves:
        count = int(np.prod(leaf.shape)) if leaf.shape else 1
        if count > VALUES_LIMIT:
            found[leaf.path] = f"{count} elements; over the {VALUES_LIMIT}-element display limit"
            continue
        boxes = record.layout.get(leaf.path)
        if boxes is None:
            found[leaf.path] = shards[0].arrays[leaf.path].tolist()
            continue
        whole = np.zeros(leaf.shape, NUMPY_DTYPES[leaf.dtype])
        for box, _ in boxes:
            name = piece_path(leaf.path, box)
            piece = next(s.arrays[name] for s in shards.values() if name in s.arrays)
            whole[slices_of(box)] = piece
        found[leaf.path] = whole.tolist()
    return found


def render_step(record: dict[str, Any]) -> str:
    """The description of a sharded step as text for a terminal."""
    verdict = record["verdict"]
    lines = [
        f"file: {record['file']} (sharded step)",
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
        f"bytes: {record['bytes']}   writer generation: {record['writer_generation']}",
        f"state hash: {record['state_hash']}",
        f"layout: {record['layout']}",
        "members:",
    ]
    for member in record["members"]:
        ok = "verified" if member["verified"] else "NOT VERIFIED"
        lines.append(
            f"  member {member['member']}: {member['file']}  {member['bytes']} B  "
            f"{member['checksum']}  {ok}"
        )
        lines += [
            f"    {p['path']:<44} {p['dtype']:<8} {p['shape']!s:<12} {p['bytes']} B"
            for p in member.get("pieces", [])
        ]
    if "values" in record:
        lines.append("values:")
        lines += [f"  {path} = {value}" for path, value in record["values"].items()]
    return "\n".join(lines)
