"""Times a person reads: ISO 8601 with a zone, in text and beside epoch seconds in JSON."""

from __future__ import annotations

import datetime

from jobwarden.control.commands.output import with_iso_times
from jobwarden.control.tables import iso_time, render_event


def test_iso_time_carries_its_zone() -> None:
    """The offset is always written, so the time means one instant wherever it is read."""
    text = iso_time(1_800_000_000.5)
    parsed = datetime.datetime.fromisoformat(text)
    assert parsed.utcoffset() is not None
    assert parsed.timestamp() == 1_800_000_000


def test_json_gets_iso_twins_beside_epoch_seconds() -> None:
    """Every epoch field, nested too, gets `<key>_iso`; other numbers and absent times do not."""
    data = {"time": 1_800_000_000, "step": 3, "incidents": [{"opened": 1_800_000_001.0}]}
    out = with_iso_times(data)
    assert out["time"] == 1_800_000_000  # epoch kept beside
    assert out["time_iso"] == "2027-01-15T08:00:00.000+00:00"
    assert out["incidents"][0]["opened_iso"] == "2027-01-15T08:00:01.000+00:00"
    assert "step_iso" not in out
    assert "closed_iso" not in with_iso_times({"closed": None})


def test_event_lines_show_a_zoned_time() -> None:
    """A tail line's time is ISO 8601 with its offset."""
    line = render_event({"event": "progress", "time": 1_800_000_000, "attempt": 1, "step": 2})
    assert line.startswith(f"#1 {iso_time(1_800_000_000)} progress")
