"""Section hooks: notification sinks that hold on, bounded by ``--notify-timeout``.

`bench/hooks.py`'s cases: an exec hook leaving ``sleep 20 &`` behind, a webhook
dripping its answer a byte every 0.5 s, one answering a POST with a 302.  Each figure
is a row and its target a check.
"""

from __future__ import annotations

from pathlib import Path

from bench import hooks

from .common import Section


def hooks_section(folder: Path, cache: Path | None = None) -> Section:
    """Every case of `bench.hooks`, its figures judged against their targets."""
    section = Section("hooks", sizes={"notify_timeout_s": hooks.TIMEOUT_S})
    figures = hooks.helper_hook(folder) + hooks.webhooks()
    for figure in figures:
        section.row(figure.name, figure.measured, figure.target)
        section.figures[figure.name] = figure.value
        section.check(figure.name, figure.result == "PASS")
    return section
