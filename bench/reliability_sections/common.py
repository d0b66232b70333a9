"""What every reliability section shares: its `Section` of figures and checks, and the
table that prints them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jobwarden.control import harness

SETTLED_STATES = harness.SETTLED_STATES
private_dir = harness.private_dir


LIVE_STATES = frozenset({"starting", "running", "recovering"})


CKPT_NAME = re.compile(r"ckpt-(\d{10})\.safetensors")


Record = dict[str, Any]


@dataclass
class Section:
    """One section's sizes, figures and acceptance checks."""

    name: str
    sizes: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    rows: list[tuple[str, str, str]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """Whether every check held."""
        return all(self.checks.values())

    def row(self, figure: str, value: object, target: str = "") -> None:
        """A table row: a figure, its value and (when it has one) its target."""
        self.rows.append((figure, str(value), target))

    def check(self, name: str, held: bool) -> bool:
        """Record an acceptance condition."""
        self.checks[name] = bool(held)
        return bool(held)

    def failures(self) -> list[str]:
        """The checks that did not hold."""
        return [name for name, held in self.checks.items() if not held]

    def as_record(self) -> Record:
        """JSON-ready form."""
        return {
            "section": self.name,
            "passed": self.passed,
            "seconds": round(self.seconds, 1),
            "sizes": self.sizes,
            "figures": self.figures,
            "checks": self.checks,
            "rows": [list(r) for r in self.rows],
            "details": self.details,
        }


def section_from(record: Record) -> Section:
    """A section back from its JSON form (to render a results file again)."""
    return Section(
        record["section"],
        sizes=record["sizes"],
        figures=record["figures"],
        checks=record["checks"],
        rows=[tuple(r) for r in record["rows"]],  # type: ignore[misc]
        details=record.get("details", {}),
        seconds=record["seconds"],
    )


def table(sections: list[Section], markdown: bool = False) -> str:
    """All sections as one table: section, sizes, figure, value, target, result."""
    head = ("section", "figure", "value", "target")
    rows: list[tuple[str, ...]] = []
    for s in sections:
        sizes = ", ".join(f"{k} {v}" for k, v in s.sizes.items())
        verdict = "PASS" if s.passed else "FAIL"
        rows.append((f"**{s.name}**" if markdown else s.name, f"sizes: {sizes}", "", ""))
        rows += [("", *r) for r in s.rows]
        rows.append(("", f"result ({s.seconds:.0f} s)", verdict, ""))
        rows += [("", "  failed check", name, "") for name in s.failures()]
    if markdown:
        rows = [
            (r[0], "· " + r[1].strip() if r[1].startswith("  ") else r[1], *r[2:]) for r in rows
        ]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [head, *rows]]
    lines.insert(1, "-" * max(len(line) for line in lines))
    return "\n".join(line.rstrip() for line in lines)


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (linear interpolation), None for no values."""
    return float(np.percentile(np.asarray(values), q)) if values else None


def ms(value: float | None) -> str:
    """Seconds as milliseconds, or '-'."""
    return "-" if value is None else f"{value * 1000:.1f} ms"


def mb(value: float | None) -> str:
    """Bytes as MB, or '-'."""
    return "-" if value is None else f"{value / 2**20:.1f} MB"


def jobs_rows(section: Section, f: Record) -> None:
    """The rows and checks every job-running section shares."""
    section.row("jobs completed", f"{f['completed']} of {f['jobs']}", "all")
    section.row("jobs lost", f["lost"], "0")
    section.row("final states equal to the reference", f"{f['finals_equal']}", "all")
    section.check("jobs lost == 0", f["lost"] == 0)
    section.check("all completed", f["completed"] == f["jobs"])
    section.check("finals equal", f["finals_equal"] == f["jobs"])
