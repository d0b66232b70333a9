"""A job file is parsed once by the daemon on its way to a worker, a recovery included."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import psutil
import pytest

from jobwarden import jobfile
from jobwarden.daemon.config import Options
from jobwarden.daemon.intake import spool
from jobwarden.daemon.store.layout import Root
from jobwarden.daemon.wardend import Wardend
from jobwarden.states import JobState

JOB = b'id = "once"\ntask = "linreg"\n[faults]\nfail_after = 3\n'
DEADLINE_S = 120.0


async def run_until_settled(root: Root, options: Options) -> Wardend:
    """Serve ``root`` in this process, drop the job, stop once it has settled."""
    daemon = Wardend(root, options)
    serving = asyncio.get_running_loop().create_task(daemon.run())
    spool.drop(root, "once.toml", JOB)
    waited = 0.0
    while waited < DEADLINE_S:
        record = daemon.table.get("once")
        if record is not None and record.state in (JobState.COMPLETED, JobState.FAILED):
            break
        await asyncio.sleep(0.1)
        waited += 0.1
    daemon.stopping.set()
    assert await serving == 0
    return daemon


def test_a_job_is_parsed_once_from_intake_to_its_recovered_end(
    tmp_path: Path, compile_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Intake validates the request; admission, both launches and the spare reuse that Job."""
    parsed: list[str] = []
    validate = jobfile._Document.model_validate

    def counting(document: Any, *args: Any, **kwargs: Any) -> Any:
        parsed.append(str(document.get("id")) if isinstance(document, dict) else "?")
        return validate(document, *args, **kwargs)

    monkeypatch.setattr(jobfile._Document, "model_validate", counting)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    options = Options(compile_cache=compile_cache, rescan_interval_s=0.2, max_concurrent=1)
    root = Root(tmp_path / "root")
    umask = os.umask(0o077)  # as wardend runs (cli.main), for this test only
    try:
        root.create()
        daemon = asyncio.run(run_until_settled(root, options))
    finally:
        os.umask(umask)
    record = daemon.table.get("once")
    assert record is not None
    assert (record.state, record.attempt) == (JobState.COMPLETED, 2)
    assert parsed == ["once"]
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    _gone, alive = psutil.wait_procs(left, timeout=10)
    assert alive == []
