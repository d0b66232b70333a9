"""Whether a restored state is labelled one step off: a checkpointer's count of updates.

The step a program gives ``run.restored(step, state)`` must equal the updates
already in the state.  Orbax's own resume recipe saves the state after update
``s + 1`` as step ``s`` (its loop counts from 0); restored under that label,
the state equals the reference's one step later, and every replayed update
differs, though nothing is missing from the checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping

from jobwarden.events import Event


def _content(event: Event) -> dict[str, str]:
    """The state's component digests without the step's own."""
    components = event.get("components") or {}
    return {name: digest for name, digest in components.items() if name != "step"}


def label_offset(reference: Mapping[int, Event], step: int, restored: Event) -> int | None:
    """+1 when the state restored as ``step`` equals the reference's at ``step + 1`` (the
    label is one less than the updates it holds), -1 at ``step - 1``; else None."""
    ours = _content(restored)
    if not ours:
        return None
    for offset in (1, -1):
        theirs = reference.get(step + offset)
        if theirs is not None and _content(theirs) == ours:
            return offset
    return None


def offset_text(step: int, offset: int) -> str:
    """What an off-by-one label means, for a verdict."""
    holds = step + offset
    return (
        f"the state restored as step {step} equals the reference's at step {holds}: the "
        f"checkpoint is labelled one {'less' if offset > 0 else 'more'} than the updates it "
        f"holds; give run.restored() the number of updates in the state ({holds}), not "
        "the checkpointer's label (Orbax's resume recipe counts from 0)"
    )
