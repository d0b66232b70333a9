"""Sharded steps written by two real worker processes: per-member shard files, a commit
record last, restore of only this member's shards, refusals as a unit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jobwarden.checkpoint.manifest import NUMPY_DTYPES
from jobwarden.checkpoint.shardrecord import CommitRecord
from jobwarden.checkpoint.store import directory_verdicts
from jobwarden.jobfile import job_from_mapping
from jobwarden.shards.hash import layout_state_hash
from jobwarden.testfaults import ENV, Fault
from tests.test_sharded_hash import free_port

ROOT = Path(__file__).resolve().parent.parent
JOB = """id = "sharded"
task = "sharded_mlp"
[train]
seed = 1
width = 32
batch_size = 32
[run]
steps = {steps}
checkpoint_every = 2
keep_checkpoints = 3
processes = {processes}
"""
PINNED = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
SURVIVOR_GRACE_S = 15.0


def run_members(
    tmp: Path,
    directory: Path,
    steps: int,
    processes: int = 2,
    faults: str = "",
    environ: dict[int, dict[str, str]] | None = None,
) -> list[tuple[int, list[dict[str, Any]]]]:
    """Run the job's members to their end; each member's exit status and events.  Once one
    has failed, the others are given `SURVIVOR_GRACE_S` and then killed (restart-all)."""
    job = tmp / f"job-{steps}-{processes}.toml"
    job.write_text(JOB.format(steps=steps, processes=processes) + faults)
    port = free_port()
    procs = []
    for index in range(processes):
        env = {**os.environ, "XLA_FLAGS": PINNED, **(environ or {}).get(index, {})}
        if processes > 1:
            env.update(
                JOBWARDEN_PROCESS_ID=str(index),
                JOBWARDEN_PROCESSES=str(processes),
                JOBWARDEN_COORDINATOR=f"127.0.0.1:{port}",
            )
        command = [sys.executable, "-m", "jobwarden.worker", "--job", str(job)]
        procs.append(
            subprocess.Popen(
                [*command, "--checkpoint-dir", str(directory)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not all(p.poll() is not None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs):
            deadline = min(deadline, time.monotonic() + SURVIVOR_GRACE_S)
        time.sleep(0.1)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=30)
        events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        results.append((proc.returncode, events))
    return results


def hashes(events: list[dict[str, Any]]) -> dict[int, str]:
    """Each progress step's state hash."""
    return {e["step"]: e["state_hash"] for e in events if e["event"] == "progress"}


