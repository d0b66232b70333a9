"""The lesson's linear regression with momentum, bit for bit.

x = linspace(-1, 1, 64), y = 2x + 1; params and velocity start at zeros(2);
the key is the legacy uint32 ``PRNGKey(seed)``.  Each update splits the key,
draws a batch without replacement, and applies v <- beta*v + g,
theta <- theta - alpha*v.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from jobwarden.tasks.base import State, Task, TrainFields, Update

EXAMPLES = 64


class LinRegTrain(TrainFields):
    """Training fields of ``linreg``; the defaults are the lesson's."""

    seed: int = Field(3, ge=0, le=2**32 - 1)
    learning_rate: float = Field(0.04, gt=0, lt=1)
    momentum: float = Field(0.8, ge=0, lt=1)
    batch_size: int = Field(8, ge=1, le=EXAMPLES)


class LinReg(Task):
    """Linear regression y = 2x + 1 trained by minibatch SGD with momentum."""

    name: ClassVar[str] = "linreg"
    Train: ClassVar[type[TrainFields]] = LinRegTrain
    train: LinRegTrain

    def data(self) -> dict[str, Any]:
        """The 64 points of the lesson."""
        import jax.numpy as jnp

        x = jnp.linspace(-1.0, 1.0, EXAMPLES)
        return {"x": x, "y": 2 * x + 1}

    def init_state(self, data: dict[str, Any]) -> State:
        """Zero params and velocity, and the legacy key of the seed."""
        import jax
        import jax.numpy as jnp

        return {
            "params": jnp.zeros(2),
            "opt_state": {"velocity": jnp.zeros(2)},
            "key": jax.random.PRNGKey(self.train.seed),
        }

    def update(self, data: dict[str, Any]) -> Update:
        """One momentum step on a batch drawn without replacement."""
        import jax
        import jax.numpy as jnp

        x, y = data["x"], data["y"]
        batch, beta, alpha = self.train.batch_size, self.train.momentum, self.train.learning_rate

        def step(state: State) -> tuple[State, Any]:
            key, sample = jax.random.split(state["key"])
            indices = jax.random.choice(sample, EXAMPLES, (batch,), replace=False)

            def objective(p: Any) -> Any:
                return jnp.mean((p[0] * x[indices] + p[1] - y[indices]) ** 2)

            loss, grad = jax.value_and_grad(objective)(state["params"])
            velocity = beta * state["opt_state"]["velocity"] + grad
            params = state["params"] - alpha * velocity
            return {"params": params, "opt_state": {"velocity": velocity}, "key": key}, loss

        return step
