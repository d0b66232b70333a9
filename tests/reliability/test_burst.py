"""The control socket under an honest burst, CI-sized: ``bench/reliability_sections/burst.py``
with small sizes, its acceptance conditions asserted; the full-size figures are in
docs/reliability.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.reliability_sections.burst import burst
from bench.reliability_sections.common import table

pytestmark = pytest.mark.slow


def test_an_honest_burst_is_answered_and_root_is_not_starved(
    tmp_path: Path, compile_cache: Path
) -> None:
    """500 clients sending ``version`` at once and 200 ``status``: each answered or told
    busy, none closed without an answer, all answered once the busy ones retry; root's
    status answered throughout while another uid holds 200 connections."""
    section = burst(
        tmp_path,
        compile_cache,
        clients=500,
        status_clients=200,
        attackers=200,
        operator_bound_s=2.0,
    )
    figures = json.dumps(section.figures, indent=1, default=str)[:6000]
    assert section.passed, f"{section.failures()}\n{table([section])}\n{figures}"
