"""Section long_events: a long job's events file in play, the loop's longest block.

`bench/long_events.py`'s measure at the section's size: a completed job's events file
replaced by a generated one of ``megabytes``, then wardend started on the root plainly,
with ``--metrics-listen``, and again after its goodput summary was saved; through each,
``version`` every 20 ms from a thread times the loop's longest block.
"""

from __future__ import annotations

from pathlib import Path

from bench import long_events

from .common import Section, ms

BLOCK_TARGET_S = 0.1
"""The loop's longest block while the file is in play (issue 19's figures)."""


def long_events_section(
    folder: Path, cache: Path | None = None, *, megabytes: float = 250.0
) -> Section:
    """Run the measure on ``folder`` and judge the loop's longest block."""
    section = Section("long_events", sizes={"megabytes": megabytes})
    found = long_events.measure(folder, megabytes)
    runs = {
        "plain start": found["status"],
        "--metrics-listen": found["metrics"],
        "after a restart": found["restart"],
    }
    longest = max(run["longest_block_s"] for run in runs.values())
    section.figures.update(found)
    section.figures["longest_block_s"] = longest
    section.row("events file", f"{found['megabytes']:g} MB, {found['updates']} updates")
    for name, run in runs.items():
        section.row(f"{name}: the loop's longest block", ms(run["longest_block_s"]), "<= 100 ms")
    section.row("plain start: status JOB", ms(found["status"]["status_job_s"]), "<= 1 s")
    section.row(
        "--metrics-listen: first /metrics counting the job", ms(found["metrics"]["first_metrics_s"])
    )
    section.row("plain start: goodput known, from start", ms(found["status"]["goodput_known_s"]))
    section.check("longest block <= 100 ms", longest <= BLOCK_TARGET_S)
    section.check("status JOB <= 1 s", found["status"]["status_job_s"] <= 1.0)
    return section
