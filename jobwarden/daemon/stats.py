"""The daemon's counters since it started, shared by the loop, the supervisors and metrics."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Stats:
    """Counts kept in memory; job records keep the totals that must survive a restart."""

    intake_accepted: int = 0
    intake_rejected: int = 0
    malformed_event_lines: int = 0
    stalls_detected: int = 0
    checkpoints: int = 0
    checkpoint_bytes: int = 0
    checkpoint_seconds: float = 0.0
