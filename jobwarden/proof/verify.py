"""``wardenctl verify REFERENCE CANDIDATE``: prove that a resumed run continued the same experiment.

Each input is an events file or a folder holding ``events.jsonl`` files (a
run folder, or a job folder with ``attempts/<n>/events.jsonl``).  The
candidate's attempts are checked one by one against the reference: the
restored state must equal the reference's state at that step, the first
resumed update must be the restored step + 1, and every update's state hash
must equal the reference's.  The final states must be equal.  On a mismatch
the report names the first diverging step and the state components that differ
(the top-level keys of the state: params, opt_state, key, data, or the user's
own), and the differing leaves where both runs' checkpoint files are still on
disk, at that step or, failing that, at the first later step both committed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from jobwarden.checkpoint.errors import CheckpointError
from jobwarden.events import Event, read_events
from jobwarden.proof.labels import label_offset, offset_text
from jobwarden.shards.read import checkpoint_arrays


class VerifyInputError(Exception):
    """Raised when an input path holds no events to verify."""


@dataclass
class Run:
    """The events of one run, split into attempts at each ``started`` event."""

    source: str
    attempts: list[list[Event]]
    malformed: int

    def progress(self) -> dict[int, Event]:
        """Every progress event by step (a later attempt's replaces an earlier one's)."""
        return {e["step"]: e for attempt in self.attempts for e in attempt if e.kind == "progress"}

    def boundary(self) -> dict[int, Event]:
        """Events that carry the state at a step: progress, plus ready for the start state."""
        found: dict[int, Event] = {}
        for attempt in self.attempts:
            for event in attempt:
                if event.kind in ("ready", "progress") and event.get("state_hash"):
                    found.setdefault(event["step"], event)
        return found

    def completed(self) -> Event | None:
        """The last ``completed`` event, if the run finished."""
        done = [e for attempt in self.attempts for e in attempt if e.kind == "completed"]
        return done[-1] if done else None

    def checkpoint_file(self, step: int) -> Path | None:
        """The checkpoint file this run committed at ``step``, if it still exists."""
        for attempt in reversed(self.attempts):
            for event in attempt:
                if event.kind in ("checkpoint", "restored") and event["step"] == step:
                    path = Path(event["file"])
                    if path.is_file():
                        return path
        return None

    def checkpoint_steps(self) -> list[int]:
        """Every step this run committed or restored a checkpoint at."""
        return sorted(
            {
                e["step"]
                for attempt in self.attempts
                for e in attempt
                if e.kind in ("checkpoint", "restored") and isinstance(e.get("step"), int)
            }
        )


def _event_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise VerifyInputError(f"{path}: no such file or folder")
    files = list(path.rglob("events.jsonl")) + list(path.glob("*.jsonl"))

    def order(p: Path) -> list[Any]:
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p.relative_to(path)))]

    unique = sorted(set(files), key=order)
    if not unique:
        raise VerifyInputError(f"{path}: holds no events.jsonl")
    return unique


def load_run(path: Path) -> Run:
    """Read every events file of a run; raises `VerifyInputError` if there are none."""
    attempts: list[list[Event]] = []
    malformed = 0
    for file in _event_files(path):
        for item in read_events(file):
            if not isinstance(item, Event):
                malformed += 1
                continue
            if item.kind == "started" or not attempts:
                attempts.append([])
            attempts[-1].append(item)
    attempts = [a for a in attempts if a]
    if not attempts:
        raise VerifyInputError(f"{path}: no valid events")
    return Run(str(path), attempts, malformed)


@dataclass
class Check:
    """One verified claim with what was observed."""

    name: str
    ok: bool
    detail: str
    observed: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    """The verdict of `verify`."""

    reference: str
    candidate: str
    checks: list[Check]
    restored_steps: list[int]
    replayed_steps: list[int]
    first_divergence: dict[str, Any] | None

    @property
    def proven(self) -> bool:
        """True only when every check held."""
        return bool(self.checks) and all(c.ok for c in self.checks)

    def as_record(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "verdict": "proven" if self.proven else "not proven",
            "proven": self.proven,
            "reference": self.reference,
            "candidate": self.candidate,
            "restored_steps": self.restored_steps,
            "replayed_steps": self.replayed_steps,
            "first_divergence": self.first_divergence,
            "checks": [
                {"name": c.name, "ok": c.ok, "detail": c.detail, **c.observed} for c in self.checks
            ],
        }


def differing_components(a: Event, b: Event) -> list[str]:
    """The state components whose digests differ between two state-carrying events."""
    left, right = a.get("components") or {}, b.get("components") or {}
    return sorted(k for k in set(left) | set(right) if left.get(k) != right.get(k))


def differing_leaves(a: Path, b: Path) -> list[dict[str, Any]]:
    """Leaf-by-leaf comparison of two checkpoint files: each leaf that differs."""
    left, right = checkpoint_arrays(a), checkpoint_arrays(b)
    found = []
    for path in sorted(set(left) | set(right)):
        x, y = left.get(path), right.get(path)
        if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype:
            found.append({"leaf": path, "difference": "missing or shape/dtype differs"})
        elif x.tobytes() != y.tobytes():
            diff = np.flatnonzero(x.reshape(-1).view(np.uint8) != y.reshape(-1).view(np.uint8))
            item: dict[str, Any] = {"leaf": path, "first_byte": int(diff[0])}
            if np.issubdtype(x.dtype, np.number):
                item["max_abs_diff"] = float(
                    np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))
                )
            found.append(item)
    return found


def _leaf_evidence(reference: Run, candidate: Run, step: int) -> list[dict[str, Any]] | None:
    ref_file, cand_file = reference.checkpoint_file(step), candidate.checkpoint_file(step)
    if ref_file is None or cand_file is None:
        return None
    try:
        return differing_leaves(ref_file, cand_file)
    except CheckpointError as error:
        return [{"leaf": "?", "difference": f"unreadable: {error.message}"}]


def _divergence_at(
    reference: Run, candidate: Run, step: int, components: list[str]
) -> dict[str, Any]:
    """What differs at ``step``: the components, and the leaves at the first step from
    ``step`` on where both runs' checkpoint files are on disk and differ (``leaves_step``);
    steps whose two files are bit-identical are ``identical_files_at``."""
    found: dict[str, Any] = {"step": step, "components": components, "leaves": None}
    identical = []
    for later in sorted({step, *(s for s in candidate.checkpoint_steps() if s > step)}):
        leaves = _leaf_evidence(reference, candidate, later)
        if leaves:
            found["leaves"], found["leaves_step"] = leaves, later
            break
        if leaves is not None:
            identical.append(later)
    if identical:
        found["identical_files_at"] = identical
    return found


def verify(reference: Run, candidate: Run) -> Report:
    """Compare a candidate run with an uninterrupted reference, update by update."""
    checks: list[Check] = []
    ref_states = reference.boundary()
    restored_steps: list[int] = []
    replayed: list[int] = []
    divergence: dict[str, Any] | None = None
    boundary: dict[str, Any] | None = None

    def diverged(step: int, ours: Event, theirs: Event, number: int, resumed: bool) -> None:
        nonlocal divergence
        if divergence is None:
            found = _divergence_at(reference, candidate, step, differing_components(theirs, ours))
            divergence = {**found, "attempt": number, "after_restore": resumed}

    for number, attempt in enumerate(candidate.attempts, 1):
        progress = [e for e in attempt if e.kind == "progress"]
        restored = next((e for e in attempt if e.kind == "restored"), None)
        ready = next((e for e in attempt if e.kind == "ready"), None)
        if ready is None or (not progress and restored is None):
            continue
        start = ready["step"]
        if restored is not None:
            restored_steps.append(restored["step"])
            theirs = ref_states.get(start)
            if theirs is None:
                checks.append(
                    Check(
                        f"attempt {number}: restored state",
                        False,
                        f"the reference has no state hash at step {start}",
                    )
                )
            else:
                same = theirs["state_hash"] == ready["state_hash"]
                differ = differing_components(theirs, ready)
                offset = None if same else label_offset(ref_states, start, ready)
                if not same and boundary is None:
                    boundary = {
                        **_divergence_at(reference, candidate, start, differ),
                        "attempt": number,
                        "label_off_by": offset,
                    }
                checks.append(
                    Check(
                        f"attempt {number}: restored state",
                        same,
                        f"state restored at step {start} "
                        + (
                            "equals the reference's"
                            if same
                            else "differs from the reference's in " + ", ".join(differ)
                        )
                        + ("" if offset is None else "; " + offset_text(start, offset)),
                        {"step": start, "components_differing": differ, "label_off_by": offset},
                    )
                )
        if not progress:
            continue
        steps = [e["step"] for e in progress]
        contiguous = steps == list(range(start + 1, start + 1 + len(steps)))
        checks.append(
            Check(
                f"attempt {number}: continuation",
                contiguous,
                f"first update {steps[0]} after start step {start}; updates "
                f"{'are' if contiguous else 'are not'} contiguous",
                {"start_step": start, "first_step": steps[0], "last_step": steps[-1]},
            )
        )
        if restored is not None:
            replayed.extend(steps)
        compared, mismatched, missing = 0, [], []
        for event in progress:
            theirs = ref_states.get(event["step"])
            if theirs is None or event.get("state_hash") is None:
                missing.append(event["step"])
                continue
            compared += 1
            if theirs["state_hash"] != event["state_hash"]:
                mismatched.append(event["step"])
                diverged(event["step"], event, theirs, number, restored is not None)
        ok = not mismatched and not missing
        detail = (
            f"{compared} update(s) compared, all state hashes equal"
            if ok
            else f"mismatch at {mismatched}"
            if mismatched
            else f"reference lacks state hashes for steps {missing}"
        )
        checks.append(
            Check(
                f"attempt {number}: state hashes",
                ok,
                detail,
                {"compared": compared, "mismatched": mismatched, "uncompared": missing},
            )
        )

    if not any(c.name.endswith("state hashes") for c in checks):
        checks.append(Check("candidate updates", False, "the candidate has no progress events"))
    ref_done, cand_done = reference.completed(), candidate.completed()
    if ref_done is None or cand_done is None:
        checks.append(
            Check(
                "final state",
                False,
                f"{'reference' if ref_done is None else 'candidate'} did not complete",
            )
        )
    else:
        same = (ref_done["step"], ref_done["state_hash"]) == (
            cand_done["step"],
            cand_done["state_hash"],
        )
        observed: dict[str, Any] = {
            "reference_step": ref_done["step"],
            "candidate_step": cand_done["step"],
        }
        leaves = _leaf_evidence(reference, candidate, cand_done["step"])
        if leaves is not None:
            observed["checkpoint_leaves_differing"] = leaves
            same = same and not leaves
        checks.append(
            Check(
                "final state",
                same,
                "final states are equal"
                + (" (checkpoint files compared leaf by leaf)" if leaves is not None else "")
                if same
                else "final states differ",
                observed,
            )
        )
    if divergence is None and boundary is not None:
        divergence = {**boundary, "after_restore": True}
    if divergence is not None:
        divergence["restored_state"] = boundary
    return Report(reference.source, candidate.source, checks, restored_steps, replayed, divergence)


def render(report: Report) -> str:
    """The report as text for a terminal."""
    lines = [
        f"verdict: {'PROVEN' if report.proven else 'NOT PROVEN'}",
        f"reference: {report.reference}",
        f"candidate: {report.candidate}",
        f"restored at step(s): {report.restored_steps or 'none'}; replayed updates: "
        f"{report.replayed_steps}",
    ]
    lines += [f"  [{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}" for c in report.checks]
    if report.first_divergence:
        d = report.first_divergence
        lines.append(
            f"first diverging update: step {d['step']} (attempt {d.get('attempt')}), "
            f"components differing: {', '.join(d['components']) or 'none recorded'}"
        )
        lines += _leaf_lines(d)
        if d.get("restored_state"):
            b = d["restored_state"]
            lines.append(
                f"the restored state at step {b['step']} already differed in: "
                f"{', '.join(b['components'])}"
            )
            lines += _leaf_lines(b)
    return "\n".join(lines)


def _leaf_lines(found: dict[str, Any]) -> list[str]:
    at = found.get("leaves_step")
    later = f" (checkpoints at step {at})" if at is not None and at != found["step"] else ""
    return [f"  leaf {leaf}{later}" for leaf in found.get("leaves") or []]
