"""The digits model: an NNX MLP, its data, and the jitted update of the complete state.

An MLP (64-128-10, dropout 0.1) trained with optax's Adam on scikit-learn's
bundled handwritten digits (`sklearn.datasets.load_digits`: 1,797 8x8 images
shipped inside the package, nothing downloaded), 80 % for training and 20 %
held out for evaluation.  The complete training state is one pytree of three
components, which is what a checkpoint holds and what `wardenctl verify` names:

* ``model``: ``nnx.state(model)``, the weights and the dropout stream's key and counter;
* ``optimizer``: ``nnx.state(optimizer)``, Adam's moments and step count;
* ``data``: the shuffle key, the epoch and the batch index within it.  Each
  epoch's order is ``permutation(fold_in(key, epoch))``, so a resumed run reads
  exactly the batches (and draws exactly the dropout masks) the uninterrupted one did.

The update is one jitted function of the state (`nnx.split` / `nnx.merge`, the
low-overhead NNX pattern), so the state is a plain pytree between updates.  JAX
and Flax are imported when a `Trainer` is made, inside the attached run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Config:
    """The training fields: hashed into every checkpoint, a resume with another is refused."""

    seed: int = 0
    hidden: int = 128
    dropout: float = 0.1
    learning_rate: float = 0.01
    batch_size: int = 50
    test_fraction: float = 0.2
    split_seed: int = 0


@dataclass(frozen=True)
class Digits:
    """The train / held-out split of scikit-learn's digits, pixels scaled to [0, 1]."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load(config: Config) -> Digits:
    """The data set, split the same way every time (stratified, ``split_seed``)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    split = train_test_split(
        x, y, test_size=config.test_fraction, random_state=config.split_seed, stratify=y
    )
    x_train, x_test, y_train, y_test = split
    return Digits(x_train, y_train, x_test, y_test)


class Trainer:
    """The model's structure (NNX graph definitions) and the jitted update and evaluation."""

    def __init__(self, config: Config, data: Digits) -> None:
        import jax
        import jax.numpy as jnp
        import optax
        from flax import nnx

        class MLP(nnx.Module):
            def __init__(self, rngs: nnx.Rngs) -> None:
                self.hidden = nnx.Linear(64, config.hidden, rngs=rngs)
                self.dropout = nnx.Dropout(config.dropout, rngs=rngs)
                self.out = nnx.Linear(config.hidden, 10, rngs=rngs)

            def __call__(self, x: Any) -> Any:
                return self.out(self.dropout(nnx.relu(self.hidden(x))))

        def create() -> tuple[MLP, nnx.Optimizer[MLP]]:
            model = MLP(nnx.Rngs(params=config.seed, dropout=config.seed + 1))
            return model, nnx.Optimizer(model, optax.adam(config.learning_rate), wrt=nnx.Param)

        self.config = config
        model, optimizer = nnx.jit(create)()  # one compilation instead of many eager ops
        model_def, model_state = nnx.split(model)
        optimizer_def, optimizer_state = nnx.split(optimizer)
        self.init_state = {
            "model": model_state,
            "optimizer": optimizer_state,
            "data": {
                "key": jax.random.key(config.seed + 2),
                "epoch": jnp.int32(0),
                "index": jnp.int32(0),
            },
        }
        self.batches_per_epoch = len(data.x_train) // config.batch_size
        self._train = (jnp.asarray(data.x_train), jnp.asarray(data.y_train))
        self._test = (jnp.asarray(data.x_test), jnp.asarray(data.y_test))
        batch, per_epoch = config.batch_size, self.batches_per_epoch

        def next_batch(position: Any, images: Any, labels: Any) -> tuple[Any, Any, Any]:
            """The batch at ``position`` and the position after it: a pure function of both."""
            epoch_key = jax.random.fold_in(position["key"], position["epoch"])
            order = jax.random.permutation(epoch_key, images.shape[0])
            take = jax.lax.dynamic_slice_in_dim(order, position["index"] * batch, batch)
            index = position["index"] + 1
            wrapped = index == per_epoch
            after = {
                "key": position["key"],
                "epoch": position["epoch"] + wrapped.astype(jnp.int32),
                "index": jnp.where(wrapped, 0, index).astype(jnp.int32),
            }
            return images[take], labels[take], after

        def update(state: Any, images: Any, labels: Any) -> tuple[Any, Any]:
            x, y, position = next_batch(state["data"], images, labels)
            model = nnx.merge(model_def, state["model"])
            optimizer = nnx.merge(optimizer_def, state["optimizer"])

            def loss_of(model: Any) -> Any:
                logits = model(x)
                return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

            loss, grads = nnx.value_and_grad(loss_of)(model)
            optimizer.update(model, grads)
            after = {"model": nnx.state(model), "optimizer": nnx.state(optimizer), "data": position}
            return after, loss

        def accuracy(model_state: Any, images: Any, labels: Any) -> Any:
            model = nnx.merge(model_def, model_state)
            # No dropout: an evaluation draws nothing from the state's dropout stream.
            model.eval()  # type: ignore[no-untyped-call]
            return (model(images).argmax(-1) == labels).mean()

        self._update: Any = jax.jit(update)
        self._accuracy: Any = jax.jit(accuracy)

    def compile(self, state: Any) -> None:
        """Compile the update for ``state`` now, so the first step does not pay for it."""
        self._update = self._update.lower(state, *self._train).compile()

    def step(self, state: Any) -> tuple[Any, Any]:
        """One update: the next batch of the epoch's order, Adam, the data position advanced."""
        state, loss = self._update(state, *self._train)
        return state, loss

    def test_accuracy(self, state: Any) -> float:
        """The share of the held-out images classified correctly."""
        return float(self._accuracy(state["model"], *self._test))
