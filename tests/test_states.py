"""The job state machine's table and its one transition function."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobwarden.daemon.store.jobs import JobTable
from jobwarden.daemon.store.layout import Root
from jobwarden.jobfile import job_from_mapping
from jobwarden.states import TRANSITIONS, IllegalTransition, JobState


def test_final_states_have_no_way_out() -> None:
    """completed and cancelled are final; every other state can be cancelled."""
    assert TRANSITIONS[JobState.COMPLETED] == frozenset()
    assert TRANSITIONS[JobState.CANCELLED] == frozenset()
    for state, targets in TRANSITIONS.items():
        if state not in (JobState.COMPLETED, JobState.CANCELLED):
            assert JobState.CANCELLED in targets, state


def test_transition_persists_and_illegal_moves_name_both_states(tmp_path: Path) -> None:
    """A legal move is persisted with its reason; an illegal one raises naming job and states."""
    root = Root(tmp_path)
    root.create()
    table = JobTable(root)
    job = job_from_mapping({"id": "j", "task": "linreg"})
    root.job("j").mkdir()
    record = table.add(job)
    table.transition(record, JobState.STARTING, "attempt 1 launched")
    saved = json.loads((root.job("j") / "state.json").read_text())
    assert saved["state"] == "starting"
    assert saved["history"][-1]["reason"] == "attempt 1 launched"
    with pytest.raises(IllegalTransition) as caught:
        table.transition(record, JobState.QUEUED, "no")
    assert str(caught.value) == "job j: illegal transition starting -> queued"
    assert json.loads((root.job("j") / "state.json").read_text())["state"] == "starting"
