"""A numpy random generator's state as checkpoint leaves, and back into the generator.

A program that draws from ``np.random.default_rng(seed)`` or a ``RandomState``
keeps drawing from it; its state is part of the training state, but
``get_state()`` holds the bit generator's name (``'MT19937'``, a string) and
128-bit integers (PCG64), which no checkpoint leaf can be.  `rng_state` gives the
same state as arrays: each integer as two uint64 words (high, low), each array
as it is, a float as float64; the name is left out, and `set_rng_state` checks
it against the generator it puts the state back into.

    rng = np.random.default_rng(0)                      # as the author wrote it
    state = run.restore({"params": p, "rng": jw.rng_state(rng)})
    jw.set_rng_state(rng, state["rng"])                 # the restored draws, or no-op
    for step in run.steps(state):
        ...rng.permutation(n)...                        # drawn as before
        state = {"params": p, "rng": jw.rng_state(rng)}
        run.progress(step, state)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from jobwarden.errors import WorkerInternalError

WORD = (1 << 64) - 1
NAME = "bit_generator"

Generator = np.random.Generator | np.random.RandomState | np.random.BitGenerator


def _raw(generator: Generator) -> dict[str, Any]:
    """The generator's own state dict (``legacy=False`` for a ``RandomState``)."""
    if isinstance(generator, np.random.RandomState):
        state: dict[str, Any] = generator.get_state(legacy=False)
        return state
    if isinstance(generator, np.random.Generator):
        return dict(generator.bit_generator.state)
    if isinstance(generator, np.random.BitGenerator):
        return dict(generator.state)
    raise WorkerInternalError(
        f"rng_state() takes a numpy Generator, RandomState or BitGenerator; "
        f"got {type(generator).__name__}"
    )


def _encode(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _encode(item) for key, item in value.items() if key != NAME}
    if isinstance(value, bool | int | np.integer):
        number = int(value)
        return np.array([number >> 64, number & WORD], dtype=np.uint64)
    if isinstance(value, float | np.floating):
        return np.float64(value)
    return np.array(value, copy=True)


def _decode(template: Any, leaf: Any, path: str) -> Any:
    if isinstance(template, Mapping):
        if not isinstance(leaf, Mapping):
            raise WorkerInternalError(f"set_rng_state(): {path or 'the state'} is not a mapping")
        return {
            key: item if key == NAME else _decode(item, leaf[key], f"{path}/{key}".lstrip("/"))
            for key, item in template.items()
        }
    array = np.asarray(leaf)
    if isinstance(template, bool | int | np.integer):
        high, low = (int(word) for word in array.astype(np.uint64))
        return type(template)((high << 64) | low)
    if isinstance(template, float | np.floating):
        return float(array)
    return array.astype(np.asarray(template).dtype, copy=True)


def rng_state(generator: Generator) -> dict[str, Any]:
    """The generator's state as a pytree of numpy arrays, fit to be a training state's part."""
    encoded: dict[str, Any] = _encode(_raw(generator))
    return encoded


def set_rng_state(generator: Generator, leaves: Mapping[str, Any]) -> None:
    """Put a state from `rng_state` (restored, perhaps) back into ``generator``; the next
    draw is the one the saved generator would have made.  The generator must be of the
    kind that was saved (the same bit generator)."""
    template = _raw(generator)
    state = _decode(template, leaves, "")
    if isinstance(generator, np.random.RandomState):
        generator.set_state(state)
    elif isinstance(generator, np.random.Generator):
        generator.bit_generator.state = state
    else:
        generator.state = state
