"""What a warm spare prepares ahead of its attempt: JAX imported, data built, update compiled.

`prepare` runs in a spare before any job is handed to it (`jobwarden.worker.spare`);
the built-in program (`jobwarden.worker.builtin`) reuses the `Warm` it returns when
the handed job trains what it was prepared for, and starts cold otherwise.  A member
of a group spare (several processes of one job) joins `jax.distributed` with the
other members first, since JAX refuses to join once any computation has run, and
also runs the collectives a restore and a commit use (the broadcast of member 0's
start, the comparison of the members' hashes) once, so the handed group compiles
nothing before its first update.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jobwarden import statetree as state_tree
from jobwarden.jobfile import Job
from jobwarden.runtime import enable_compilation_cache, pin_environment, release_code_pages
from jobwarden.sdk.distributed import Membership


@dataclass(frozen=True)
class Warm:
    """What a spare prepared for one task and training configuration."""

    task: str
    train: dict[str, Any]
    data: Any
    step: Any
    """The update, jitted and compiled on the initial state's shapes."""

    def fits(self, job: Job) -> bool:
        """Whether ``job`` trains what this was prepared for (else it starts cold)."""
        return job.task == self.task and job.train_fields() == self.train


def prepare(job: Job, compile_cache: Path | None, member: Membership | None = None) -> Warm:
    """Import JAX, build the data and compile the update on the initial state (a member of
    a group spare: after joining the other members, ``member``)."""
    pin_environment()
    import jax

    if compile_cache is not None:
        enable_compilation_cache(compile_cache)
    if member is not None:
        member.join()
    import jobwarden.sdk  # noqa: F401 - the step loop's modules, imported ahead

    task = job.task_instance()
    data = task.data()
    step = jax.jit(task.update(data))
    # The restore path's conversions and the update on restored leaves, compiled ahead.
    initial = task.init_state(data)
    like_restored = state_tree.unflatten_like(initial, dict(state_tree.flatten(initial)))
    jax.block_until_ready(step(like_restored))  # type: ignore[no-untyped-call]
    if member is not None and member.group:
        leaves = [np.asarray(leaf) for _, leaf in state_tree.flatten(initial)]
        member.share_start(0, leaves)
        member.agree(0, "")
    # compiled: what a crash's exit would free, let go now, the rest in huge pages
    release_code_pages(heap=True, collapse=True)
    return Warm(job.task or "", job.train_fields(), data, step)
