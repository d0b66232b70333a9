"""The examples/ programs, run as a user runs them: exact resumes proven, the stated accuracy
reached, a nondeterministic data order caught and named, a plain program's heartbeat."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import signal
import subprocess
import sys
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from jobwarden.checkpoint import format
from jobwarden.jobfile import FaultSection, job_from_mapping, load_document
from jobwarden.proof import verify
from jobwarden.sdk.settings import RUN_FILE_ENV, RunFile
from tests.daemon import Daemon
from tests.helpers import AttemptResult, kinds

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NAMES = ("digits", "orbax", "nondeterministic", "plain")
DIGITS_ACCURACY = 0.95
"""A little under the measured 95.8 % (345 of 360 held-out images) after 120 updates."""
DIGITS_BATCHES_PER_EPOCH = 28  # 1,437 training images // 50
EXTRA = ("flax", "sklearn")


def require(*modules: str) -> None:
    """Skip, saying what to install, when the examples extra is not installed."""
    absent = [name for name in modules if importlib.util.find_spec(name) is None]
    if absent:
        pytest.skip(
            f"the examples extra is not installed ({', '.join(absent)} not importable): "
            "pip install -c constraints.txt -e '.[examples]'"
        )


def fault_step(example: str, low: int, high: int) -> int:
    """An update to fault at, drawn at random but the same on every run (seeded by name)."""
    return random.Random(example).randint(low, high)


class Program:
    """One example program, started as a user would: ``python train.py ARGS``."""

    def __init__(self, name: str, cache: Path, base: Path) -> None:
        self.path = EXAMPLES / name / "train.py"
        self.cache = cache
        self.base = base
        self.count = 0

    def start(
        self, *args: str, run_file: RunFile | None = None, hash_seed: int | None = None
    ) -> tuple[subprocess.Popen[bytes], Path]:
        """Start the program; its evidence folder gets the run file, events and stderr."""
        self.count += 1
        folder = self.base / f"attempt-{self.count}"
        folder.mkdir()
        env = dict(os.environ, JOBWARDEN_COMPILE_CACHE=str(self.cache))
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ left in examples/
        env.pop(RUN_FILE_ENV, None)
        env.pop("PYTHONHASHSEED", None)
        if run_file is not None:
            (folder / "run.json").write_text(run_file.model_dump_json(exclude_unset=True))
            env[RUN_FILE_ENV] = str(folder / "run.json")
        if hash_seed is not None:
            env["PYTHONHASHSEED"] = str(hash_seed)
        with (folder / "events.jsonl").open("wb") as out, (folder / "stderr.log").open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, str(self.path), *args], stdout=out, stderr=err, env=env, cwd=folder
            )
        return proc, folder

    @staticmethod
    def finish(*started: tuple[subprocess.Popen[bytes], Path]) -> list[AttemptResult]:
        """Wait for started programs to end; none is left running, whatever happens."""
        try:
            return [AttemptResult(folder, proc.wait(timeout=120)) for proc, folder in started]
        finally:
            for proc, _ in started:
                proc.kill()
                proc.wait()

    def run(self, *args: str, run_file: RunFile | None = None) -> AttemptResult:
        """Run the program to its end."""
        return self.finish(self.start(*args, run_file=run_file))[0]


def stderr_of(result: AttemptResult) -> str:
    """The end of an attempt's stderr, for an assertion message."""
    return (result.folder / "stderr.log").read_text()[-3000:]


def proven(reference: AttemptResult, attempts: Sequence[AttemptResult]) -> verify.Report:
    """Verify the attempts (in order) against the uninterrupted reference run."""
    candidate = verify.Run("candidate", [a.events() for a in attempts], 0)
    return verify.verify(verify.Run("reference", [reference.events()], 0), candidate)


@pytest.fixture
def program(compile_cache: Path, tmp_path: Path) -> Callable[[str], Program]:
    """An example's program, with this test's compilation cache and evidence folder."""
    return lambda name: Program(name, compile_cache, tmp_path)


