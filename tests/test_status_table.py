"""The status table built by field name: its order on the wire, its caches, its strict JSON."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from jobwarden.daemon.api import status
from jobwarden.daemon.api.status import TABLE_FIELDS, StatusRows
from jobwarden.daemon.store.jobs import JobTable
from jobwarden.daemon.store.layout import Root
from jobwarden.jobfile import job_from_mapping
from jobwarden.protocol import Encoded, encode_ok

SAMPLE = {"rss_mb": 123.5, "cpu_percent": 7.5, "status": "running", "threads": 4}


def daemon_of(tmp_path: Path, held: set[str]) -> SimpleNamespace:
    """A daemon view of three jobs, ``a`` with progress, and those in ``held`` running."""
    root = Root(tmp_path / "root")
    root.create()
    table = JobTable(root)
    for job_id in ("a", "b", "c"):
        root.job(job_id).mkdir()
        record = table.add(job_from_mapping({"id": job_id, "task": "linreg"}))
        if job_id in held:
            record.sample, record.pid, record.attempt_started = dict(SAMPLE), 42, 990.0
    a = table.get("a")
    assert a is not None
    a.last_progress = 1000.0
    supervisors = dict.fromkeys(held, object())
    return SimpleNamespace(
        table=table,
        supervisors=supervisors,
        is_live=lambda job_id: job_id in supervisors,
        spool=SimpleNamespace(rejected=0),
        started=900.0,
        root=root,
    )


def answer(daemon: SimpleNamespace, rows: StatusRows, full: bool = False) -> Any:
    """The status answer as a client decodes it, each object as its (key, value) pairs."""
    result = status.status(daemon, {"rows": full}, rows)
    assert isinstance(result, Encoded)
    return json.loads(result.data, object_pairs_hook=list)


def test_columns_go_out_in_table_field_order(tmp_path: Path) -> None:
    """The columns object lists TABLE_FIELDS in order, a held job's values in its row."""
    daemon = daemon_of(tmp_path, {"b"})
    pairs = dict(answer(daemon, StatusRows()))
    columns = dict(pairs["columns"])
    assert [name for name, _ in pairs["columns"]] == list(TABLE_FIELDS)
    assert columns["pid"] == [None, 42, None]
    assert columns["rss_mb"] == [None, 123.5, None]
    assert [name for name, _ in answer(daemon, StatusRows())] == ["columns", "totals", "daemon"]


def test_a_settled_row_ends_with_its_uptime_and_age(tmp_path: Path) -> None:
    """rows=true: a held job's row in summary order, a settled one's uptime and age last."""
    daemon = daemon_of(tmp_path, {"b"})
    jobs = dict(answer(daemon, StatusRows(), full=True))["jobs"]
    names = [[name for name, _ in row] for row in jobs]
    assert names[0][-2:] == ["uptime_s", "last_progress_age_s"]
    assert set(names[0]) == set(names[1])
    assert dict(jobs[1])["cpu_percent"] == 7.5


def test_the_columns_are_kept_until_the_table_changes(tmp_path: Path) -> None:
    """The kept columns are the same lists until a save; the answer's are copies."""
    daemon = daemon_of(tmp_path, set())
    rows = StatusRows()
    first = rows.columns(daemon, 1010.0)
    kept = rows.table_columns
    assert rows.columns(daemon, 1011.0)["last_progress_age_s"] == [11.0, None, None]
    assert rows.table_columns is kept
    assert first["id"] is not kept["id"]
    record = daemon.table.get("c")
    record.step = 3
    daemon.table.save(record)
    assert rows.columns(daemon, 1011.0)["step"] == [0, 0, 3]
    assert rows.table_columns is not kept


@pytest.mark.parametrize("full", [False, True])
def test_a_non_finite_sample_is_refused_as_before(tmp_path: Path, full: bool) -> None:
    """orjson would write NaN as null: the answer goes to the strict encoder, which refuses it."""
    daemon = daemon_of(tmp_path, {"b"})
    daemon.table.get("b").sample["rss_mb"] = float("nan")
    result = status.status(daemon, {"rows": full}, StatusRows())
    assert not isinstance(result, Encoded)
    with pytest.raises(ValueError, match="not JSON compliant"):
        encode_ok(1, result)
