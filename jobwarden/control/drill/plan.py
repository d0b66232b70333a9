"""Where each drill puts its fault, chosen from the drilled job's own ``[run]`` settings.

A pure function of ``steps``, ``checkpoint_every`` and ``keep_checkpoints`` (and the fault
points an operator names): no daemon, no file.  A recovering drill fails the job after an
update strictly between two commits, so that the recovery restores the older one and has
updates to replay.  What a job cannot support (no commit before its last update, no older
checkpoint for the corrupt drill to fall back to) is refused before any daemon starts, each
problem named.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from jobwarden.errors import JobwardenError


class DrillPlanError(JobwardenError):
    """Raised when the drilled job cannot host a named drill's fault; lists every problem."""

    code = "drill.plan"
    exit_status = 2

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems), problems=problems)
        self.problems = problems


@dataclass(frozen=True)
class FaultPoints:
    """The fault steps of one drill run, every one inside the job's ``[run] steps``."""

    steps: int
    checkpoint_every: int
    fail_after: int
    """crash and incompatible: the update after which the first attempt fails"""
    stall_at: int
    """stall: the completed updates before the first attempt hangs"""
    corrupt_after: int
    """corrupt: a failure past the second commit, so an older checkpoint remains"""
    pause_at: int
    """duplicate-writer: the primary holds still right after this commit"""

    def restore_point(self, step: int) -> int:
        """The newest commit at or before ``step``: what a recovery from there restores."""
        return (step // self.checkpoint_every) * self.checkpoint_every


def checkpoint_steps(steps: int, every: int) -> list[int]:
    """The steps a run commits at: every ``every``-th update, and the last."""
    return sorted({*range(every, steps + 1, every), steps})


def _between(commits: list[int], index: int) -> int | None:
    """An update strictly after the commit ``commits[index]`` and before the next one (the
    middle of the gap), or the update right after it when the gap is one update."""
    if index + 1 >= len(commits):
        return None
    start, end = commits[index], commits[index + 1]
    return start + max(1, (end - start) // 2)


def plan(
    steps: int,
    every: int,
    keep: int,
    drills: Iterable[str],
    *,
    fail_after: int | None = None,
    stall_at: int | None = None,
) -> FaultPoints:
    """The fault points for ``drills`` on a job of ``steps`` updates committing every
    ``every``; ``fail_after`` and ``stall_at`` are the operator's, when named.

    Raises `DrillPlanError` naming every drill the job cannot host.
    """
    names = set(drills)
    commits = checkpoint_steps(steps, every)
    first, second = _between(commits, 0), _between(commits, 1)
    shape = f"steps = {steps}, checkpoint_every = {every}"
    problems = []
    if first is None or first >= steps:
        problems.append(
            f"the job has no update between a commit and its last update ({shape}): a "
            "recovery drill fails the job there, to restore that commit and replay the rest; "
            "lower checkpoint_every"
        )
        first = None
    for name, given in (("--fail-after", fail_after), ("--stall-at", stall_at)):
        if given is not None and not every <= given < steps:
            problems.append(
                f"{name} {given} must be from the first commit ({every}) to one before the "
                f"last update ({steps - 1}), so that a checkpoint is restored and work remains"
            )
    if "corrupt" in names:
        if second is None or second >= steps:
            problems.append(
                f"the corrupt drill needs two commits before the last update ({shape} "
                f"commits at {commits}): with one, nothing older is left to fall back to"
            )
        if keep < 2:
            problems.append(
                f"the corrupt drill needs keep_checkpoints >= 2 (found {keep}): with one "
                "kept, a damaged newest checkpoint leaves nothing older to fall back to"
            )
    if problems or first is None:
        raise DrillPlanError(problems)
    crash = fail_after if fail_after is not None else first
    stall = stall_at if stall_at is not None else (second if second and second < steps else first)
    corrupt = crash if crash >= 2 * every else (second or first)
    return FaultPoints(
        steps=steps,
        checkpoint_every=every,
        fail_after=crash,
        stall_at=stall,
        corrupt_after=corrupt,
        pause_at=every,
    )
