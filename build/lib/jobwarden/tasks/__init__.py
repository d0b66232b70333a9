"""Task registry: the built-in tasks plus those registered as ``jobwarden.tasks`` entry points."""

from __future__ import annotations

from importlib.metadata import entry_points

from jobwarden.tasks.base import Task, TrainFields
from jobwarden.tasks.linreg import LinReg
from jobwarden.tasks.mlp import MLP

BUILTIN: dict[str, type[Task]] = {LinReg.name: LinReg, MLP.name: MLP}

__all__ = ["BUILTIN", "Task", "TrainFields", "known_tasks", "task_class"]


def known_tasks() -> dict[str, type[Task]]:
    """Every task by name: built-ins, then entry points that do not shadow them."""
    tasks = dict(BUILTIN)
    for entry in entry_points(group="jobwarden.tasks"):
        if entry.name not in tasks:
            loaded = entry.load()
            if isinstance(loaded, type) and issubclass(loaded, Task):
                tasks[entry.name] = loaded
    return tasks


def task_class(name: str) -> type[Task] | None:
    """The task class registered as ``name``, or None."""
    return known_tasks().get(name)
