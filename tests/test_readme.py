"""The README's "Running the daemon" block, pasted whole into bash, does what it says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def block(title: str) -> str:
    """The first code block under the README heading ``title``."""
    text = (PROJECT / "README.md").read_text()
    section = text[text.index(f"## {title}\n") :]
    found = re.search(r"```\n(.*?)```", section, re.S)
    assert found, f"no code block under {title!r}"
    return found.group(1)


def run_daemon_block(cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """The "Running the daemon" block run by bash in ``cwd`` with ``home`` as $HOME."""
    bin_dir = Path(sys.executable).parent
    script = block("Running the daemon").replace(".venv/bin/", f"{bin_dir}/")
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script + "wait\n"],
        cwd=cwd,
        env={**os.environ, "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def assert_recovered_and_told(done: subprocess.CompletedProcess[str]) -> None:
    """The block exited 0 after the job failed at update 3, resumed from step 2, completed,
    and its incident was verified and its runbook printed."""
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert "ready on" in out
    tail = out[out.index("ready on") :]
    assert re.search(r"^demo$", tail, re.M), "submit printed no job id"
    assert re.search(r"^#1 .* failed +exit_status=10 code=worker.injected_failure", tail, re.M)
    assert re.search(r"^#2 .* restored +step=2 ", tail, re.M)
    assert re.search(r"^#2 .* completed +step=8 ", tail, re.M), "tail did not end on completion"
    assert re.search(r"^demo +completed +2 +8/8 ", tail, re.M), "status shows no completed demo"
    assert re.search(r"^demo-1 +crash +verified ", tail, re.M), "the incident is not verified"
    assert "# Incident demo-1: crash of job demo" in tail


def test_running_the_daemon_block_runs_as_a_script_twice(tmp_path: Path) -> None:
    """Pasted twice on one root, the block shows the fault, the recovery and the incident
    both times: the second submit archives the first job and its checkpoints, never resumes."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    assert_recovered_and_told(run_daemon_block(tmp_path, home))
    again = run_daemon_block(tmp_path, home)
    assert_recovered_and_told(again)
    assert not (home / "warden" / "control.sock").exists()  # shut down, socket removed
    [archived] = (home / "warden" / "archive").glob("demo-*")
    assert "archived as " + archived.name in again.stderr
    assert sorted(p.name for p in (archived / "checkpoint").glob("ckpt-*")) == [
        "ckpt-0000000004.safetensors",
        "ckpt-0000000006.safetensors",
        "ckpt-0000000008.safetensors",
    ]
    assert "warning" not in again.stderr
