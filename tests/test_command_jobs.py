"""Command jobs: a user's own program in the spool, with the SDK or without it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobwarden.daemon.store.jobs import JobRecord
from jobwarden.daemon.store.layout import Root
from jobwarden.daemon.supervise.attempt import RUN_FILE, prepare
from jobwarden.daemon.supervise.heartbeat import Heartbeat
from jobwarden.daemon.supervise.verification import NO_SDK
from jobwarden.jobfile import job_from_mapping
from jobwarden.program import HeartbeatSection
from jobwarden.sdk.settings import RUN_FILE_ENV, read_run_file, resolve
from tests.daemon import Daemon
from tests.helpers import toml_value, wait_until
from tests.test_stall import FakeClock

HERE = Path(__file__).resolve().parent

PLAIN = """\
import json, os, sys, time
from pathlib import Path

steps, delay, stall_at, beat = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
run = json.loads(Path(os.environ["JOBWARDEN_RUN_FILE"]).read_text())
counter = Path(run["checkpoint_dir"]) / "counter"
start = int(counter.read_text()) if counter.exists() else 0
print(f"{os.environ.get('GREETING')} from {os.getcwd()}, after step {start}", flush=True)
for step in range(start + 1, steps + 1):
    if step == stall_at:
        time.sleep(60)
    time.sleep(delay)
    counter.write_text(str(step))
    if beat != "-":
        Path(beat).touch()
    print(f"step {step}", flush=True)
"""
"""A program that knows nothing of jobwarden but the run file: it counts steps in its
checkpoint directory, so a restart continues the count; it hangs at ``stall_at``."""


def command_job(job_id: str, command: list[str], **fields: Any) -> str:
    """A command job file: top-level fields first, then each dict as a [section]."""
    lines = [f'id = "{job_id}"', f"command = {json.dumps(command)}"]
    sections = {k: v for k, v in fields.items() if isinstance(v, dict) and k != "env"}
    for key, value in fields.items():
        if key == "env":
            pairs = ", ".join(f"{name} = {json.dumps(text)}" for name, text in value.items())
            lines.append(f"env = {{ {pairs} }}")
        elif key not in sections:
            lines.append(f"{key} = {toml_value(value)}")
    for name, section in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in section.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture
def daemon(tmp_path: Path, compile_cache: Path) -> Iterator[Daemon]:
    """A running wardend on a fresh root."""
    with Daemon(tmp_path / "root", compile_cache) as running:
        yield running


@pytest.fixture
def plain(tmp_path: Path) -> Path:
    """The plain program, written where a user would keep it."""
    path = tmp_path / "plain.py"
    path.write_text(PLAIN)
    return path


def attempt_file(daemon: Daemon, job: str, attempt: int, name: str) -> Path:
    """One file of an attempt's evidence folder."""
    return daemon.job_folder(job) / "attempts" / str(attempt) / name


def history(status: dict[str, Any]) -> list[tuple[str | None, str]]:
    """A job's transitions as (from, to)."""
    return [(h.get("from"), h["to"]) for h in status["history"]]


@pytest.mark.slow
def test_bad_command_jobs_are_rejected_naming_each_problem(daemon: Daemon, tmp_path: Path) -> None:
    """Each intake rule, broken once, is refused with its field named."""
    python = sys.executable
    bad = {
        "both.toml": ('id = "a"\ntask = "linreg"\ncommand = ["python"]\n', "task, command"),
        "relative.toml": (command_job("b", [python], workdir="srv/train"), "workdir:"),
        "missing.toml": (
            command_job("c", [python], workdir=str(tmp_path / "nowhere")),
            f"workdir: {tmp_path / 'nowhere'} does not exist",
        ),
        "reserved.toml": (
            command_job("d", [python], env={"JOBWARDEN_RUN_FILE": "/tmp/x"}),
            "env.JOBWARDEN_RUN_FILE: reserved",
        ),
        "badname.toml": (command_job("e", [python], env={"1BAD": "x"}), "env.1BAD: not a"),
        "pattern.toml": (
            command_job("f", [python], sdk=False, heartbeat={"pattern": "step ("}),
            "heartbeat.pattern:",
        ),
        "heartbeat-sdk.toml": (
            command_job("g", [python], heartbeat={"pattern": "^step"}),
            "heartbeat: only for a plain program",
        ),
        "faults-plain.toml": (
            command_job("h", [python], sdk=False, faults={"fail_after": 2}),
            "faults.fail_after: a plain program",
        ),
        "shell.toml": ('id = "i"\ncommand = "python train.py"\n', "command:"),
    }
    for name, (text, _) in bad.items():
        daemon.drop(name, text)
    rejected = daemon.root / "spool" / "rejected"
    wait_until(
        lambda: len(list(rejected.glob("*.error.json"))),
        lambda count: count >= len(bad),
        timeout=20,
        what=f"{len(bad)} error files",
    )
    for name, (_, needle) in bad.items():
        problems = json.loads((rejected / f"{name}.error.json").read_text())["problems"]
        assert any(needle in problem for problem in problems), (name, problems)
    both = json.loads((rejected / "both.toml.error.json").read_text())["problems"]
    assert "'linreg'" in both[0]
    assert "['python']" in both[0]


