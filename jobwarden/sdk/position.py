"""The data position a resume needs: (epoch, index) in the state, and the batches from there.

A pipeline that reshuffles every epoch must keep where it is in the training
state, or a resumed run reads other batches than the uninterrupted one.
`Position` is that part of the state (two integers, a named tuple: its leaves
are ``data/epoch`` and ``data/index`` under a ``"data"`` component), and `Epochs`
the order it indexes: epoch ``e`` visits the examples in the permutation drawn
from ``(seed, e)``, so a batch depends on the position alone.

    data = jw.Epochs(examples=len(x), batch_size=32, seed=0)
    state = run.restore({"params": p, "data": data.start})
    for step, (batch, position) in zip(run.steps(state), data.batches(state["data"])):
        params = update(state["params"], x[batch], y[batch])
        state = {"params": params, "data": position}
        run.progress(step, state)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np


class Position(NamedTuple):
    """Where the pipeline is: the epoch, and the index of the next batch within it."""

    epoch: int
    # The leaf is named as the docs' ``data/index`` is; it shadows tuple.index on purpose.
    index: int  # type: ignore[assignment]


@dataclass(frozen=True)
class Epochs:
    """Batches of ``batch_size`` example indices out of ``examples``, a new order each epoch.

    ``seed``: each epoch's order is ``default_rng((seed, epoch)).permutation(examples)``;
    ``None`` keeps the examples in order.  The last partial batch of an epoch is
    dropped, so every batch has the same shape (one compilation).
    """

    examples: int
    batch_size: int
    seed: int | None = 0
    _orders: dict[int, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 < self.batch_size <= self.examples:
            raise ValueError(
                f"Epochs needs 0 < batch_size <= examples; got batch_size={self.batch_size}, "
                f"examples={self.examples}"
            )

    @property
    def start(self) -> Position:
        """The position of a fresh run: epoch 0, batch 0."""
        return Position(0, 0)

    @property
    def batches_per_epoch(self) -> int:
        """Full batches in one epoch."""
        return self.examples // self.batch_size

    def order(self, epoch: int) -> np.ndarray:
        """The order of the examples in ``epoch`` (the last two epochs' are kept)."""
        found = self._orders.get(epoch)
        if found is None:
            if self.seed is None:
                found = np.arange(self.examples)
            else:
                found = np.random.default_rng((self.seed, epoch)).permutation(self.examples)
            if len(self._orders) >= 2:
                self._orders.pop(min(self._orders))
            self._orders[epoch] = found
        return found

    def take(self, position: Any) -> tuple[np.ndarray, Position]:
        """The example indices of the batch at ``position``, and the position after it.

        ``position`` may be a restored one: any pair of integers (numpy or JAX scalars too).
        """
        epoch, index = (int(number) for number in position)
        start = index * self.batch_size
        batch = self.order(epoch)[start : start + self.batch_size]
        index += 1
        if index == self.batches_per_epoch:
            epoch, index = epoch + 1, 0
        return batch, Position(epoch, index)

    def batches(self, position: Any) -> Iterator[tuple[np.ndarray, Position]]:
        """From ``position`` on, without end: each batch's indices and the position after it."""
        while True:
            batch, position = self.take(position)
            yield batch, position
