"""wardenctl inspect and verify as an operator runs them, and the worker's refusals of bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobwarden.checkpoint.store import file_name
from jobwarden.errors import exit_status_table
from jobwarden.worker.command import worker_argv
from tests.conftest import Runner
from tests.helpers import AttemptResult, job, kinds

WARDENCTL = [sys.executable, "-m", "jobwarden.control.cli"]


def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    """Run wardenctl with ``args``."""
    return subprocess.run(
        [*WARDENCTL, *args], capture_output=True, text=True, check=False, timeout=120
    )


def test_inspect_shows_identity_and_values(reference: AttemptResult) -> None:
    """inspect --json --values reports step, provenance, verdict and the small arrays."""
    path = Path(kinds(reference, "checkpoint")[0]["file"])
    shown = ctl("inspect", str(path), "--json", "--values")
    assert shown.returncode == 0
    record = json.loads(shown.stdout)
    assert record["step"] == 2
    assert record["verdict"]["ok"] is True
    assert record["state_hash"] == kinds(reference, "checkpoint")[0]["state_hash"]
    assert set(record["provenance"]) >= {
        "config_hash",
        "data_hash",
        "source_hash",
        "runtime",
        "writer_generation",
    }
    assert record["values"]["key"] == [int(v) for v in record["values"]["key"]]
    assert len(record["values"]["params"]) == 2
    text = ctl("inspect", str(path)).stdout
    assert "accepted" in text
    assert "opt_state/velocity" in text


def test_inspect_refuses_a_damaged_file_but_still_describes_it(
    reference: AttemptResult, tmp_path: Path
) -> None:
    """A flipped data byte: exit 1, the checksum code, and the header still shown."""
    source = Path(kinds(reference, "checkpoint")[0]["file"])
    data = bytearray(source.read_bytes())
    data[-1] ^= 0xFF
    damaged = tmp_path / source.name
    damaged.write_bytes(bytes(data))
    shown = ctl("inspect", str(damaged), "--json")
    assert shown.returncode == 1
    record = json.loads(shown.stdout)
    assert record["verdict"]["code"] == "checkpoint.checksum"
    assert record["step"] == 2


@pytest.mark.slow
def test_verify_exit_status_and_json(
    reference: AttemptResult,
    lesson_drill: tuple[AttemptResult, AttemptResult],
    worker: Runner,
    tmp_path: Path,
) -> None:
    """verify exits 0 for a proven continuation, 1 for a different experiment, 2 for no input."""
    run = lesson_drill[0].folder.parent
    good = ctl("verify", str(reference.folder), str(run), "--json")
    assert good.returncode == 0, good.stdout
    assert json.loads(good.stdout)["replayed_steps"] == [3, 4, 5, 6, 7, 8]
    other = tmp_path / "other"
    worker(job(tmp_path / "o.toml", "o", train={"seed": 4}), tmp_path / "ck2", other)
    bad = ctl("verify", str(reference.folder), str(other))
    assert bad.returncode == 1
    assert "NOT PROVEN" in bad.stdout
    assert "first diverging update: step 1" in bad.stdout
    assert ctl("verify", str(tmp_path / "absent"), str(other)).returncode == 2


def test_invalid_job_file_exits_with_its_own_status(tmp_path: Path) -> None:
    """The worker reports a bad job file as a failed event listing the problems, exit 3."""
    spec = tmp_path / "bad.toml"
    spec.write_text('id = "x"\ntask = "linreg"\n[train]\nbatch_size = 0\n')
    done = subprocess.run(
        worker_argv(spec, tmp_path / "ck"),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 3
    failed = json.loads(done.stdout)
    assert failed["code"] == "job.invalid"
    assert failed["problems"][0].startswith("train.batch_size:")
    assert not (tmp_path / "ck").exists()


def test_shared_compilation_cache_is_refused(worker: Runner, tmp_path: Path) -> None:
    """A compilation cache others can write is refused before any state is touched."""
    unsafe = tmp_path / "cache"
    unsafe.mkdir(mode=0o777)
    unsafe.chmod(0o777)
    done = subprocess.run(
        worker_argv(job(tmp_path / "j.toml", "x"), tmp_path / "ck", unsafe),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 4
    assert "0777" in done.stderr
    assert not (tmp_path / "ck" / file_name(2)).exists()


BASES = ("jobwarden.error", "checkpoint.error", "checkpoint.corrupt", "checkpoint.incompatible")
WORKER_CODES = ("job.invalid", "worker.", "writer.", "resume.", "checkpoint.")


def worker_exit_statuses() -> dict[str, int]:
    """The error codes a worker can exit with, and their statuses."""
    return {
        code: status
        for code, status in exit_status_table().items()
        if code.startswith(WORKER_CODES) and code not in BASES
    }


def test_every_error_code_has_a_distinct_exit_status() -> None:
    """No two worker error codes share an exit status."""
    table = worker_exit_statuses()
    assert len(set(table.values())) == len(table)
    assert table["worker.preempted"] == 75
    assert table["checkpoint.checksum"] == 22


def test_worker_doc_lists_every_error_code_with_its_status() -> None:
    """docs/worker.md documents each worker error code beside its exit status."""
    text = (Path(__file__).parent.parent / "docs" / "worker.md").read_text()
    for code, status in worker_exit_statuses().items():
        assert f"| {status} | `{code}` |" in text, code


def test_help_lists_every_command_and_each_names_its_defaults() -> None:
    """`wardenctl help` is the command list; `help CMD` its options, defaults named; an
    unknown command is a usage error."""
    listing = ctl("help")
    assert listing.returncode == 0
    for name in ("status", "cancel", "remove", "tail", "maintail", "wait-ready", "rejected"):
        assert name in listing.stdout
    ready = ctl("help", "wait-ready")
    assert ready.returncode == 0
    assert "(default: 60.0)" in ready.stdout
    assert "None" not in ready.stdout
    unknown = ctl("help", "stauts")
    assert unknown.returncode == 2
    assert "no command 'stauts'" in unknown.stderr


def test_a_root_that_is_a_file_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    """--root naming a file: one line naming the path, exit 1."""
    (tmp_path / "file").write_text("")
    done = ctl("--root", str(tmp_path / "file"), "status")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert str(tmp_path / "file") in done.stderr
