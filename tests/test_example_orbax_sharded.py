"""examples/orbax_sharded under a real wardend: two members, a state laid out over them, saved
by Orbax's own multi-process CheckpointManager, replays proven from the combined state hashes.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from jobwarden.jobfile import job_from_mapping, load_document
from tests.daemon import Daemon
from tests.helpers import wait_until

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "orbax_sharded"
JOB_FILE = EXAMPLE / "job.toml"
STEPS = 40


def require_examples_extra() -> None:
    """Skip, saying what to install, when the examples extra is not installed."""
    absent = [
        m for m in ("optax", "sklearn", "orbax.checkpoint") if not importlib.util.find_spec(m)
    ]
    if absent:
        pytest.skip(
            f"the examples extra is not installed ({', '.join(absent)} not importable): "
            "pip install -c constraints.txt -e '.[examples]'"
        )


def events(path: Path) -> list[dict[str, Any]]:
    """A member's events file, every line JSON."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def progress_hashes(path: Path) -> dict[int, str]:
    """Each progress event's step and state hash."""
    return {e["step"]: e["state_hash"] for e in events(path) if e["event"] == "progress"}


def job_document(faults: dict[str, Any], **sections: dict[str, Any]) -> str:
    """The example's job file as JSON for the spool, run by this interpreter, with ``faults``."""
    document = load_document(JOB_FILE)
    document["command"] = [sys.executable, *document["command"][1:]]
    document["env"] = {"PYTHONDONTWRITEBYTECODE": "1"}  # no __pycache__ left in examples/
    return json.dumps({**document, "faults": faults, **sections})


def test_the_example_ships_a_program_a_readme_and_a_two_member_job_file() -> None:
    """train.py, README.md and a job file of two members whose workdir is the documented
    placeholder, which the job file schema accepts once resolved."""
    assert (EXAMPLE / "train.py").is_file()
    assert (EXAMPLE / "README.md").is_file()
    document = tomllib.loads(JOB_FILE.read_text())
    expected = ("orbax_sharded", ["python", "train.py"], ".", True, 2)
    found = (document["id"], document["command"], document["workdir"], document["sdk"])
    assert expected == (*found, document["run"]["processes"])
    job = job_from_mapping(load_document(JOB_FILE), str(JOB_FILE), check_workdir=True)
    assert job.program is not None
    assert job.program.workdir == str(EXAMPLE)