@pytest.mark.slow
def test_digits_resumes_exactly_after_a_failure_and_reaches_its_accuracy(
    program: Callable[[str], Program], tmp_path: Path
) -> None:
    """Failed at a seeded random update and run again: every resumed update's full state
    equals the uninterrupted run's, data position included; held-out accuracy >= 95 %."""
    require(*EXTRA)
    digits = program("digits")
    fault = fault_step("digits", 11, 119)
    failing = RunFile(checkpoint_dir=str(tmp_path / "ck"), faults=FaultSection(fail_after=fault))
    reference, failed = Program.finish(
        digits.start("--checkpoint-dir", str(tmp_path / "ref")), digits.start(run_file=failing)
    )
    assert reference.exit_status == 0, stderr_of(reference)
    assert failed.exit_status == 10, stderr_of(failed)
    resumed = digits.run("--checkpoint-dir", str(tmp_path / "ck"))
    assert resumed.exit_status == 0, stderr_of(resumed)
    restored = fault // 10 * 10
    assert [e["step"] for e in kinds(resumed, "restored")] == [restored]
    report = proven(reference, [failed, resumed])
    assert report.proven, verify.render(report)
    assert report.replayed_steps == list(range(restored + 1, 121))
    saved = format.read(Path(kinds(resumed, "restored")[0]["file"]))
    position = (saved.arrays["data/epoch"].item(), saved.arrays["data/index"].item())
    assert divmod(restored, DIGITS_BATCHES_PER_EPOCH) == position
    accuracy = [kinds(r, "progress")[-1]["metrics"]["test_accuracy"] for r in (reference, resumed)]
    assert accuracy[0] >= DIGITS_ACCURACY
    assert accuracy[0] == accuracy[1]


@pytest.mark.slow
def test_orbax_checkpoints_resume_after_a_crash_verified_from_state_hashes(
    program: Callable[[str], Program], tmp_path: Path
) -> None:
    """SIGKILLed at a seeded random update, run again: Orbax restores its newest finished save
    and the log proves every replayed update equal; jobwarden wrote no checkpoint of its own."""
    require(*EXTRA, "orbax.checkpoint")
    orbax = program("orbax")
    fault = fault_step("orbax", 21, 59)
    ck = tmp_path / "ck"
    crashing = RunFile(checkpoint_dir=str(ck), faults=FaultSection(crash_after=fault))
    reference, crashed = Program.finish(
        orbax.start("--checkpoint-dir", str(tmp_path / "ref")), orbax.start(run_file=crashing)
    )
    assert reference.exit_status == 0, stderr_of(reference)
    assert crashed.exit_status == -signal.SIGKILL, stderr_of(crashed)
    resumed = orbax.run("--checkpoint-dir", str(ck))
    assert resumed.exit_status == 0, stderr_of(resumed)
    restored = kinds(resumed, "restored")[0]
    last_save = fault // 10 * 10  # still in flight when the process was killed, perhaps
    assert restored["step"] in (last_save, last_save - 10)
    assert (restored["checks"], restored["checkpointer"]) == ([], "external")
    report = proven(reference, [crashed, resumed])
    assert report.proven, verify.render(report)
    assert report.replayed_steps == list(range(restored["step"] + 1, 61))
    assert not list(ck.glob("*.safetensors"))
    assert {"40", "50", "60"} <= {p.name for p in ck.iterdir() if p.is_dir()}


