"""The proof of a recovery, with no reference run: replay must reproduce the failed attempt's log.

The failed attempt logged a state hash for each update it made.  The resumed
attempt restores step k; its starting state must equal the failed attempt's
logged state at k (when logged), and each update after k that the failed
attempt also logged must reproduce the logged hash.  Any mismatch escalates.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobwarden.events import Event, read_events


class Verdict(enum.StrEnum):
    """Where the proof of a recovery stands."""

    PENDING = "pending"
    """logged states remain to be replayed"""
    VERIFIED = "verified"
    """every logged state at or after the recovery point was reproduced exactly"""
    UNVERIFIED = "unverified"
    """nothing was logged at or after the recovery point, so nothing could be compared"""
    MISMATCH = "mismatch"
    """a replayed state differs from the log: a different experiment"""


@dataclass
class ReplayPlan:
    """What the failed attempt logged, and what the resumed attempt has matched so far."""

    failed_attempt: int
    logged: dict[int, str]
    last_logged_step: int
    last_progress_time: float | None
    restored_step: int | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)
    mismatch: dict[str, Any] | None = None

    @classmethod
    def from_events(cls, attempt: int, path: Path) -> ReplayPlan:
        """Build the plan from a failed attempt's ``events.jsonl``."""
        logged: dict[int, str] = {}
        last_step, last_time = 0, None
        for item in read_events(path) if path.exists() else []:
            if not isinstance(item, Event):
                continue
            if item.kind == "ready":
                logged.setdefault(item["step"], item["state_hash"])
                last_step = max(last_step, item["step"])
            elif item.kind == "progress":
                if item.get("state_hash"):
                    logged[item["step"]] = item["state_hash"]
                last_step, last_time = max(last_step, item["step"]), item.get("time")
        return cls(attempt, logged, last_step, last_time)

    def to_verify(self) -> list[int]:
        """Logged updates after the restored step: the work being replayed."""
        start = self.restored_step or 0
        return sorted(step for step in self.logged if step > start)

    @property
    def replayed_updates(self) -> int:
        """Updates the failed attempt made after the recovery point, now done again."""
        return max(0, self.last_logged_step - (self.restored_step or 0))

    def observe(self, step: int, state_hash: str | None, what: str) -> bool:
        """Compare one state with the log; returns False on a mismatch (recorded)."""
        expected = self.logged.get(step)
        if expected is None or state_hash is None or self.mismatch is not None:
            return self.mismatch is None
        ok = expected == state_hash
        check = {"step": step, "what": what, "logged": expected, "found": state_hash, "ok": ok}
        self.checks.append(check)
        if not ok:
            self.mismatch = check
        return ok

    def done(self, latest_step: int) -> bool:
        """Whether every logged update up to the failed attempt's last one has been replayed."""
        return latest_step >= self.last_logged_step

    def verdict(self) -> Verdict:
        """The verdict if the replay ended now: mismatch, verified, or unverified."""
        if self.mismatch is not None:
            return Verdict.MISMATCH
        return Verdict.VERIFIED if self.checks else Verdict.UNVERIFIED
