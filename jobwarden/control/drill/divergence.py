"""What a failed drill's verdict names: the first diverging step, the component, the leaf.

`first_difference` reads a `jobwarden.proof.verify.Report`: the earliest state that differs
from the reference's (a restored state, or an update's), the top-level state component that
differs there (``params``, ``opt_state``, ``key``, ``data`` or the user's own name), the leaf
path when both runs' checkpoint files were on disk, and what that pattern usually means
(docs/sdk.md, "What breaks exactness").
"""

from __future__ import annotations

from typing import Any

from jobwarden.hashing import component_of
from jobwarden.proof.labels import offset_text
from jobwarden.proof.verify import Report

# Of several differing components the one named first: those the docs speak of, in that
# order, then the program's own in name order; the step counter only when nothing else.
COMPONENT_ORDER = ("params", "opt_state", "key", "data")

NO_DIFFERENCE: dict[str, Any] = {
    "first_diverging_step": None,
    "component": None,
    "components": [],
    "leaf": None,
}


def _rank(component: str) -> tuple[int, str]:
    if component in COMPONENT_ORDER:
        return COMPONENT_ORDER.index(component), component
    return (len(COMPONENT_ORDER) + (component == "step"), component)


def first_difference(report: Report | None) -> dict[str, Any]:
    """The verdict's divergence fields; `NO_DIFFERENCE` when every compared state was equal."""
    found = report.first_divergence if report is not None else None
    if found is None:
        return dict(NO_DIFFERENCE)
    boundary = found.get("restored_state")
    at_restore = boundary is not None and boundary["step"] <= found["step"]
    point = boundary if at_restore and boundary is not None else found
    components = sorted(point["components"], key=_rank)
    component = components[0] if components else None
    leaves = point.get("leaves") or []
    named = [leaf["leaf"] for leaf in leaves if component_of(leaf["leaf"]) == component]
    fields = {
        "first_diverging_step": point["step"],
        "component": component,
        "components": components,
        "leaf": (named or [leaf["leaf"] for leaf in leaves] or [None])[0],
        "leaves": leaves,
        "leaves_step": point.get("leaves_step"),
        "diverged_in": "restored state" if at_restore else "update",
        "attempt": point.get("attempt"),
    }
    same_file = point["step"] in (point.get("identical_files_at") or [])
    offset = point.get("label_off_by") if at_restore else None
    fields["explanation"] = _explain(
        fields, after_restore=bool(found.get("after_restore")), same_file=same_file, offset=offset
    )
    return fields


def _explain(
    fields: dict[str, Any], *, after_restore: bool, same_file: bool, offset: int | None = None
) -> str:
    step, differing = fields["first_diverging_step"], ", ".join(fields["components"])
    if fields["diverged_in"] == "restored state" and same_file:
        return (
            f"the checkpoint restored at step {step} is bit-identical to the reference's, yet "
            f"the state the program went on from differs in {differing}: the program changed "
            "it after restoring it (a data position reset, an optimizer state or key made "
            "afresh)"
        )
    if fields["diverged_in"] == "restored state" and offset:
        return offset_text(step, offset)
    if fields["diverged_in"] == "restored state":
        return (
            f"the state restored at step {step} differs from the reference's in {differing}: "
            "the checkpoint does not hold all of it, or the program does not put all of it "
            "back (a data position reset, an optimizer state or key made afresh)"
        )
    if not after_restore:
        return (
            f"attempt {fields['attempt']} had restored nothing and still differs from the "
            f"reference at step {step}, in {differing}: the program is not deterministic "
            "(something outside the state changes between runs: a generator seeded from the "
            "clock or the OS, a global counter, XLA on several threads)"
        )
    return (
        f"the restored state equals the reference's, but update {step} differs in "
        f"{differing}: the update reads something the state does not hold (a data position "
        "kept outside it, a random generator of its own, a counter in a global)"
    )
