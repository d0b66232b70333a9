"""The names inside a job's folder, one definition for the daemon that writes them and the
tools that read them (drills, inspect, verify).

    jobs/<id>/attempts/<n>/      one folder per attempt (`attempt_folder`)
        job.json                 the job the attempt ran (`JOB_FILE`)
        events.jsonl             stdout of a job that emits events (`EVENTS_FILE`)
        output.log               stdout of a plain program (`OUTPUT_FILE`)
        stderr.log               stderr (`STDERR_FILE`)
        members.json             how each member of a multi-process attempt did (`MEMBERS_FILE`)
        events.1.jsonl ...       member 1's copy of a file (`member_file`)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ATTEMPTS = "attempts"
JOB_FILE = "job.json"
EVENTS_FILE = "events.jsonl"
"""Where an attempt's stdout is kept when it carries jobwarden events."""
OUTPUT_FILE = "output.log"
"""... and where it is kept for a plain program, whose stdout is its own output."""
STDERR_FILE = "stderr.log"
MEMBERS_FILE = "members.json"


def member_file(name: str, index: int) -> str:
    """Member ``index``'s copy of an attempt file: ``events.jsonl`` -> ``events.1.jsonl``."""
    if index == 0:
        return name
    stem, dot, suffix = name.partition(".")
    return f"{stem}.{index}{dot}{suffix}"


def members_of(folder: Path) -> dict[str, Any] | None:
    """The ``members.json`` of an ended attempt's folder, if it was a group."""
    try:
        loaded: dict[str, Any] = json.loads((folder / MEMBERS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return loaded


def attempt_folder(job_folder: Path, number: int) -> Path:
    """``<job folder>/attempts/<number>``: the evidence of one attempt."""
    return job_folder / ATTEMPTS / str(number)
