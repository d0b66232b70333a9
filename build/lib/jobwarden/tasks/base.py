"""The task interface: what a model provides so jobwarden can supervise it.

A task names its training fields (a pydantic model: every field is hashed
into the config hash), builds its data, its initial complete state and a
jittable update.  The state is a dict pytree with at least ``params``,
``opt_state`` and ``key`` (raw uint32 key data); a task may add components,
such as a data position.  Validating a job file must not start JAX, so task
modules import JAX inside their methods, never at module level.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

State = dict[str, Any]
Update = Callable[[State], tuple[State, Any]]


class TrainFields(BaseModel):
    """Base of every task's training fields: strict, frozen, no unknown keys, no NaN."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Task(ABC):
    """Base class of a supervised model; subclasses set ``name`` and ``Train``."""

    name: ClassVar[str]
    Train: ClassVar[type[TrainFields]]
    key_impl: ClassVar[str] = "threefry2x32"

    def __init__(self, train: TrainFields) -> None:
        self.train = train

    @abstractmethod
    def data(self) -> dict[str, Any]:
        """The training data as a dict of arrays; hashed into the data hash."""

    @abstractmethod
    def init_state(self, data: dict[str, Any]) -> State:
        """The complete initial state: params, opt_state, key and any extra components."""

    @abstractmethod
    def update(self, data: dict[str, Any]) -> Update:
        """A pure function state -> (next state, loss) for `jax.jit`."""

    def examples_per_update(self) -> int:
        """Examples consumed by one update, reported in progress events."""
        return int(getattr(self.train, "batch_size", 0))

    def source_files(self) -> list[Path]:
        """Files whose source defines the update; hashed into the source hash."""
        source = inspect.getsourcefile(type(self))
        if source is None:
            raise RuntimeError(f"task {self.name} has no source file to hash")
        return [Path(source)]
