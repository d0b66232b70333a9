"""A configurable multilayer perceptron trained with optax, for real checkpoint sizes.

The state holds the parameters of ``depth`` hidden layers of ``width`` units
and an optax optimizer state (Adam's count, mu and nu, or SGD momentum), so a
checkpoint is a nested pytree of a chosen size: roughly
``3 * 4 * (in_dim*width + (depth-1)*width**2)`` bytes with Adam.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, ClassVar, Literal

from pydantic import Field

from jobwarden.tasks.base import State, Task, TrainFields, Update


class MLPTrain(TrainFields):
    """Training fields of ``mlp``."""

    seed: int = Field(0, ge=0, le=2**32 - 1)
    width: int = Field(64, ge=1, le=20000)
    depth: int = Field(2, ge=1, le=64)
    in_dim: int = Field(16, ge=1, le=4096)
    examples: int = Field(256, ge=1, le=1_000_000)
    batch_size: int = Field(32, ge=1)
    learning_rate: float = Field(1e-3, gt=0, le=1)
    optimizer: Literal["adam", "sgd_momentum"] = "adam"


def width_for_bytes(target: int, depth: int = 2, in_dim: int = 16) -> int:
    """The width whose Adam-trained state is closest to ``target`` bytes."""
    per_unit = 12  # params, mu and nu, float32
    a, b = (depth - 1) * per_unit, (in_dim + depth + 1) * per_unit
    if a == 0:
        return max(1, round(target / b))
    return max(1, round((-b + math.sqrt(b * b + 4 * a * target)) / (2 * a)))


def forward(params: Any, inputs: Any) -> Any:
    """The network: tanh layers in the order of their names, then a linear output."""
    import jax.numpy as jnp

    hidden = inputs
    names = sorted(params)
    for name in names[:-1]:
        hidden = jnp.tanh(hidden @ params[name]["w"] + params[name]["b"])
    last = params[names[-1]]
    return (hidden @ last["w"] + last["b"])[:, 0]


class MLP(Task):
    """Regression of a fixed random teacher by a tanh MLP."""

    name: ClassVar[str] = "mlp"
    Train: ClassVar[type[TrainFields]] = MLPTrain
    train: MLPTrain

    def _optimizer(self) -> Any:
        import optax

        if self.train.optimizer == "adam":
            return optax.adam(self.train.learning_rate)
        return optax.sgd(self.train.learning_rate, momentum=0.9)

    def data(self) -> dict[str, Any]:
        """Inputs and a teacher's targets drawn from the seed's data stream."""
        import jax
        import jax.numpy as jnp

        key = jax.random.fold_in(jax.random.PRNGKey(self.train.seed), 0xDA7A)
        kx, kw = jax.random.split(key)
        x = jax.random.normal(kx, (self.train.examples, self.train.in_dim), jnp.float32)
        teacher = jax.random.normal(kw, (self.train.in_dim,), jnp.float32)
        return {"x": x, "y": jnp.sin(x @ teacher)}

    def init_state(self, data: dict[str, Any]) -> State:
        """Scaled normal weights, zero biases, a fresh optimizer state and the legacy key."""
        import jax
        import jax.numpy as jnp

        sizes = [self.train.in_dim] + [self.train.width] * self.train.depth + [1]
        key = jax.random.PRNGKey(self.train.seed)
        init_key = jax.random.fold_in(key, 0x1417)
        params = {}
        for index, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
            init_key, sub = jax.random.split(init_key)
            scale = 1.0 / math.sqrt(fan_in)
            params[f"layer{index:02d}"] = {
                "w": jax.random.normal(sub, (fan_in, fan_out), jnp.float32) * scale,
                "b": jnp.zeros((fan_out,), jnp.float32),
            }
        return {"params": params, "opt_state": self._optimizer().init(params), "key": key}

    def update(self, data: dict[str, Any]) -> Update:
        """One optimizer step on a batch drawn with replacement."""
        import jax
        import jax.numpy as jnp
        import optax

        x, y = data["x"], data["y"]
        optimizer = self._optimizer()
        batch, examples = self.train.batch_size, self.train.examples

        def step(state: State) -> tuple[State, Any]:
            key, sample = jax.random.split(state["key"])
            indices = jax.random.randint(sample, (batch,), 0, examples)

            def objective(params: Any) -> Any:
                return jnp.mean((forward(params, x[indices]) - y[indices]) ** 2)

            loss, grads = jax.value_and_grad(objective)(state["params"])
            updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
            params = optax.apply_updates(state["params"], updates)
            return {"params": params, "opt_state": opt_state, "key": key}, loss

        return step
