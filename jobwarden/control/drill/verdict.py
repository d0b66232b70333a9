"""A drill's verdict: the checks it made, what each observed, and a summary for the operator."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Check:
    """One check of a drill, with what was observed."""

    name: str
    ok: bool
    observed: dict[str, Any] = field(default_factory=dict)


@dataclass
class DrillResult:
    """A drill's checks, a summary for the operator, and where its evidence is."""

    drill: str
    checks: list[Check]
    out: Path
    summary: dict[str, Any]

    @property
    def ok(self) -> bool:
        """True only when every check held."""
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def failed(self) -> list[str]:
        """The names of the checks that did not hold."""
        return [c.name for c in self.checks if not c.ok]

    def as_record(self) -> dict[str, Any]:
        """verdict.json's content."""
        return {
            "drill": self.drill,
            "verdict": "pass" if self.ok else "FAIL",
            "ok": self.ok,
            "failed_checks": self.failed,
            **self.summary,
            "checks": [{"name": c.name, "ok": c.ok, **c.observed} for c in self.checks],
        }


# What a drill function returns: its checks and the summary that goes into verdict.json.
Outcome = tuple[list[Check], dict[str, Any]]