@pytest.mark.slow
def test_the_crash_drill_of_member_1_is_verified_from_orbaxs_own_step(
    tmp_path: Path, compile_cache: Path
) -> None:
    """wardenctl drill crash --job examples/orbax_sharded/job.toml: member 1 fails between
    two Orbax saves, both members restore Orbax's step from their own shards, and every
    resumed update's combined hash equals the reference's, member by member."""
    require_examples_extra()
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "jobwarden.control.cli", "drill", "crash", "--job"]
    done = subprocess.run(
        [*argv, str(JOB_FILE), "--out", str(out), "--json", "--compile-cache", str(compile_cache)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    verdict = json.loads(done.stdout)
    assert (verdict["ok"], verdict["processes"]) == (True, 2)
    assert verdict["fault_points"]["fail_after"] == 15  # between the saves at 10 and 20
    replayed = list(range(11, STEPS + 1))
    assert (verdict["restored_step"], verdict["replayed_steps"]) == (10, replayed)
    assert [
        (m["process"], m["replayed_steps"], m["differing_steps"]) for m in verdict["members"]
    ] == [
        (0, replayed, []),
        (1, replayed, []),
    ]
    assert all(m["replay_verified"] and m["replay_checks"] > 0 for m in verdict["members"])
    (crash,) = (out / "root" / "jobs").glob("*-crash")
    (reference,) = (out / "root" / "jobs").glob("*-reference")
    resumed = [
        events(crash / "attempts" / "2" / name) for name in ("events.jsonl", "events.1.jsonl")
    ]
    restored = [next(e for e in member if e["event"] == "restored") for member in resumed]
    assert [(r["step"], r["checkpointer"], r["checks"]) for r in restored] == [
        (10, "external", [])
    ] * 2
    logs = [reference / "attempts" / "1" / name for name in ("events.jsonl", "events.1.jsonl")]
    member_0, member_1 = (progress_hashes(path) for path in logs)
    assert sorted(member_0) == list(range(1, STEPS + 1))
    assert member_0 == member_1  # one combined hash, whichever member computes it
    assert restored[0]["state_hash"] == member_0[10]
    checkpoints = out / "root" / "checkpoints" / crash.name
    steps = sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())
    assert steps == [20, 30, 40]  # Orbax's own steps, max_to_keep = keep_checkpoints = 3
    for step in steps:  # each member wrote its own shards
        saved = checkpoints / str(step) / "default"
        assert {"ocdbt.process_0", "ocdbt.process_1"} <= {p.name for p in saved.iterdir()}
    ours = (".safetensors", ".commit.json", ".pending")  # jobwarden wrote no step of its own
    assert not [p for p in checkpoints.rglob("*") if p.name.endswith(ours)]


@pytest.mark.slow
def test_a_step_holding_an_older_steps_state_is_caught_as_a_replay_mismatch(
    tmp_path: Path, compile_cache: Path
) -> None:
    """Member 1 hangs after update 25; while it hangs, Orbax's step 20 is given step 10's
    files.  The restart restores "20" without complaint (Orbax has no checksum), and the
    daemon's replay check finds that its combined hash is not update 20's: escalated.  The
    state it holds is update 10's, component by component."""
    require_examples_extra()
    stall = {"stall_at": 25, "stall_seconds": 120, "process": 1}
    job = job_document(stall, supervision={"stall_timeout_s": 8})
    with Daemon(tmp_path / "root", compile_cache, "--no-warm-spare") as daemon:
        daemon.drop("swapped.json", job)
        first = daemon.wait("orbax_sharded", ("running",), timeout=120)
        assert first["attempt"] == 1
        log = daemon.attempt_folder("orbax_sharded", 1) / "events.jsonl"
        checkpoints = tmp_path / "root" / "checkpoints" / "orbax_sharded"
        wait_until(
            lambda: log.exists() and max(progress_hashes(log), default=0),
            lambda step: step == 25 and (checkpoints / "20").is_dir(),
            timeout=120,
            what="update 25 logged and Orbax's step 20 finalized",
        )
        shutil.rmtree(checkpoints / "20" / "default")
        shutil.copytree(checkpoints / "10" / "default", checkpoints / "20" / "default")
        status = daemon.wait("orbax_sharded", timeout=180)
        incidents = daemon.incidents("orbax_sharded")
        logged = {e["step"]: e for e in events(log) if e["event"] == "progress"}
        resumed = daemon.events("orbax_sharded", 2)
    assert status["state"] == "escalated", status
    (incident,) = incidents
    assert (incident["kind"], incident["status"]) == ("stall", "escalated")
    verification = incident["verification"]
    assert verification["verdict"] == "mismatch"
    last = verification["checks"][-1]
    assert (last["what"], last["step"]) == ("restored state", 20)
    restored = next(e for e in resumed if e["event"] == "restored")
    assert (restored["step"], restored["checkpointer"]) == (20, "external")
    state = ("params", "opt_state", "key")  # every component but the step's own
    held = [{name: e["components"][name] for name in state} for e in (restored, logged[10])]
    assert held[0] == held[1]
    assert restored["state_hash"] != logged[20]["state_hash"]


@pytest.mark.slow
def test_member_1_killed_after_a_save_is_recovered_from_orbaxs_newest_finalized_step(
    tmp_path: Path, compile_cache: Path
) -> None:
    """Member 1 SIGKILLed one update after Orbax's save of step 20 began: both members restore
    Orbax's newest finalized step (20, or 10 when that save was cut short), the daemon
    verifies each member's replay against its own log, and no unfinished save is left."""
    require_examples_extra()
    with Daemon(tmp_path / "root", compile_cache, "--no-warm-spare") as daemon:
        daemon.drop("killed.json", job_document({"crash_after": 21, "process": 1}))
        status = daemon.wait("orbax_sharded", timeout=240)
        incidents = daemon.incidents("orbax_sharded")
        folders = [daemon.attempt_folder("orbax_sharded", n) for n in (1, 2)]
    assert (status["state"], status["attempt"], status["step"]) == ("completed", 2, STEPS)
    (incident,) = incidents
    assert (incident["kind"], incident["status"]) == ("crash", "verified"), incident["outcome"]
    first = json.loads((folders[0] / "members.json").read_text())
    assert first["failed_member"] == 1
    assert first["members"][1]["exit_signal"] == "SIGKILL"
    resumed = [events(folders[1] / name) for name in ("events.jsonl", "events.1.jsonl")]
    restored = {next(e["step"] for e in member if e["event"] == "restored") for member in resumed}
    assert restored in ({10}, {20})
    checked = [c["step"] for c in incident["verification"]["checks"]]
    assert checked == list(range(*restored, 22))  # the restored state and every replayed update
    members = json.loads((folders[1] / "members.json").read_text())["members"]
    assert [(m["replay_ok"], m["replay_checks"]) for m in members][1] == (True, len(checked))
    checkpoints = tmp_path / "root" / "checkpoints" / "orbax_sharded"
    assert sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith(".")) == [
        "20",
        "30",
        "40",
        "writer.json",
    ]
