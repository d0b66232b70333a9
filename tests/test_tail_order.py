"""wardenctl tail through a real daemon puts every line where it happened: a failing attempt's
transition before its failure, a plain program's output between the daemon's lines."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobwarden.protocol import ControlError
from tests.daemon import ANY_STATE, WARDENCTL, Daemon, ctl
from tests.test_command_jobs import command_job

FAILS_AT_ONCE = """\
import json, os, sys, time
now = time.time()
events = [
    {"event": "started", "pid": os.getpid(), "backend": "cpu", "devices": [], "runtime": {}},
    {"event": "ready", "step": 0, "warmup_s": 0.0, "state_hash": "0" * 32, "components": {}},
    {"event": "failed", "code": "test.boom", "message": "boom", "exit_status": 1},
]
sys.stdout.write("".join(json.dumps({"v": 1, "time": now, **e}) + "\\n" for e in events))
sys.stdout.flush()
sys.exit(1)
"""
"""A program that writes its start, its ready and its failure in one write, then fails."""

PRINTS_SLOWLY = """\
import time
print("warming up", flush=True)
time.sleep(0.6)
print("step 1 done", flush=True)
time.sleep(0.6)
print("step 2 done", flush=True)
time.sleep(0.3)
"""
"""A plain program whose second line is its first heartbeat."""


def tail_json(daemon: Daemon, *args: str) -> list[dict[str, Any]]:
    """The lines ``wardenctl tail --json`` prints, parsed."""
    done = ctl(daemon, "tail", *args, "--json")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def label(item: dict[str, Any]) -> str:
    """A line in a word: a transition's target, an output line's text, else its event."""
    if item.get("event") == "job.transition":
        return f"-> {item['to']}"
    if item.get("event") == "output":
        return str(item["line"])
    return str(item.get("event"))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, compile_cache: Path) -> Iterator[Daemon]:
    """One daemon, its programs written where a user would keep them, the failing one
    submitted at once (each test of this module may run in another process)."""
    root = tmp_path_factory.mktemp("order")
    (root / "fails.py").write_text(FAILS_AT_ONCE)
    (root / "prints.py").write_text(PRINTS_SLOWLY)
    with Daemon(root / "root", compile_cache) as running:
        job = command_job(
            "fails", [sys.executable, str(root / "fails.py")], supervision={"max_restarts": 0}
        )
        running.drop("fails.toml", job)
        yield running


def test_a_failing_attempt_is_ready_before_it_fails(daemon: Daemon) -> None:
    """ready, then starting -> running, then failed, then the exit: in tail and in tail -f,
    though the program wrote its three events in one write."""
    daemon.wait("fails", ANY_STATE, timeout=30)
    follow = subprocess.run(
        [*WARDENCTL, "--root", str(daemon.root), "tail", "fails", "-f", "-n", "1000", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert follow.returncode == 0, follow.stderr
    followed = [label(json.loads(line)) for line in follow.stdout.splitlines()]
    shown = [label(item) for item in tail_json(daemon, "fails", "-n", "100")]
    for seen in (shown, followed):
        kept = [s for s in seen if s in ("ready", "-> running", "failed", "attempt.exited")]
        assert kept == ["ready", "-> running", "failed", "attempt.exited"]


def test_a_plain_programs_lines_sit_between_the_daemons(daemon: Daemon) -> None:
    """Each output line is placed when the daemon read it: after the attempt's start, the
    transition on its first heartbeat between its second and third line, the exit last."""
    program = daemon.root.parent / "prints.py"
    job = command_job(
        "prints", [sys.executable, str(program)], sdk=False, heartbeat={"pattern": "^step"}
    )
    daemon.drop("prints.toml", job)
    assert daemon.wait("prints", timeout=60)["state"] == "completed"
    items = tail_json(daemon, "prints", "-n", "100")
    wanted = ("attempt.started", "warming up", "step 1 done", "-> running", "step 2 done")
    kept = [label(i) for i in items if label(i) in (*wanted, "attempt.exited")]
    assert [*wanted, "attempt.exited"] == kept
    output = [i for i in items if i.get("event") == "output"]
    assert all(isinstance(i["read"], float) for i in output)
    text = ctl(daemon, "tail", "prints", "-n", "100").stdout.splitlines()
    assert any(line.startswith("#1 20") and line.endswith(" step 1 done") for line in text)
    stored = (daemon.attempt_folder("prints", 1) / "output.log").read_text()
    assert stored == "warming up\nstep 1 done\nstep 2 done\n"


def test_the_daemons_own_lines_and_kinds_alone(daemon: Daemon) -> None:
    """--daemon keeps only the daemon's lines and -n counts those; --kind keeps one kind."""
    daemon.wait("fails", ("failed",), timeout=60)
    ours = tail_json(daemon, "fails", "--daemon", "-n", "2")
    assert len(ours) == 2
    assert {"wardend"} == {item.get("origin") for item in ours}
    everything = tail_json(daemon, "fails", "--daemon", "-n", "1000")
    assert ours == everything[-2:]
    assert "failed" not in [item.get("event") for item in everything]  # the worker's line
    failures = tail_json(daemon, "fails", "--kind", "failed", "--kind", "attempt.*")
    assert {i["event"] for i in failures} == {"failed", "attempt.started", "attempt.exited"}
    refused = ctl(daemon, "tail", "fails", "--daemon", "--no-daemon")
    assert refused.returncode == 2
    with pytest.raises(ControlError) as caught:
        daemon.ask("tail", job="fails", worker=False, daemon=False)
    assert caught.value.code == "control.bad_request"