@pytest.mark.slow
def test_an_sdk_program_is_recovered_and_verified_like_a_task(
    daemon: Daemon, tmp_path: Path
) -> None:
    """fail_after 6 through the run file: resumed from 4, updates 5 and 6 verified, done at 8."""
    program = tmp_path / "work" / "train.py"
    program.parent.mkdir()
    shutil.copy(HERE / "sdk_program.py", program)
    text = command_job(
        "sdk",
        [sys.executable, str(program)],
        workdir=str(program.parent),
        run={"steps": 8},
        faults={"fail_after": 6},
        supervision={"stall_timeout_s": 60},  # it compiles after ready, on a busy box
    )
    daemon.drop("sdk.toml", text)
    status = daemon.wait("sdk", timeout=180)
    (incident,) = daemon.incidents("sdk")
    assert (status["state"], status["attempt"], status["step"]) == ("completed", 2, 8)
    assert (incident["kind"], incident["status"]) == ("crash", "verified")
    assert incident["recovery_point"]["step"] == 4
    assert [c["step"] for c in incident["verification"]["checks"]] == [4, 5, 6]
    first = json.loads(attempt_file(daemon, "sdk", 1, RUN_FILE).read_text())
    second = json.loads(attempt_file(daemon, "sdk", 2, RUN_FILE).read_text())
    assert (first["run"], first["faults"], second["faults"]) == (
        {"steps": 8},
        {"fail_after": 6},
        {},
    )
    assert first["checkpoint_dir"] == str(daemon.root / "checkpoints" / "sdk")
    assert "command `" in incident["symptom"]
    assert "train.py" in incident["symptom"]


@pytest.mark.slow
def test_a_plain_program_killed_mid_run_restarts_unverified_and_completes(
    daemon: Daemon, plain: Path, tmp_path: Path
) -> None:
    """SIGKILL of a program without the SDK: restarted, its incident unverified at once."""
    work = tmp_path / "work"
    work.mkdir()
    text = command_job(
        "plain",
        [sys.executable, str(plain), "12", "0.1", "0", "-"],
        workdir=str(work),
        env={"GREETING": "hello"},
        sdk=False,
        heartbeat={"pattern": "^step [0-9]+"},
        supervision={"restart_backoff_s": 0.1, "stall_timeout_s": 5},
    )
    daemon.drop("plain.toml", text)
    output = attempt_file(daemon, "plain", 1, "output.log")
    wait_until(
        lambda: output.read_text() if output.exists() else "",
        lambda seen: "step 3\n" in seen,
        timeout=30,
        what="step 3 of attempt 1",
    )
    os.kill(daemon.state("plain")["pid"], signal.SIGKILL)
    status = daemon.wait("plain", timeout=60)
    (incident,) = daemon.incidents("plain")
    assert (status["state"], status["attempt"]) == ("completed", 2)
    assert (incident["kind"], incident["status"]) == ("crash", "unverified")
    assert incident["verification"]["text"] == NO_SDK
    assert "killed by SIGKILL" in incident["symptom"]
    assert incident["outcome"].endswith("The program then exited 0: the job completed.")
    assert ("recovering", "running") in history(status)  # concluded when attempt 2 started
    assert history(status)[-1] == ("running", "completed")
    first, second = output.read_text(), attempt_file(daemon, "plain", 2, "output.log").read_text()
    assert first.startswith(f"hello from {work}, after step 0\n")
    resumed = int(re.search(r"after step (\d+)", second).group(1))  # type: ignore[union-attr]
    assert resumed >= 3
    assert second.endswith("step 12\n")
    assert not attempt_file(daemon, "plain", 1, "events.jsonl").exists()
    metrics = daemon.ask("metrics")["text"]
    assert re.search(r"^jobwarden_malformed_event_lines_total 0\.0$", metrics, re.M)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pattern", "file"])
