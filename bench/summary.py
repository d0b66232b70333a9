"""Every bench's figures in one table, each beside its target, PASS or FAIL.

Reads the ``figures`` of each JSON in ``bench/results/`` (written by the
benches, `bench/figures.py`), in the order of `BENCHES`, prints one table with
the time each file was written, and writes ``bench/results/summary.json``.
A bench of `BENCHES` with no results yet is listed as not run; a results file
from before figures were recorded is listed as such (run that bench again).
``make bench`` runs the benches and then this.

    .venv/bin/python bench/summary.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
BENCHES = (
    "recovery",
    "async_commit",
    "goodput",
    "peers",
    "checkpoint",
    "daemon",
    "teardown",
    "control",
    "cli_start",
    "sdk",
    "multiprocess",
    "sharded",
    "slurm",
)
"""the benches in the order of the table; any other results file follows them"""


def load(path: Path) -> dict[str, Any] | None:
    """A results file, or None if it cannot be read as JSON."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def rows() -> list[tuple[str, str, dict[str, Any]]]:
    """(bench, when written, figure) for every figure, and one row per bench without any."""
    names = list(BENCHES)
    names += sorted(
        p.stem for p in RESULTS.glob("*.json") if p.stem not in BENCHES and p.stem != "summary"
    )
    out = []
    for name in names:
        path = RESULTS / f"{name}.json"
        if not path.exists():
            out.append((name, "-", {"name": "(not run)", "measured": "-", "target": "-"}))
            continue
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))
        found = load(path)
        figures = found.get("figures") if found else None
        if not figures:
            note = "(unreadable)" if found is None else "(no figures: run this bench again)"
            out.append((name, when, {"name": note, "measured": "-", "target": "-"}))
            continue
        out += [(name, when, figure) for figure in figures]
    return out


def main() -> int:
    """Print the table and write the summary."""
    found = rows()
    head = ("bench", "written", "figure", "measured", "target", "result")
    lines = [
        (bench, when, f["name"], f["measured"], f["target"], f.get("result", "-"))
        for bench, when, f in found
    ]
    widths = [max(len(str(r[i])) for r in [head, *lines]) for i in range(len(head))]
    for n, line in enumerate([head, *lines]):
        print("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
    results = [line[5] for line in lines]
    passed, failed = results.count("PASS"), results.count("FAIL")
    print(f"\n{passed} of {passed + failed} targets met; {failed} missed")
    RESULTS.mkdir(parents=True, exist_ok=True)
    record = {
        "created": time.time(),
        "passed": passed,
        "failed": failed,
        "figures": [{"bench": b, "written": w, **f} for b, w, f in found],
    }
    (RESULTS / "summary.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {RESULTS.name}/summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
