"""Task registry: the built-in tasks plus those registered as ``jobwarden.tasks`` entry points."""

from __future__ import annotations

from importlib.metadata import entry_points

from jobwarden.tasks.base import Task, TrainFields
from jobwarden.tasks.dp_mlp import DPMLP
from jobwarden.tasks.linreg import LinReg
from jobwarden.tasks.mlp import MLP
from jobwarden.tasks.sharded_mlp import ShardedMLP

BUILTIN: dict[str, type[Task]] = {
    LinReg.name: LinReg,
    MLP.name: MLP,
    DPMLP.name: DPMLP,
    ShardedMLP.name: ShardedMLP,
}

__all__ = ["BUILTIN", "Task", "TrainFields", "broken_tasks", "known_tasks", "task_class"]


def known_tasks() -> dict[str, type[Task]]:
    """Every task by name: built-ins, then entry points that do not shadow them and load."""
    return _scan()[0]


def broken_tasks() -> dict[str, str]:
    """Entry points that failed to load or are not a `Task`, each with why."""
    return _scan()[1]


def _scan() -> tuple[dict[str, type[Task]], dict[str, str]]:
    tasks, broken = dict(BUILTIN), {}
    for entry in entry_points(group="jobwarden.tasks"):
        if entry.name in tasks:
            continue
        try:
            loaded = entry.load()
        except Exception as error:  # noqa: BLE001 - one broken plugin must not break the rest
            broken[entry.name] = f"{entry.value} failed to import: {type(error).__name__}: {error}"
            continue
        if isinstance(loaded, type) and issubclass(loaded, Task):
            tasks[entry.name] = loaded
        else:
            broken[entry.name] = f"{entry.value} is not a subclass of jobwarden.tasks.Task"
    return tasks, broken


def task_class(name: str) -> type[Task] | None:
    """The task class registered as ``name``, or None.  A built-in name is answered without
    reading the entry points (no plugin can shadow a built-in)."""
    return BUILTIN.get(name) or known_tasks().get(name)