def one(events: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The one event of ``kind``."""
    found = [e for e in events if e["event"] == kind]
    assert len(found) == 1, [e["event"] for e in events]
    return found[0]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """The uninterrupted run's state hash at each of 8 updates."""
    tmp = tmp_path_factory.mktemp("reference")
    directory = tmp / "ck"
    results = run_members(tmp, directory, 8)
    assert [status for status, _ in results] == [0, 0]
    assert hashes(results[0][1]) == hashes(results[1][1])
    return hashes(results[0][1])


@pytest.fixture
def six(tmp_path: Path) -> Path:
    """A checkpoint directory holding the sharded steps 2, 4 and 6."""
    directory = tmp_path / "ck"
    results = run_members(tmp_path, directory, 6)
    assert [status for status, _ in results] == [0, 0], results[0][1][-1]
    return directory


def test_each_step_is_one_shard_per_member_and_a_record(six: Path) -> None:
    """Steps 2, 4, 6 each hold both members' shard files and a record naming them."""
    names = sorted(p.name for p in six.iterdir() if p.name.startswith("ckpt-"))
    expected = [
        f"ckpt-{s:010d}.{kind}"
        for s in (2, 4, 6)
        for kind in ("commit.json", "shard-0-of-2.safetensors", "shard-1-of-2.safetensors")
    ]
    assert expected == names
    record = CommitRecord.from_bytes("r", (six / "ckpt-0000000006.commit.json").read_bytes())
    assert [m.file for m in record.members] == expected[-2:]
    assert (len(record.devices), list(record.devices)) == (2, [1, 1])
    shard0 = (six / expected[-2]).read_bytes()
    assert b"params/layer00/w@0:16,0:16" in shard0
    assert b"params/layer00/w@0:16,16:32" not in shard0


def test_a_resumed_run_equals_the_uninterrupted_one(
    six: Path, tmp_path: Path, reference: dict[int, str]
) -> None:
    """Both members restore step 6 from their own shards and every later update is equal."""
    results = run_members(tmp_path, six, 8)
    assert [status for status, _ in results] == [0, 0]
    restored = one(results[0][1], "restored")
    assert (6, reference[6]) == (restored["step"], restored["state_hash"])
    assert "state_hash" in restored["checks"]
    for _, events in results:
        assert {7: reference[7], 8: reference[8]} == hashes(events)


def test_a_step_without_its_record_is_never_restored(
    six: Path, tmp_path: Path, reference: dict[int, str]
) -> None:
    """Step 6's record removed: step 4 is restored, step 6's shards are quarantined."""
    (six / "ckpt-0000000006.commit.json").unlink()
    results = run_members(tmp_path, six, 8)
    assert [status for status, _ in results] == [0, 0]
    restored = one(results[0][1], "restored")
    assert restored["step"] == 4
    skipped = sorted(s["file"] for s in restored["skipped"])
    assert skipped == [
        "ckpt-0000000006.shard-0-of-2.safetensors",
        "ckpt-0000000006.shard-1-of-2.safetensors",
    ]
    assert (six / "quarantine" / skipped[1]).exists()
    assert hashes(results[1][1])[8] == reference[8]


def test_a_damaged_shard_of_one_member_quarantines_the_whole_step(
    six: Path, tmp_path: Path, reference: dict[int, str]
) -> None:
    """A flipped byte in member 1's shard of step 6: the step goes as a unit, 4 is used."""
    shard = six / "ckpt-0000000006.shard-1-of-2.safetensors"
    damaged = bytearray(shard.read_bytes())
    damaged[-1] ^= 0xFF
    shard.write_bytes(bytes(damaged))
    results = run_members(tmp_path, six, 8)
    assert [status for status, _ in results] == [0, 0]
    restored = one(results[0][1], "restored")
    assert restored["step"] == 4
    assert "member 1" in restored["skipped"][0]["message"]
    kept = sorted(p.name for p in (six / "quarantine").iterdir() if "reason" not in p.name)
    assert kept == [
        "ckpt-0000000006.commit.json",
        "ckpt-0000000006.shard-0-of-2.safetensors",
        "ckpt-0000000006.shard-1-of-2.safetensors",
    ]
    assert (six / "quarantine" / shard.name).read_bytes() == bytes(damaged)
    assert hashes(results[0][1])[8] == reference[8]


def test_a_single_process_is_refused_naming_both_layouts(six: Path, tmp_path: Path) -> None:
    """One member on a directory of 2-member steps: refused as incompatible, nothing new."""
    before = sorted(p.name for p in six.iterdir())
    [(status, events)] = run_members(tmp_path, six, 8, processes=1)
    failed = one(events, "failed")
    assert (status, failed["code"]) == (27, "checkpoint.runtime")
    assert "saved 2 member(s) with [1, 1] device(s)" in failed["message"]
    assert "running a state with no leaf laid out" in failed["message"]
    assert before == sorted(p.name for p in six.iterdir())


def test_crash_drill_of_sharded_mlp_over_two_members_is_verified(tmp_path: Path) -> None:
    """wardenctl drill crash --task sharded_mlp --processes 2: member 1 crashes, both restore
    their own shards, every resumed update of each member equals the reference's."""
    wardenctl = Path(sys.executable).with_name("wardenctl")
    argv = [str(wardenctl), "drill", "crash", "--task", "sharded_mlp", "--processes", "2"]
    done = subprocess.run(
        [*argv, "--json", "--out", str(tmp_path / "ev")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    verdict = json.loads(done.stdout)
    assert [(m["process"], m["differing_steps"]) for m in verdict["members"]] == [(0, []), (1, [])]
    checkpoints = tmp_path / "ev" / "root" / "checkpoints"
    shards = sorted(p.name for p in checkpoints.rglob("*.shard-1-of-2.safetensors"))
    assert shards, sorted(p.name for p in checkpoints.rglob("*"))


CRASH_IN_COMMIT = "[faults]\ncrash_in_commit = 4\nprocess = {member}\n"


@pytest.mark.parametrize(
    ("fault", "member", "restored"),
    [
        ("crash_in_commit", 1, 2),  # member 1 dies with its shard of 4 durable but not in place
        ("crash_in_commit", 0, 2),  # ... or member 0
        (Fault.CRASH_AFTER_SHARD, 1, 2),  # a member dies with its shard in place, before the gather
        (Fault.CRASH_AFTER_SHARD, 0, 2),
        (Fault.CRASH_BEFORE_RECORD, 0, 2),  # member 0 dies with the record durable, not in place
        (Fault.CRASH_AFTER_RECORD, 0, 4),  # ... or just after it is in place: step 4 is complete
    ],
)
def test_a_member_killed_at_each_commit_phase_leaves_a_complete_step(
    tmp_path: Path, reference: dict[int, str], fault: str, member: int, restored: int
) -> None:
    """Whichever member dies at whichever phase of the commit of step 4, the restart restores
    the newest complete step (2, or 4 once its record is in place) and replays it exactly."""
    directory = tmp_path / "ck"
    if fault == "crash_in_commit":
        first = run_members(tmp_path, directory, 6, faults=CRASH_IN_COMMIT.format(member=member))
    else:
        first = run_members(tmp_path, directory, 6, environ={member: {ENV: str(fault)}})
    assert first[member][0] != 0
    assert (directory / "ckpt-0000000004.commit.json").exists() == (restored == 4)
    before = {p.name: p.read_bytes() for p in directory.glob("ckpt-0000000002.*")}
    again = run_members(tmp_path, directory, 6)
    assert [status for status, _ in again] == [0, 0], again[0][1][-1]
    assert one(again[0][1], "restored")["step"] == restored
    for _, events in again:
        expected = {s: h for s, h in reference.items() if restored < s <= 6}
        assert hashes(events) == expected
    if restored == 2:  # the previous complete step was restored untouched
        assert before == {p.name: p.read_bytes() for p in directory.glob("ckpt-0000000002.*")}


def test_inspect_lists_shards_per_member_and_the_whole_values_hash_as_committed(
    six: Path,
) -> None:
    """inspect of step 6's record: both members' files verified with their pieces, and the
    global values it puts together hash, in one process through the record's layout, to the
    state hash the members committed."""
    record_path = six / "ckpt-0000000006.commit.json"
    wardenctl = Path(sys.executable).with_name("wardenctl")
    done = subprocess.run(
        [str(wardenctl), "inspect", "--json", "--values", str(record_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    shown = json.loads(done.stdout)
    assert shown["verdict"]["ok"]
    assert [(m["member"], m["verified"]) for m in shown["members"]] == [(0, True), (1, True)]
    pieces = {p["path"] for p in shown["members"][1]["pieces"]}
    assert "params/layer00/w@0:16,16:32" in pieces
    assert "params/layer00/w@0:16,0:16" not in pieces
    record = CommitRecord.from_bytes(str(record_path), record_path.read_bytes())
    leaves = [
        (leaf.path, np.asarray(shown["values"][leaf.path], NUMPY_DTYPES[leaf.dtype]))
        for leaf in record.manifest.leaves
    ]
    digest, _ = layout_state_hash(leaves, 6, record.layout)
    assert digest == record.manifest.state_hash == shown["state_hash"]


def test_resume_never_refuses_a_directory_of_sharded_steps(six: Path, tmp_path: Path) -> None:
    """``resume = "never"`` on a directory holding sharded steps: refused, nothing written."""
    before = sorted(p.name for p in six.iterdir())
    results = run_members(tmp_path, six, 8, faults='resume = "never"\n')
    status, events = results[0]
    assert (status, one(events, "failed")["code"]) == (12, "resume.policy")
    assert "already holds 3 sharded step(s)" in one(events, "failed")["message"]
    assert before == sorted(p.name for p in six.iterdir())


def test_checkpoints_listing_marks_shards_without_a_record_never_selected(six: Path) -> None:
    """With step 6's record gone, its shard files are listed as never selected; 4's are not."""
    (six / "ckpt-0000000006.commit.json").unlink()
    job = job_from_mapping(
        {
            "id": "sharded",
            "task": "sharded_mlp",
            "train": {"seed": 1, "width": 32, "batch_size": 32},
            "run": {"steps": 6, "processes": 2},
        }
    )
    rows = {Path(r["file"]).name: r for r in directory_verdicts(six, job)}
    six_shard = rows["ckpt-0000000006.shard-1-of-2.safetensors"]
    assert (six_shard["verdict"]["ok"], six_shard["where"]) == (False, "without its commit record")
    assert "never selected" in six_shard["verdict"]["message"]
    assert rows["ckpt-0000000004.shard-1-of-2.safetensors"]["verdict"]["ok"]


def test_two_devices_per_member_is_refused_naming_both_layouts(six: Path, tmp_path: Path) -> None:
    """The same 2 members with 2 devices each (``JAX_NUM_CPU_DEVICES=2``) on steps written
    with 1 each: refused as incompatible, naming both layouts, and nothing written."""
    before = sorted(p.name for p in six.iterdir())
    environ = {i: {"JAX_NUM_CPU_DEVICES": "2"} for i in range(2)}
    status, events = run_members(tmp_path, six, 8, environ=environ)[0]
    failed = one(events, "failed")
    assert (status, failed["code"]) == (27, "checkpoint.runtime")
    assert "saved 2 member(s) with [1, 1] device(s)" in failed["message"]
    assert "running 2 member(s) with [2, 2] device(s)" in failed["message"]
    assert before == sorted(p.name for p in six.iterdir())


def test_a_program_with_its_own_checkpoints_reports_the_same_combined_hashes(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    """A program keeping its own checkpoints, with the same laid-out state, reports in both
    members the combined hash the built-in task's members report, update by update."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "sharded_program.py"), "8"],
            cwd=tmp_path,
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "XLA_FLAGS": PINNED,
                "JOBWARDEN_PROCESS_ID": str(index),
                "JOBWARDEN_PROCESSES": "2",
                "JOBWARDEN_COORDINATOR": f"127.0.0.1:{port}",
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(2)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-2000:]
        events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert hashes(events) == reference
