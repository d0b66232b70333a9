"""A stdout flood, a long events file and notification sinks that hold on, CI-sized: the
stdout_flood, long_events and hooks sections of ``bench/reliability.py`` with small
sizes, their acceptance conditions asserted; the full-size figures are in
docs/reliability.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.reliability_sections.common import Section, table
from bench.reliability_sections.events_file import long_events_section
from bench.reliability_sections.flood import stdout_flood
from bench.reliability_sections.sinks import hooks_section

pytestmark = pytest.mark.slow


def passed(section: Section) -> None:
    """Assert every check held, with the table and figures in the message."""
    figures = json.dumps(section.figures, indent=1, default=str)[:6000]
    assert section.passed, f"{section.failures()}\n{table([section])}\n{figures}"


def test_a_stdout_flood_leaves_status_fast_and_the_log_small(tmp_path: Path) -> None:
    """0.5 MB of 10-byte lines that are no events, the daemon's stderr read at 256 KiB/s:
    status p99 within 100 ms, none unanswered, wardend.log grown by at most 1 MB, every
    line kept in the events file."""
    passed(stdout_flood(tmp_path, None, megabytes=0.5, stderr_kbps=256))


def test_a_long_events_file_never_blocks_the_loop_long(tmp_path: Path) -> None:
    """A 25 MB events file through a plain start, --metrics-listen and a restart: the
    loop's longest block within 100 ms, status JOB within 1 s."""
    passed(long_events_section(tmp_path, megabytes=25))


def test_notification_sinks_are_bounded_by_the_timeout(tmp_path: Path) -> None:
    """A hook leaving a helper runs once and kills it; a dripping webhook's try ends at the
    timeout; a redirect is not counted as delivered."""
    passed(hooks_section(tmp_path))