def test_a_plain_program_whose_heartbeat_stops_is_a_stall(
    daemon: Daemon, plain: Path, tmp_path: Path, kind: str
) -> None:
    """No heartbeat for stall_timeout_s: stopped, failed as a stall, its output kept."""
    work = tmp_path / "work"
    work.mkdir()
    beat = {"pattern": "^step"} if kind == "pattern" else {"file": "beat"}
    text = command_job(
        "hung",
        [sys.executable, str(plain), "100", "0.1", "4", "beat" if kind == "file" else "-"],
        workdir=str(work),
        sdk=False,
        heartbeat=beat,
        supervision={"stall_timeout_s": 1.0, "max_restarts": 0},
    )
    daemon.drop("hung.toml", text)
    status = daemon.wait("hung", timeout=60)
    (incident,) = daemon.incidents("hung")
    assert (status["state"], incident["kind"], incident["status"]) == ("failed", "stall", "failed")
    assert 1.0 <= incident["details"]["gap_s"] < 1.5
    assert "showed no heartbeat" in incident["symptom"]
    assert "stack dump" not in incident["evidence"]
    assert ("running", "stalled") in history(status)
    assert attempt_file(daemon, "hung", 1, "output.log").read_text().endswith("step 3\n")


@pytest.mark.slow
def test_a_plain_program_survives_a_daemon_kill(
    tmp_path: Path, compile_cache: Path, plain: Path
) -> None:
    """kill -9 of wardend mid-run: the orphan is waited out, the job resumed, unverified."""
    text = command_job("orphan", [sys.executable, str(plain), "30", "0.1", "0", "-"], sdk=False)
    first = Daemon(tmp_path / "root", compile_cache).start()
    try:
        first.drop("orphan.toml", text)
        output = attempt_file(first, "orphan", 1, "output.log")
        wait_until(
            lambda: output.read_text() if output.exists() else "",
            lambda seen: "step 2\n" in seen,
            timeout=30,
            what="step 2 of attempt 1",
        )
    finally:
        first.stop(signal.SIGKILL)
    with Daemon(tmp_path / "root", compile_cache) as second:
        status = second.wait("orphan", timeout=60)
        (incident,) = second.incidents("orphan")
    assert (status["state"], status["attempt"]) == ("completed", 2)
    assert (incident["kind"], incident["status"]) == ("daemon_restart", "unverified")
    assert "output" in incident["evidence"]
    assert attempt_file(second, "orphan", 2, "output.log").read_text().endswith("step 30\n")


def test_the_spec_and_run_file_of_a_command_job(tmp_path: Path) -> None:
    """argv, cwd, env over the allow-list, output.log, and a 0600 run file of set fields only."""
    root = Root(tmp_path / "root")
    (root.jobs / "p").mkdir(parents=True)
    root.checkpoints.mkdir()
    job = job_from_mapping(
        {
            "id": "p",
            "command": ["train", "--epochs", "3"],
            "workdir": str(tmp_path),
            "env": {"XLA_FLAGS": "--mine", "GREETING": "hi"},
            "sdk": True,
            "run": {"steps": 50},
            "faults": {"crash_after": 7},
        }
    )
    record = JobRecord(id="p", job=job, attempt=1)
    base = {"PATH": "/usr/bin", "XLA_FLAGS": "--daemon"}
    key = tmp_path / "key"
    spec = prepare(root, record, tmp_path / "cache", key, base)
    run_file = spec.folder / RUN_FILE
    assert (spec.argv, spec.cwd, spec.stdout) == (
        ["train", "--epochs", "3"],
        tmp_path,
        "events.jsonl",
    )
    assert {
        "PATH": "/usr/bin",
        "XLA_FLAGS": "--mine",
        "GREETING": "hi",
        RUN_FILE_ENV: str(run_file),
    } == spec.env
    assert stat.S_IMODE(run_file.stat().st_mode) == 0o600
    assert {
        "v": 1,
        "checkpoint_dir": str(root.checkpoints / "p"),
        "job_id": "p",
        "run": {"steps": 50},
        "faults": {"crash_after": 7},
        "compile_cache": str(tmp_path / "cache"),
        "signing_key": str(key),
    } == json.loads(run_file.read_text())
    settings = resolve(
        checkpoint_dir=None,
        run={"steps": 10, "checkpoint_every": 5},
        faults={"step_delay_s": 0.5},
        compile_cache=None,
        signing_key=None,
        job_id=None,
        options={},
        environ={RUN_FILE_ENV: str(run_file)},
    )
    assert (settings.run.steps, settings.run.checkpoint_every) == (50, 5)
    assert (settings.faults.crash_after, settings.faults.step_delay_s) == (7, 0.5)
    record.attempt = 2
    later = prepare(root, record, tmp_path / "cache", None, base)
    document = read_run_file(later.folder / RUN_FILE)
    assert (document.faults.model_dump(exclude_unset=True), document.signing_key) == ({}, None)


