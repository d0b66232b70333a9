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


def test_running_the_daemon_block_runs_as_a_script(tmp_path: Path) -> None:
    """Started, ready, the job submitted, followed to its completion through a recovery,
    its incident verified, its runbook printed, the daemon stopped: exit 0 throughout."""
    bin_dir = Path(sys.executable).parent
    script = block("Running the daemon").replace(".venv/bin/", f"{bin_dir}/")
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script + "wait\n"],
        cwd=tmp_path,
        env={**os.environ, "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
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
    assert not (home / "warden" / "control.sock").exists()  # shut down, socket removed
