"""Fixtures shared by the tests: a private compilation cache and shared reference runs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import AttemptResult, job, run_worker

Runner = Callable[..., AttemptResult]


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One private JAX compilation cache per test process, so restarts skip recompiling."""
    path = tmp_path_factory.mktemp("compile-cache")
    path.chmod(0o700)
    return path


@pytest.fixture
def worker(compile_cache: Path, tmp_path: Path) -> Runner:
    """Run a worker attempt on a job file and checkpoint directory; evidence under tmp_path."""
    counter = iter(range(1, 1000))

    def run(job_file: Path, checkpoint_dir: Path, folder: Path | None = None) -> AttemptResult:
        return run_worker(
            job_file,
            checkpoint_dir,
            folder or tmp_path / "attempts" / str(next(counter)),
            compile_cache,
        )

    return run


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory, compile_cache: Path) -> AttemptResult:
    """The uninterrupted default linreg run (seed 3, 8 steps), keeping every checkpoint."""
    base = tmp_path_factory.mktemp("reference")
    spec = job(base / "reference.toml", "reference", run={"keep_checkpoints": 8})
    result = run_worker(spec, base / "checkpoints", base / "run", compile_cache)
    assert result.exit_status == 0
    return result


@pytest.fixture(scope="session")
def lesson_drill(
    tmp_path_factory: pytest.TempPathFactory, compile_cache: Path
) -> tuple[AttemptResult, AttemptResult]:
    """The lesson's drill by hand: fail after update 3, then resume; attempts in run/1, run/2."""
    base = tmp_path_factory.mktemp("lesson-drill")
    failed_spec = job(base / "f.toml", "drill", faults={"fail_after": 3})
    failed = run_worker(failed_spec, base / "ck", base / "run" / "1", compile_cache)
    resumed = run_worker(
        job(base / "r.toml", "drill"), base / "ck", base / "run" / "2", compile_cache
    )
    return failed, resumed
