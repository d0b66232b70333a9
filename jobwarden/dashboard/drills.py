"""Drill evidence folders (``wardenctl drill … --out OUT``), read from the files a drill left.

A drill runs its own private daemon, gone once the drill ends: its evidence is the
folder, read here as the user who started the dashboard can read it.  Only folders
named on the command line (``--drills OUT``) are read, and a drill is looked up by
the name the listing gave it, never by a path from the request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobwarden.dashboard.source import Curve

VERDICT = "verdict.json"
COMPARISON = "comparison.json"


@dataclass(frozen=True)
class DrillCheck:
    """One check of a drill and what it observed, as text."""

    name: str
    ok: bool
    observed: str


@dataclass(frozen=True)
class Drill:
    """One drill's verdict, its checks, the loss of the resumed run over the reference's,
    and its runbooks."""

    name: str
    folder: Path
    ok: bool
    failed: tuple[str, ...]
    checks: tuple[DrillCheck, ...]
    reference: Curve | None
    resumed: tuple[Curve, ...]
    runbooks: tuple[tuple[str, str], ...]


def read_json(path: Path) -> Any:
    """A JSON file, or None when it is missing or not JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_drill(name: str, folder: Path) -> Drill:
    """The evidence of the drill in ``folder``."""
    verdict = read_json(folder / VERDICT) or {}
    rows = read_json(folder / COMPARISON) or []
    reference = sorted(
        (int(r["step"]), float(r["reference_loss"]))
        for r in rows
        if r.get("reference_loss") is not None
    )
    resumed: dict[int, list[tuple[int, float]]] = {}
    for row in rows:
        if row.get("resumed_loss") is not None:
            resumed.setdefault(int(row.get("attempt") or 0), []).append(
                (int(row["step"]), float(row["resumed_loss"]))
            )
    checks = tuple(
        DrillCheck(
            name=str(check.get("name", "?")),
            ok=bool(check.get("ok")),
            observed="; ".join(
                f"{key}: {value}" for key, value in check.items() if key not in ("name", "ok")
            ),
        )
        for check in verdict.get("checks") or ()
    )
    runbooks = tuple(
        (path.stem.removeprefix("runbook-"), path.read_text(errors="replace"))
        for path in sorted(folder.glob("runbook-*.md"))
    )
    return Drill(
        name=name,
        folder=folder,
        ok=bool(verdict.get("ok")),
        failed=tuple(str(n) for n in verdict.get("failed_checks") or ()),
        checks=checks,
        reference=Curve(0, tuple(reference)) if reference else None,
        resumed=tuple(Curve(a, tuple(sorted(p))) for a, p in sorted(resumed.items())),
        runbooks=runbooks,
    )


class Drills:
    """The drill folders given to the dashboard: each OUT folder's drills, or a drill's own."""

    def __init__(self, folders: tuple[Path, ...]) -> None:
        self.folders = folders

    def found(self) -> dict[str, Path]:
        """Every drill folder under the given ones, by a name unique among them."""
        found: dict[str, Path] = {}
        for given in self.folders:
            candidates = [given] if (given / VERDICT).is_file() else sorted(given.glob("*"))
            for folder in candidates:
                if (folder / VERDICT).is_file():
                    name = folder.name
                    while name in found:
                        name += "+"
                    found[name] = folder
        return found

    def listing(self) -> list[Drill]:
        """Every drill found, read."""
        return [read_drill(name, folder) for name, folder in self.found().items()]

    def read(self, name: str) -> Drill:
        """One drill by the name the listing gave it (KeyError for another)."""
        folder = self.found().get(name)
        if folder is None:
            raise KeyError(name)
        return read_drill(name, folder)