def test_a_plain_program_without_workdir_runs_in_its_attempt_folder(tmp_path: Path) -> None:
    """sdk = false: stdout goes to output.log, the cwd is the evidence folder, the
    checkpoint directory is made for it."""
    root = Root(tmp_path / "root")
    (root.jobs / "q").mkdir(parents=True)
    root.checkpoints.mkdir()
    job = job_from_mapping({"id": "q", "command": ["./run.sh"], "sdk": False})
    spec = prepare(root, JobRecord(id="q", job=job, attempt=1), tmp_path, None, {})
    assert (spec.cwd, spec.stdout) == (spec.folder, "output.log")
    assert stat.S_IMODE((root.checkpoints / "q").stat().st_mode) == 0o700


def test_a_command_job_reads_back_from_its_own_record_unchanged(tmp_path: Path) -> None:
    """job.json keeps only the [run] and [faults] fields the file set, and a missing
    workdir does not make a job already taken in unreadable."""
    workdir = tmp_path / "gone"
    workdir.mkdir()
    document = {
        "id": "r",
        "command": ["python", "t.py"],
        "workdir": str(workdir),
        "env": {"A": "1"},
        "sdk": False,
        "heartbeat": {"pattern": "^step"},
        "run": {"steps": 5},
    }
    job = job_from_mapping(document, check_workdir=True)
    workdir.rmdir()
    again = job_from_mapping(json.loads(json.dumps(job.to_record())))
    assert job == again
    assert again.run.model_fields_set == {"steps"}
    assert (again.to_record()["run"], again.to_record()["faults"]) == ({"steps": 5}, {})
    assert again.label() == "command `python t.py`"


def test_a_long_command_keeps_its_program_name_in_words() -> None:
    """A deep interpreter path and a deep script path still show the script's name."""
    deep = "/" + "/".join(["very-long-folder-name"] * 8)
    argv = [f"{deep}/bin/python3", f"{deep}/work/train.py", "--lr", "0.1"]
    job = job_from_mapping({"id": "l", "command": argv, "sdk": False})
    assert job.label() == "command `.../python3 .../train.py --lr 0.1`"
    many = job_from_mapping({"id": "m", "command": ["run", *["x" * 30] * 10, "last"], "sdk": False})
    assert many.program is not None
    label = many.program.label()
    assert (len(label), label[:4], label[-5:]) == (120, "run ", " last")
    assert "..." in label


class TestHeartbeat:
    """The plain program's heartbeat watch on a hand-driven clock."""

    def watch(self, section: HeartbeatSection, cwd: Path) -> tuple[Heartbeat, FakeClock, list[int]]:
        """A started watch and the beats it reported."""
        clock, beats = FakeClock(), []
        watch = Heartbeat(section, cwd, clock, lambda: beats.append(1), poll_s=0.25)
        watch.start()
        return watch, clock, beats

    def test_matching_lines_are_beats(self, tmp_path: Path) -> None:
        """Only lines the pattern finds (re.search) count; every line is remembered."""
        watch, _, beats = self.watch(HeartbeatSection(pattern="^step [0-9]+"), tmp_path)
        for line in ("loading", "step 1", "  step 2", "step 3 loss 0.1"):
            watch.line(line)
        assert (len(beats), watch.lines, watch.last_line) == (2, 4, "step 3 loss 0.1")

    def test_a_file_change_is_a_beat_and_an_old_file_is_not(self, tmp_path: Path) -> None:
        """The file's existing mtime is the baseline; each change seen at a poll is one beat."""
        beat = tmp_path / "beat"
        beat.touch()
        os.utime(beat, ns=(1, 1))
        watch, clock, beats = self.watch(HeartbeatSection(file="beat"), tmp_path)
        clock.advance(1.0)
        assert beats == []
        os.utime(beat, ns=(2, 2))
        clock.advance(0.25)
        clock.advance(1.0)
        assert len(beats) == 1
        watch.cancel()
        os.utime(beat, ns=(3, 3))
        clock.advance(1.0)
        assert len(beats) == 1

    def test_without_a_heartbeat_nothing_is_watched(self, tmp_path: Path) -> None:
        """No [heartbeat]: not watching, lines are only remembered."""
        clock = FakeClock()
        watch = Heartbeat(None, tmp_path, clock, lambda: pytest.fail("no beat expected"))
        watch.start()
        watch.line("step 1")
        clock.advance(5)
        assert (watch.watching, watch.last_line) == (False, "step 1")
