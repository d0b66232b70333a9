"""``wardenctl drill``: rehearse a failure through a real daemon and keep the evidence.

Each drill drops an uninterrupted reference job and a faulted job with the
same training fields into the daemon's spool, as an operator would, and
checks the outcome update by update.  With no ``--root`` a private daemon is
started on ``OUT/root`` and stopped afterwards; ``all`` runs every drill in
one daemon.  Each drill's evidence bundle, under ``OUT/<drill>/``: the failure
timeline, the accepted checkpoint's identity, the full-state comparison of
every resumed update, the refusals, the incident records and rendered
runbooks, ``loss.svg`` and ``verdict.json``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from jobwarden.control.drill.cases import DRILLS
from jobwarden.control.drill.context import Drill, DrillParams, daemon_for
from jobwarden.control.drill.verdict import DrillResult

__all__ = ["DRILLS", "DrillParams", "DrillResult", "render", "run_drills"]


def run_drills(
    names: list[str], root: Path | None, out: Path, params: DrillParams
) -> list[DrillResult]:
    """Run the named drills in one daemon; each writes its evidence under ``out/<name>``."""
    out.mkdir(parents=True, exist_ok=True)
    results = []
    with daemon_for(root, out / "root") as handle:
        for name in names:
            folder = out / name
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
            tag = f"{name}-{time.strftime('%H%M%S')}-{time.time_ns() % 10**6:06d}"
            checks, summary = DRILLS[name](Drill(handle, params, folder, tag))
            plot = folder / "loss.svg"
            summary["plot"] = str(plot) if plot.exists() else None
            result = DrillResult(name, checks, folder, summary)
            (folder / "verdict.json").write_text(
                json.dumps(result.as_record(), indent=2, default=str) + "\n"
            )
            results.append(result)
    return results


def render(result: DrillResult) -> str:
    """One drill's verdict for a terminal."""
    lines = [f"drill {result.drill}: {'PASS' if result.ok else 'FAIL'}"]
    for check in result.checks:
        shown = ", ".join(
            f"{k}={v}"
            for k, v in check.observed.items()
            if not isinstance(v, dict | list) or len(str(v)) < 120
        )
        lines.append(
            f"  [{'ok' if check.ok else 'FAIL'}] {check.name}" + (f": {shown}" if shown else "")
        )
    summary = result.summary
    if summary.get("restored_step") is not None:
        lines.append(f"restored step: {summary['restored_step']}")
        lines.append(f"replayed steps: {summary['replayed_steps']}")
    if "all_hashes_equal" in summary:
        lines.append(
            "every state hash matched the reference: "
            + ("yes" if summary["all_hashes_equal"] else "NO")
        )
    for name in ("runbook", "plot"):
        if summary.get(name):
            lines.append(f"{name}: {summary[name]}")
    lines.append(f"evidence: {result.out}")
    lines.append(
        "verdict: "
        + ("PASS, recovery verified" if result.ok else f"FAIL: {'; '.join(result.failed)}")
    )
    return "\n".join(lines)
