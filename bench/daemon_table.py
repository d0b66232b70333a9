"""The daemon benchmarks' rows: samples against a target, and the table they print.

bench/daemon.py and bench/recovery.py measure in `Measure` rows and print them with `table`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from figures import Figure, at_most


@dataclass
class Measure:
    """One row of the table: samples in seconds, and a target on one statistic."""

    name: str
    samples: list[float]
    unit: str = "ms"
    target_s: float | None = None
    target_on: str = "p99"
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def stat(self, which: str) -> float | None:
        """p50, p99, min, max or mean (linear interpolation between ranks)."""
        if not self.samples:
            return None
        values = np.asarray(self.samples)
        if which == "mean":
            return float(values.mean())
        if which == "min":
            return float(values.min())
        if which == "max":
            return float(values.max())
        return float(np.percentile(values, float(which.lstrip("p"))))

    def verdict(self) -> str:
        """PASS, MISS, or '-' without a target."""
        value = self.stat(self.target_on)
        if self.target_s is None or value is None:
            return "-"
        return "PASS" if value <= self.target_s else "MISS"

    def show(self, seconds: float | None) -> str:
        """A value in the row's unit."""
        if seconds is None:
            return "-"
        return f"{seconds * 1000:.1f} ms" if self.unit == "ms" else f"{seconds:.3f} s"

    def target_text(self) -> str:
        """The target as printed."""
        if self.target_s is None:
            return "-"
        return f"{self.target_on} <= {self.show(self.target_s)}"

    def as_record(self) -> dict[str, Any]:
        """JSON-ready form (seconds)."""
        return {
            "name": self.name,
            "n": len(self.samples),
            **{k: self.stat(k) for k in ("p50", "p99", "min", "max", "mean")},
            "target_s": self.target_s,
            "target_on": self.target_on,
            "verdict": self.verdict(),
            "note": self.note,
            "samples_s": self.samples,
            **self.extra,
        }


def measure_figures(measures: list[Measure]) -> list[Figure]:
    """The summary's rows: every measure with a target, on its statistic."""
    out = []
    for m in measures:
        value = m.stat(m.target_on)
        if m.target_s is None or value is None:
            continue
        scale, fmt, unit = (1000, ".1f", " ms") if m.unit == "ms" else (1, ".3f", " s")
        out.append(
            at_most(f"{m.name}, {m.target_on}", value * scale, m.target_s * scale, fmt, unit)
        )
    return out


def table(measures: list[Measure]) -> str:
    """The measures as a fixed-width table."""
    head = ("measure", "n", "p50", "p99", "target", "result")
    rows = [
        (
            m.name,
            str(len(m.samples)),
            m.show(m.stat("p50")),
            m.show(m.stat("p99")),
            m.target_text(),
            m.verdict(),
        )
        for m in measures
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = []
    for row in [head, *rows]:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells))
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def fmt(seconds: float | None) -> str:
    """Seconds to three places, or '-'."""
    return "-" if seconds is None else f"{seconds:.3f}"


def median(values: list[float]) -> float | None:
    """The median, or None for no values."""
    return float(np.median(values)) if values else None
