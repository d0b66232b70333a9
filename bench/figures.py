"""One row per figure a bench measured, beside its target: what `bench/summary.py` prints.

Each bench adds ``"figures": [...]`` (`Figure.as_record`) to its JSON results,
so the summary needs to know nothing of the benches' own formats.  A figure
without a target is context (a peer's time, the old policy's) and has the
result ``-``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Figure:
    """One measured figure, its target and the verdict."""

    name: str
    measured: str
    """the value as printed, with its unit"""
    target: str = "-"
    result: str = "-"
    """PASS, FAIL, or ``-`` for a figure without a target"""
    value: float | None = None

    def as_record(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def verdict(met: bool) -> str:
    """PASS or FAIL."""
    return "PASS" if met else "FAIL"


def at_most(name: str, value: float, limit: float, fmt: str, unit: str = "") -> Figure:
    """A figure whose target is an upper bound (``fmt`` formats both, ``unit`` follows)."""
    return Figure(
        name,
        f"{value:{fmt}}{unit}",
        f"<= {limit:{fmt}}{unit}",
        verdict(value <= limit),
        value,
    )


def at_least(name: str, value: float, limit: float, fmt: str, unit: str = "") -> Figure:
    """A figure whose target is a lower bound."""
    return Figure(
        name,
        f"{value:{fmt}}{unit}",
        f">= {limit:{fmt}}{unit}",
        verdict(value >= limit),
        value,
    )


def context(name: str, value: float | None, fmt: str, unit: str = "") -> Figure:
    """A figure measured for comparison, with no target of its own."""
    return Figure(name, "-" if value is None else f"{value:{fmt}}{unit}", value=value)


def records(figures: list[Figure]) -> list[dict[str, Any]]:
    """The figures as JSON-ready data."""
    return [f.as_record() for f in figures]
