"""loss.svg: the uninterrupted and the restored continuation of a drill, over the resumed steps.

Drawn with matplotlib's object API, never pyplot: pyplot's current-figure state is shared by
every thread, and `run_drills` runs drills on several threads at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_loss(rows: list[dict[str, Any]], title: str, path: Path) -> Path | None:
    """Write the comparison ``rows`` (see `Drill.comparison`) as ``path``; None without
    matplotlib or without a step to plot."""
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        return None
    steps = [r["step"] for r in rows if r["reference_loss"] is not None]
    if not steps:
        return None
    matplotlib.rcParams["svg.fonttype"] = "none"  # keep labels as searchable text
    figure = Figure(figsize=(6, 3.6))
    axes = figure.subplots()
    axes.plot(
        steps,
        [r["reference_loss"] for r in rows if r["reference_loss"] is not None],
        gid="uninterrupted",
        color="#1f77b4",
        linewidth=3,
        alpha=0.6,
        label="uninterrupted",
    )
    axes.plot(
        steps,
        [r["resumed_loss"] for r in rows if r["reference_loss"] is not None],
        gid="restored",
        color="#d62728",
        linestyle="--",
        marker="o",
        label="restored continuation",
    )
    axes.set_xlabel("completed training step")
    axes.set_ylabel("minibatch loss")
    axes.set_title(title)
    axes.set_xticks(steps)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, format="svg", metadata={"Date": None})
    return path
