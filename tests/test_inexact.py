"""``[run] exact = false``: exactness given up on purpose, the job still supervised, every
recovery concluded unverified with the reason, and no attempt pinned to one thread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jobwarden.errors import JobFileError
from jobwarden.jobfile import job_from_mapping
from jobwarden.runtime import (
    PINNED_ENV,
    PINNED_XLA_FLAGS,
    THREAD_ENV,
    pin_environment,
    unpinned,
)
from tests.daemon import Daemon, linreg_job


def test_exact_is_the_default_and_must_be_a_boolean() -> None:
    """A job is exact unless it says ``exact = false``; anything but a boolean is refused."""
    base = {"id": "j", "task": "linreg"}
    assert job_from_mapping(base).run.exact is True
    assert job_from_mapping({**base, "run": {"exact": False}}).run.exact is False
    with pytest.raises(JobFileError, match=r"run\.exact"):
        job_from_mapping({**base, "run": {"exact": "no"}})


def test_an_inexact_environment_has_neither_the_xla_pins_nor_the_thread_limits() -> None:
    """``exact=False`` sets the platform and the precision only; the caller's flags stay."""
    pinned, free = {"XLA_FLAGS": "--xla_dump_to=x"}, {"XLA_FLAGS": "--xla_dump_to=x"}
    pin_environment(pinned)
    pin_environment(free, exact=False)
    assert all(flag in pinned["XLA_FLAGS"].split() for flag in PINNED_XLA_FLAGS)
    assert free["XLA_FLAGS"] == "--xla_dump_to=x"
    assert {name: free.get(name) for name in PINNED_ENV} == {
        name: None if name in THREAD_ENV else value for name, value in PINNED_ENV.items()
    }


def test_unpinned_takes_off_the_pins_only() -> None:
    """What a pinned daemon would pass on, without the pins; other flags and values kept."""
    pinned = {"XLA_FLAGS": "--xla_dump_to=x", "OPENBLAS_NUM_THREADS": "4"}
    pin_environment(pinned)
    assert unpinned(pinned) == {
        **{name: value for name, value in PINNED_ENV.items() if name not in THREAD_ENV},
        "XLA_FLAGS": "--xla_dump_to=x",
        "OPENBLAS_NUM_THREADS": "4",
    }


def log_records(daemon: Daemon, event: str) -> list[dict[str, Any]]:
    """The daemon's structlog records named ``event``."""
    lines = (daemon.root / "wardend.log").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("event") == event]


@pytest.mark.slow
def test_an_inexact_job_recovers_unverified_and_cold(
    tmp_path: Path, compile_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fail after 3 under a daemon with warm spares, started in a pinned environment: no
    spare is started for the job (a spare runs pinned), both attempts run unpinned (the
    daemon's pins are not passed on), the recovery is concluded unverified naming the
    choice, and the job completes."""
    dump = f"--xla_dump_to={tmp_path / 'xla-dump'}"  # a flag of the daemon's own, kept
    pinned: dict[str, str] = {"XLA_FLAGS": dump}
    pin_environment(pinned)
    for name, value in pinned.items():
        monkeypatch.setenv(name, value)
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        faults = {"fail_after": 3}
        daemon.drop("free.toml", linreg_job("free", run={"exact": False}, faults=faults))
        status = daemon.wait("free")
        assert (status["state"], status["attempt"]) == ("completed", 2)
        (incident,) = daemon.incidents("free")
        assert incident["status"] == "unverified"
        assert incident["recovery_point"]["step"] == 2
        assert incident["verification"]["checks"] == []
        assert "[run] exact = false" in incident["verification"]["text"]
        assert log_records(daemon, "spare.started") == []
        for attempt in (1, 2):
            (started,) = [e for e in daemon.events("free", attempt) if e["event"] == "started"]
            flags = started["runtime"]["xla_flags"].split()
            assert not set(PINNED_XLA_FLAGS) & set(flags), flags
            assert dump in flags
        runbook = (daemon.job_folder("free") / "incidents" / f"{incident['id']}.md").read_text()
        assert "exact = false" in runbook


PROGRAM = """
import sys
import numpy as np
import jobwarden.sdk as jw

exact = sys.argv[2] == "exact"
with jw.attach(config={"lr": 0.1}, data_hash="none", name="toy", steps=2, exact=exact,
               checkpoints="external", events=sys.argv[1], argv=[], environ={}) as run:
    state = {"w": np.zeros(2, np.float32)}
    for step in run.steps(state):
        state = {"w": state["w"] + 1}
        run.progress(step, state)
"""


@pytest.mark.parametrize("exact", ["exact", "inexact"])
def test_an_sdk_program_is_pinned_unless_it_gives_up_exactness(tmp_path: Path, exact: str) -> None:
    """``attach(exact=False)``: JAX starts with XLA's own threads, as ``started`` records."""
    script, events = tmp_path / "program.py", tmp_path / "events.jsonl"
    script.write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS" and k not in THREAD_ENV}
    done = subprocess.run(
        [sys.executable, str(script), str(events), exact],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in events.read_text().splitlines()]
    (started,) = [r for r in records if r["event"] == "started"]
    pinned = set(PINNED_XLA_FLAGS) <= set(started["runtime"]["xla_flags"].split())
    assert pinned is (exact == "exact")
    assert started["run"]["exact"] is (exact == "exact")
