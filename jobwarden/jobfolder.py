"""The names inside a job's folder, one definition for the daemon that writes them and the
tools that read them (drills, inspect, verify).

    jobs/<id>/attempts/<n>/      one folder per attempt (`attempt_folder`)
        job.json                 the job the attempt ran (`JOB_FILE`)
        events.jsonl             stdout of a job that emits events (`EVENTS_FILE`)
        output.log               stdout of a plain program (`OUTPUT_FILE`)
        stderr.log               stderr (`STDERR_FILE`)
"""

from __future__ import annotations

from pathlib import Path

ATTEMPTS = "attempts"
JOB_FILE = "job.json"
EVENTS_FILE = "events.jsonl"
"""Where an attempt's stdout is kept when it carries jobwarden events."""
OUTPUT_FILE = "output.log"
"""... and where it is kept for a plain program, whose stdout is its own output."""
STDERR_FILE = "stderr.log"


def attempt_folder(job_folder: Path, number: int) -> Path:
    """``<job folder>/attempts/<number>``: the evidence of one attempt."""
    return job_folder / ATTEMPTS / str(number)
