"""Recoveries cut short and jobs killed at random, CI-sized: the settled section of
``bench/reliability.py`` with a few jobs, asserting its acceptance conditions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.reliability_sections.common import Section, table
from bench.reliability_sections.settled import settled

pytestmark = pytest.mark.slow


def evidence(section: Section) -> str:
    """The section's table and figures, for a failure message."""
    return f"\n{table([section])}\n{json.dumps(section.figures, indent=1, default=str)[:6000]}"


def test_no_incident_stays_open_once_its_job_rests(tmp_path: Path, compile_cache: Path) -> None:
    """8 jobs, each crash (a fault or a SIGKILL) met by a cancel, a stop, a stop and resume or
    nothing during its recovery: every job rests, none with an incident open."""
    section = settled(tmp_path, compile_cache, jobs=8)
    expected = {"open incidents on settled jobs == 0": True, "all settled": True}
    assert expected == section.checks, evidence(section)
    assert section.figures["incidents"] >= 4, evidence(section)  # a crash by fault each
