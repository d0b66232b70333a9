"""Section metrics_slowloris, CI-sized: 200 slow clients of /metrics against a daemon with
128 descriptors; status stays fast and requests made meanwhile are answered."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.reliability_sections.metrics_slowloris import metrics_slowloris

pytestmark = pytest.mark.slow


def test_slow_metrics_clients_leave_the_daemon_its_descriptors(
    tmp_path: Path, compile_cache: Path
) -> None:
    """200 slowloris clients for 6 s at a limit of 128 fds: every check of the section holds."""
    section = metrics_slowloris(tmp_path, compile_cache, clients=200, attack_s=6, fd_limit=128)
    failed = section.failures()
    assert not failed, f"{failed} did not hold: {section.rows}\n{section.figures}"
