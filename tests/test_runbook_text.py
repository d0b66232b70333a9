"""A runbook reads as a person wrote it: no `None`, no "Updates none."."""

from __future__ import annotations

from jobwarden.daemon.incidents.records import Incident, render_runbook
from jobwarden.daemon.supervise.policy import IncidentKind


def incident(**fields: object) -> Incident:
    """A crash incident restored at step 4 with nothing replayed, and no generation known."""
    base: dict[str, object] = {
        "id": "j-1",
        "job": "j",
        "kind": IncidentKind.CRASH,
        "opened": 1_800_000_000.0,
        "attempt": 1,
        "symptom": "Attempt 1 of job j (task linreg) was killed by SIGKILL.",
        "recovery_point": {
            "step": 4,
            "file": "ck/ckpt-0000000004.safetensors",
            "checks": ["readable", "checksum"],
        },
    }
    return Incident(**{**base, **fields})  # type: ignore[arg-type]


def test_nothing_replayed_is_said_in_words() -> None:
    """A failure right after a commit replays nothing: said so, not "Updates none."."""
    text = render_runbook(incident())
    assert "Updates none" not in text
    assert "No update was done again" in text
    assert "None" not in text


def test_replayed_updates_are_listed() -> None:
    """Three updates done again are a range; one is "Update N"."""
    assert "Updates 5..7 (3 updates)" in render_runbook(incident(replayed_steps=[5, 6, 7]))
    assert "Update 5." in render_runbook(incident(replayed_steps=[5]))
