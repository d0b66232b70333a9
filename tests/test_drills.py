"""wardenctl drill from the operator's chair: every drill passes, and a broken recovery fails."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from jobwarden.testfaults import ENV, Fault
from tests.daemon import Daemon

WARDENCTL = [sys.executable, "-m", "jobwarden.control.cli"]
SVG = "{http://www.w3.org/2000/svg}"


def drill(*args: str) -> subprocess.CompletedProcess[str]:
    """Run wardenctl drill with ``args``."""
    return subprocess.run(
        [*WARDENCTL, "drill", *args], capture_output=True, text=True, timeout=600, check=False
    )


def series(svg: Path, gid: str) -> list[tuple[float, float]]:
    """The points of one plotted line of loss.svg."""
    group = next(g for g in ET.parse(svg).iter(f"{SVG}g") if g.get("id") == gid)
    path = next(group.iter(f"{SVG}path"))
    numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", path.get("d", ""))]
    return list(zip(numbers[0::2], numbers[1::2], strict=True))


@pytest.mark.slow
def test_all_drills_pass_in_one_private_daemon(tmp_path: Path, compile_cache: Path) -> None:
    """drill all: five drills at once in one daemon, every check held, evidence kept for each."""
    done = drill("all", "--out", str(tmp_path), "--json", "--compile-cache", str(compile_cache))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["ok"] is True
    drills = {d["drill"]: d for d in report["drills"]}
    assert list(drills) == ["crash", "stall", "duplicate-writer", "corrupt", "incompatible"]
    crash = drills["crash"]
    assert crash["restored_step"] == 2
    assert crash["replayed_steps"] == [3, 4, 5, 6, 7, 8]
    assert crash["all_hashes_equal"] is True
    references = {d["reference"] for d in drills.values()}
    assert len(references) == 1
    # The shared reference and the drills' seven jobs (two each for duplicate-writer and
    # incompatible), all in the one daemon, which compiled into the session's cache.
    jobs = {p.name for p in (tmp_path / "root" / "jobs").iterdir()}
    assert len(jobs) == 8
    assert references <= jobs
    assert not list((tmp_path / "root").glob("cache/jax/*"))
    for name in drills:
        folder = tmp_path / name
        for evidence in (
            "timeline.json",
            "accepted-checkpoint.json",
            "refusals.json",
            "verdict.json",
            "loss.svg",
        ):
            assert (folder / evidence).is_file(), (name, evidence)
        assert list(folder.glob("runbook-*.md")), name
        assert json.loads((folder / "verdict.json").read_text())["ok"] is True
    rows = json.loads((tmp_path / "crash" / "comparison.json").read_text())
    assert [r["step"] for r in rows] == [3, 4, 5, 6, 7, 8]
    assert all(r["equal"] and r["resumed_loss"] == r["reference_loss"] for r in rows)
    svg = tmp_path / "crash" / "loss.svg"
    reference, restored = series(svg, "uninterrupted"), series(svg, "restored")
    assert len(reference) == len(restored) == 6
    assert reference == restored
    text = svg.read_text()
    assert "uninterrupted" in text
    assert "restored continuation" in text
    stall = drills["stall"]
    assert stall["restored_step"] == 4
    assert 2.0 <= stall["detected_gap_s"] <= 2.25
    refusals = json.loads((tmp_path / "incompatible" / "refusals.json").read_text())
    assert refusals["failed_event"]["fields"] == {"learning_rate": [0.04, 0.05]}
    writer = {c["name"]: c for c in drills["duplicate-writer"]["checks"]}
    assert writer["the primary's continuation is exact"]["stopped_as"] == "preempted"
    assert writer["the primary's continuation is exact"]["restored_steps"] == [2]
    corrupt = drills["corrupt"]
    assert corrupt["restored_step"] == 2
    assert corrupt["checks"][0]["writer_generation"] == 1


@pytest.mark.slow
def test_the_lesson_exercise_through_a_given_daemon(tmp_path: Path, compile_cache: Path) -> None:
    """drill crash --seed 9 --checkpoint-every 3 --fail-after 5 --root DIR: restored 3, exact.

    The drill drops its jobs into that daemon's spool and leaves the daemon running.
    """
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        done = drill(
            "crash",
            "--seed",
            "9",
            "--checkpoint-every",
            "3",
            "--fail-after",
            "5",
            "--root",
            str(daemon.root),
            "--out",
            str(tmp_path / "out"),
            "--json",
        )
        assert done.returncode == 0, done.stdout[-3000:]
        verdict = json.loads(done.stdout)
        jobs = {row["id"]: row["state"] for row in daemon.ask("status")["jobs"]}
        assert jobs[verdict["job"]] == "completed"
        assert jobs[verdict["reference"]] == "completed"
        assert daemon.ask("version")["pid"] == daemon.proc.pid  # type: ignore[union-attr]
    assert not (tmp_path / "out" / "root").exists()
    assert verdict["restored_step"] == 3
    assert verdict["replayed_steps"] == [4, 5, 6, 7, 8]
    checks = {c["name"]: c for c in verdict["checks"]}
    assert checks["final checkpoints are equal"]["ok"] is True


@pytest.mark.slow
def test_a_broken_recovery_fails_the_drill_and_names_the_check(
    tmp_path: Path, compile_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With velocity zeroed on restore (a test-only fault), the crash drill fails and says why."""
    monkeypatch.setenv(ENV, Fault.ZERO_OPT_STATE_ON_RESTORE.value)
    out = tmp_path / "out"
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        done = drill("crash", "--root", str(daemon.root), "--out", str(out))
    assert done.returncode == 1
    assert "verdict: FAIL" in done.stdout
    verdict = json.loads((out / "crash" / "verdict.json").read_text())
    assert (
        "the daemon opened a crash incident and verified the replay against the failed "
        "attempt's log" in verdict["failed_checks"]
    )
    assert "every resumed update's full state equals the reference's" in verdict["failed_checks"]
    assert "job completed" in verdict["failed_checks"]
    assert (verdict["first_diverging_step"], verdict["diverged_in"]) == (2, "restored state")
    assert (verdict["component"], verdict["components"]) == ("opt_state", ["opt_state"])
    assert "bit-identical to the reference's" in verdict["explanation"]
    incident = json.loads(next((out / "crash").glob("incidents-*-crash.json")).read_text())[0]
    assert incident["status"] == "escalated"
    assert incident["verification"]["verdict"] == "mismatch"
    assert incident["verification"]["checks"][-1]["what"] == "restored state"


def test_compile_cache_is_refused_with_a_given_daemon(tmp_path: Path) -> None:
    """--compile-cache with --root: a usage error, since that daemon keeps its own cache."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    done = drill("crash", "--root", str(tmp_path / "root"), "--compile-cache", str(cache))
    assert (done.returncode, done.stdout) == (2, "")
    assert "--compile-cache" in done.stderr
    assert not (tmp_path / "root").exists()


def test_a_compile_cache_others_may_read_is_refused(tmp_path: Path) -> None:
    """--compile-cache naming a directory of mode 0755: refused before any daemon starts."""
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o755)
    done = drill("crash", "--out", str(tmp_path / "out"), "--compile-cache", str(cache))
    assert done.returncode == 2
    assert "worker.cache_unsafe" in done.stderr
    assert "expected 0700" in done.stderr
    assert not (tmp_path / "out").exists()
