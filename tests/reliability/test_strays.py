"""Plain programs whose helpers outlive them, CI-sized: the strays section of
``bench/reliability.py`` with a few jobs, asserting its acceptance conditions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.reliability_sections.common import Section, table
from bench.reliability_sections.strays import strays

pytestmark = pytest.mark.slow


def evidence(section: Section) -> str:
    """The section's table and figures, for a failure message."""
    return f"\n{table([section])}\n{json.dumps(section.figures, indent=1, default=str)[:6000]}"


def test_no_helper_outlives_its_attempt_or_writes_beside_the_next(
    tmp_path: Path, compile_cache: Path
) -> None:
    """6 jobs of 3 to 5 attempts, each leaving 4 helpers: crashed, cancelled, stopped and
    resumed; none alive after its attempt, none writing during the next, no zombie left."""
    section = strays(tmp_path, compile_cache, jobs=6, restarts=2)
    expected = {
        "descendants left after attempts == 0": True,
        "overlapping writes == 0": True,
        "no zombie of the daemon": True,
        "all settled": True,
    }
    assert expected == section.checks, evidence(section)
    assert section.figures["attempts_ended"] == 22, evidence(section)
    assert section.figures["restarts"] == 14, evidence(section)
