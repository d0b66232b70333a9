"""The published JSON Schemas: well formed, in step with the code, and able to refuse."""

from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator

from jobwarden.daemon.api.versions import version_1_record
from jobwarden.events import REQUIRED, encode
from tests import schemas


def test_every_schema_file_is_a_valid_draft_2020_12_schema() -> None:
    """Each file of docs/schemas/ checks as a schema and names itself by its file name."""
    files = sorted(schemas.FOLDER.glob("*.schema.json"))
    assert len(files) >= 10
    for path in files:
        contents = json.loads(path.read_text())
        Draft202012Validator.check_schema(contents)
        assert contents["$id"] == path.name


def test_the_events_schema_requires_what_the_parser_requires() -> None:
    """Each event kind the daemon parses has a definition requiring at least its fields."""
    defs = json.loads((schemas.FOLDER / "worker-events.schema.json").read_text())["$defs"]
    for kind, fields in REQUIRED.items():
        assert set(fields) <= set(defs[kind]["required"]), kind


def test_an_encoded_event_of_each_kind_matches() -> None:
    """What `encode` writes for a progress without a loss matches; with no loss field, not."""
    line = encode(
        "progress", {"step": 1, "loss": None, "examples": 8, "update_s": 0.1, "state_hash": None}
    )
    schemas.check("worker-events.schema.json", json.loads(line), "a progress event")
    broken = {k: v for k, v in json.loads(line).items() if k != "loss"}
    with pytest.raises(AssertionError, match="loss"):
        schemas.check("worker-events.schema.json", broken, "a progress without loss")


TRANSITION = {
    "event": "job.transition",
    "level": "info",
    "time": 1.0,
    "time_iso": "1970-01-01T00:00:01.000+00:00",
    "job": "a",
    "from": "queued",
    "to": "starting",
    "reason": "attempt 1 launched",
    "attempt": 1,
}


def test_the_old_names_are_refused() -> None:
    """A transition with source/target, a record with a timestamp, a webhook with a summary."""
    schemas.check("daemon-log.schema.json", TRANSITION, "a transition")
    old = version_1_record(TRANSITION)
    assert (old["source"], old["target"], old["timestamp"]) == (
        "queued",
        "starting",
        "1970-01-01T00:00:01.000Z",
    )
    with pytest.raises(AssertionError):
        schemas.check("daemon-log.schema.json", old, "a version-1 transition")
    notice = {
        "event": "incident.opened",
        "schema": 2,
        "time": 1.0,
        "time_iso": TRANSITION["time_iso"],
        "job": "a",
        "incident": "a-1",
        "kind": "crash",
        "summary": "x",
        "status": "open",
        "attempt": 1,
    }
    with pytest.raises(AssertionError):
        schemas.check("notify.schema.json", notice, "a notification with a summary")
    schemas.check("notify.schema.json", {**notice, "symptom": "x"}, "a notification")


def test_a_version_1_incident_line_has_one_text() -> None:
    """An incident's tail line for a version-1 client: its outcome once closed, as text."""
    line = {"origin": "wardend", "incident": "a-1", "symptom": "s", "outcome": "o", "time": 1.0}
    assert version_1_record(line)["text"] == "o"
    assert "symptom" not in version_1_record(line)
