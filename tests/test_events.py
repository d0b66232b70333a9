"""Event lines: valid ones parse into typed events, anything else is kept as evidence."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

import jobwarden.sdk as jw
from jobwarden.events import Emitter, Event, Malformed, SupervisorGone, parse_line, step_ranges


def test_emitted_events_parse_back() -> None:
    """An event written by the emitter carries the schema version and parses."""
    stream = io.StringIO()
    Emitter(stream).emit("checkpoint", step=2, file="f", bytes=10, seconds=0.1, state_hash="h")
    parsed = parse_line(stream.getvalue())
    assert isinstance(parsed, Event)
    assert (parsed.kind, parsed["step"], parsed["v"]) == ("checkpoint", 2, 1)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"event": "progress", "step": 1}', "schema version"),
        ('{"v": 1, "event": "teleported"}', "unknown event kind"),
        ('{"v": 1, "event": "completed", "step": "8", "state_hash": "h"}', "completed.step"),
        ('{"v": 1, "event": "completed", "step": true, "state_hash": "h"}', "completed.step"),
        ("\udcff{", "not JSON"),
    ],
)
def test_malformed_lines_are_kept_with_a_reason(line: str, reason: str) -> None:
    """Each kind of bad line yields a Malformed naming what was wrong, never an exception."""
    parsed = parse_line(line, 7)
    assert isinstance(parsed, Malformed)
    assert reason in parsed.reason
    assert (parsed.line, parsed.lineno) == (line, 7)


def test_non_finite_values_are_written_as_text() -> None:
    """A NaN loss is emitted as valid JSON, not as a bare NaN token."""
    stream = io.StringIO()
    Emitter(stream).emit(
        "progress", step=1, loss=float("nan"), examples=8, update_s=0.0, state_hash=None
    )
    assert json.loads(stream.getvalue())["loss"] == "nan"


def test_a_progress_without_a_loss_says_null() -> None:
    """An SDK run whose program reports no loss writes "loss": null, not the string "nan"."""
    events = io.StringIO()
    with jw.attach(
        config={},
        data_hash="none",
        name="quiet",
        steps=2,
        checkpoints="external",
        events=events,
        argv=[],
        environ={},
    ) as run:
        state = {"params": np.zeros(2, np.float32)}
        for step in run.steps(state):
            run.progress(step, state, loss=float("inf") if step == 2 else None)
    lines = [json.loads(line) for line in events.getvalue().splitlines()]
    assert [e["loss"] for e in lines if e["event"] == "progress"] == [None, "inf"]


def test_a_broken_stream_raises_supervisor_gone() -> None:
    """Writing to a closed pipe is reported as the supervisor being gone."""
    stream = io.StringIO()
    stream.close()
    emitter = Emitter(stream)
    with pytest.raises(SupervisorGone):
        emitter.emit("preempted", step=1, reason="x")
    with pytest.raises(SupervisorGone):
        emitter.emit("preempted", step=1, reason="x")


@pytest.mark.parametrize(
    ("steps", "shown"),
    [
        ([], "none"),
        ([5], "5"),
        ([5, 6], "5..6"),
        (list(range(12, 4401)), "12..4400"),
        ([9, 1, 2, 3, 7, 10, 3], "1..3, 7, 9..10"),
    ],
)
def test_steps_are_shown_as_ranges(steps: list[int], shown: str) -> None:
    """4,389 replayed updates are one range, not 4,389 numbers; gaps are kept, in order."""
    assert step_ranges(steps) == shown