@pytest.mark.slow
def test_orbax_job_file_under_wardend_crashes_and_its_replay_is_verified_by_the_daemon(
    compile_cache: Path, tmp_path: Path
) -> None:
    """examples/orbax/job.toml dropped into a real wardend's spool with a crash at a seeded
    random update: the daemon restarts it, Orbax restores its newest finished save, and the
    daemon's incident is concluded verified from the logged state hashes; the job completes."""
    require(*EXTRA, "orbax.checkpoint")
    fault = fault_step("orbax under wardend", 21, 59)
    document = load_document(EXAMPLES / "orbax" / "job.toml")
    document["command"] = [sys.executable, *document["command"][1:]]  # this interpreter
    document["env"] = {"PYTHONDONTWRITEBYTECODE": "1"}  # no __pycache__ left in examples/
    document["faults"] = {"crash_after": fault}
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        daemon.drop("orbax.json", json.dumps(document))
        status = daemon.wait("orbax", timeout=600)
        incidents = daemon.incidents("orbax")
        resumed = daemon.events("orbax", 2)
    assert (status["state"], status["attempt"], status["step"]) == ("completed", 2, 60)
    (incident,) = incidents
    assert (incident["kind"], incident["status"]) == ("crash", "verified"), incident["outcome"]
    restored = next(e for e in resumed if e["event"] == "restored")
    last_save = fault // 10 * 10  # still in flight when the process was killed, perhaps
    assert restored["step"] in (last_save, last_save - 10)
    assert (restored["checks"], restored["checkpointer"]) == ([], "external")
    checked = [c["step"] for c in incident["verification"]["checks"]]
    assert checked == list(range(restored["step"], fault + 1))
    ck = tmp_path / "root" / "checkpoints" / "orbax"
    assert not list(ck.glob("*.safetensors"))
    assert "60" in {p.name for p in ck.iterdir() if p.is_dir()}


@pytest.mark.slow
def test_a_set_in_the_data_order_is_caught_naming_the_step_and_the_components(
    program: Callable[[str], Program],
) -> None:
    """Two runs whose set of shard names iterates in different orders (another hash seed):
    verify names update 1 and the components the batches feed; the data position agrees."""
    require(*EXTRA)
    nondeterministic = program("nondeterministic")
    first, second = Program.finish(
        nondeterministic.start("--checkpoint-dir", "ck", hash_seed=1),
        nondeterministic.start("--checkpoint-dir", "ck", hash_seed=2),
    )
    assert (first.exit_status, second.exit_status) == (0, 0), stderr_of(first) + stderr_of(second)
    orders = [re.findall(r"order: (.*)", stderr_of(r)) for r in (first, second)]
    assert orders[0] != orders[1]
    report = proven(first, [second])
    assert not report.proven
    assert report.first_divergence is not None
    expected = (1, ["model", "optimizer"])
    assert expected == (report.first_divergence["step"], report.first_divergence["components"])
    step_1 = [next(e for e in kinds(r, "progress") if e["step"] == 1) for r in (first, second)]
    assert step_1[0]["components"]["data"] == step_1[1]["components"]["data"]


@pytest.mark.slow
def test_the_plain_program_beats_its_job_files_heartbeat_once_per_update(
    program: Callable[[str], Program], tmp_path: Path
) -> None:
    """Without the SDK: each update prints a line the job file's heartbeat pattern matches,
    and the program keeps its own checkpoint."""
    require("sklearn")
    job = tomllib.loads((EXAMPLES / "plain" / "job.toml").read_text())
    ck = tmp_path / "own"
    result = program("plain").run("--checkpoint-dir", str(ck), "--steps", "12")
    assert result.exit_status == 0, stderr_of(result)
    lines = (result.folder / "events.jsonl").read_text().splitlines()
    beats = [line for line in lines if re.search(job["heartbeat"]["pattern"], line)]
    assert [f"step {n}" for n in range(1, 13)] == [" ".join(b.split()[:2]) for b in beats]
    assert sorted(p.name for p in ck.iterdir()) == ["latest.npz"]


@pytest.mark.parametrize("name", NAMES)
def test_each_example_ships_a_program_a_readme_and_a_valid_job_file(
    name: str, tmp_path: Path
) -> None:
    """train.py, README.md and job.toml, whose workdir is the documented placeholder and
    which the job file schema accepts once it is edited as the README says."""
    folder = EXAMPLES / name
    assert (folder / "train.py").is_file()
    assert (folder / "README.md").is_file()
    text = (folder / "job.toml").read_text()
    document = tomllib.loads(text)
    expected = (name, ["python", "train.py"], ".", name != "plain")
    assert expected == (document["id"], document["command"], document["workdir"], document["sdk"])
    assert ("heartbeat" in document) == (name == "plain")
    resolved = load_document(folder / "job.toml")
    job = job_from_mapping(resolved, str(folder / "job.toml"), check_workdir=True)
    assert job.program is not None
    assert job.program.workdir == str(folder)
