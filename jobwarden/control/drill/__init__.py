"""``wardenctl drill``: rehearse a failure through a real daemon and keep the evidence.

Each drill drops a faulted job into the daemon's spool, as an operator would, and checks the
outcome update by update against an uninterrupted reference job with the same training
fields; the drills of one run share that reference.  With no ``--root`` a private daemon is
started on ``OUT/root`` and stopped afterwards, and ``all`` runs every drill in it at once;
with ``--root`` the drills run one after the other.  Each drill's evidence bundle, under
``OUT/<drill>/``: the failure timeline, the accepted checkpoint's identity, the full-state
comparison of every resumed update, the refusals, the incident records and rendered
runbooks, ``loss.svg`` and ``verdict.json``.
"""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from jobwarden.control.drill.cases import DRILLS
from jobwarden.control.drill.context import Drill, DrillParams, Reference
from jobwarden.control.drill.daemon import daemon_for
from jobwarden.control.drill.verdict import DrillResult

__all__ = ["DRILLS", "DrillParams", "DrillResult", "render", "run_drills"]

# Jobs a drill has in the daemon at once, at most (the duplicate-writer drill's primary and
# its refused second job); the private daemon gets a slot for each, and one for the reference.
JOBS_PER_DRILL = 2


def run_drills(
    names: list[str],
    root: Path | None,
    out: Path,
    params: DrillParams,
    compile_cache: Path | None = None,
) -> list[DrillResult]:
    """Run the named drills in one daemon; each writes its evidence under ``out/<name>``.

    In the private daemon (no ``root``, compiling into ``compile_cache`` when given) the
    drills run at once, one thread each; in the daemon of ``root``, whose slots belong to
    its operator, one after the other.  The results come in the order of ``names``.
    """
    out.mkdir(parents=True, exist_ok=True)
    stamp = f"{time.strftime('%H%M%S')}-{time.time_ns() % 10**6:06d}"
    slots = JOBS_PER_DRILL * len(names) + 1
    with daemon_for(root, out / "root", compile_cache=compile_cache, slots=slots) as handle:
        reference = Reference(
            handle, params, f"{names[0] if len(names) == 1 else 'all'}-{stamp}-reference"
        )
        reference.submit()
        drills = [
            Drill(handle, params, _fresh(out / name), f"{name}-{stamp}", reference)
            for name in names
        ]
        if not handle.private or len(drills) == 1:
            return [_run(name, drill) for name, drill in zip(names, drills, strict=True)]
        pool = ThreadPoolExecutor(max_workers=len(drills), thread_name_prefix="drill")
        try:
            futures = [
                pool.submit(_run, name, drill) for name, drill in zip(names, drills, strict=True)
            ]
            return [future.result() for future in futures]
        except BaseException:
            handle.abandoned.set()  # the other drills stop at their next poll
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _fresh(folder: Path) -> Path:
    """An empty evidence folder."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def _run(name: str, drill: Drill) -> DrillResult:
    """One drill, its verdict kept as ``verdict.json`` in its evidence folder."""
    checks, summary = DRILLS[name](drill)
    plot = drill.out / "loss.svg"
    summary["plot"] = str(plot) if plot.exists() else None
    result = DrillResult(name, checks, drill.out, summary)
    (drill.out / "verdict.json").write_text(
        json.dumps(result.as_record(), indent=2, default=str) + "\n"
    )
    return result


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
