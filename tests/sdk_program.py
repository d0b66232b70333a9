"""A user's own training program, pure JAX, attached to jobwarden through the SDK.

Not a test module: tests/test_sdk.py copies it into a temporary folder and runs
it as a real process, standalone (``--checkpoint-dir``) or under a run file.
Momentum SGD on y = 3x - 0.5 with a noisy loss drawn from a typed PRNG key; the
data pipeline reshuffles every epoch (``fold_in(data_key, epoch)``) and its
position (epoch, index) is part of the state.  ``--own-checkpoints DIR`` keeps
checkpoints with numpy instead (bring your own checkpointer), ``--label-as-orbax``
labelling each the way Orbax's resume recipe does (one less than the updates it
holds).  ``--numpy-noise`` jitters the weights with draws from a numpy
``Generator`` kept as the author wrote it, its state carried by `jw.rng_state`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

import jobwarden.sdk as jw

parser = argparse.ArgumentParser()
parser.add_argument("--learning-rate", type=float, default=0.1)
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--fail-after", type=int)
parser.add_argument("--step-delay", type=float, default=0.0)
parser.add_argument("--own-checkpoints", type=Path)
parser.add_argument("--forget-data-position", action="store_true")
parser.add_argument("--numpy-noise", action="store_true", help="jitter from a numpy Generator")
parser.add_argument("--label-as-orbax", action="store_true", help="own saves labelled step - 1")
args, _ = parser.parse_known_args()

EXAMPLES, BATCH, EVERY = 24, 4, 4
config = {"seed": 5, "batch": BATCH, "optim": {"learning_rate": args.learning_rate, "beta": 0.9}}
faults: dict[str, Any] = {"step_delay_s": args.step_delay}
if args.fail_after:
    faults["fail_after"] = args.fail_after
xs = np.linspace(-1, 1, EXAMPLES, dtype=np.float32)
ys = 3 * xs - 0.5


def own_save(folder: Path, step: int, state: Any) -> None:
    """The program's own checkpointer (standing in for Orbax): every leaf as numpy."""
    import jax

    leaves = jax.tree_util.tree_leaves(state)
    raw = [np.asarray(jax.random.key_data(x) if x is state["key"] else x) for x in leaves]
    folder.mkdir(exist_ok=True)
    np.savez(folder / f"step-{step}.npz", *raw)


def own_restore(folder: Path, init: Any) -> tuple[Any, int]:
    """The newest of the program's own checkpoints, or ``init`` at step 0."""
    import jax
    import jax.numpy as jnp

    saved = sorted(folder.glob("step-*.npz"), key=lambda p: int(p.stem.split("-")[1]))
    if not saved:
        return init, 0
    arrays = np.load(saved[-1])
    leaves, treedef = jax.tree_util.tree_flatten(init)
    back = []
    for number, template in enumerate(leaves):
        value = arrays[f"arr_{number}"]
        if template is init["key"]:
            back.append(jax.random.wrap_key_data(jnp.asarray(value)))
        elif isinstance(template, int):
            back.append(int(value))
        else:
            back.append(jnp.asarray(value))
    return jax.tree_util.tree_unflatten(treedef, back), int(saved[-1].stem.split("-")[1])


with jw.attach(
    config=config,
    sources=[__file__],
    data={"x": xs, "y": ys},
    steps=args.steps,
    checkpoint_every=EVERY,
    keep_checkpoints=10,
    faults=faults,
    checkpoints="external" if args.own_checkpoints else "jobwarden",
) as run:
    parser.parse_args()  # the SDK took --checkpoint-dir out of sys.argv
    import jax
    import jax.numpy as jnp

    x, y = jnp.asarray(xs), jnp.asarray(ys)
    rate, beta = config["optim"]["learning_rate"], config["optim"]["beta"]
    data_key = jax.random.key(config["seed"] + 1)
    rng = np.random.default_rng(11)  # the author's own generator, kept as written

    @jax.jit
    def update(params: Any, velocity: Any, key: Any, batch: Any) -> Any:
        key, noise = jax.random.split(key)

        def objective(p: Any) -> Any:
            error = p["w"] * x[batch] + p["b"] - y[batch]
            return jnp.mean((error + 0.01 * jax.random.normal(noise, batch.shape)) ** 2)

        loss, grads = jax.value_and_grad(objective)(params)
        velocity = jax.tree_util.tree_map(lambda v, g: beta * v + g, velocity, grads)
        params = jax.tree_util.tree_map(lambda p, v: p - rate * v, params, velocity)
        return params, velocity, key, loss

    def next_batch(state: Any) -> Any:
        epoch, index = state["data"]["epoch"], state["data"]["index"]
        order = jax.random.permutation(jax.random.fold_in(data_key, epoch), EXAMPLES)
        return order[index * BATCH : (index + 1) * BATCH]

    def train_step(state: Any, batch: Any) -> tuple[Any, Any]:
        velocity = state["opt_state"]["velocity"]
        params, velocity, key, loss = update(state["params"], velocity, state["key"], batch)
        epoch, index = state["data"]["epoch"], state["data"]["index"] + 1
        if index == EXAMPLES // BATCH:
            epoch, index = epoch + 1, 0
        position = {"epoch": epoch, "index": index}
        opt_state = {"velocity": velocity}
        after = {"params": params, "opt_state": opt_state, "key": key, "data": position}
        if args.numpy_noise:
            params = {name: value + 1e-3 * rng.standard_normal() for name, value in params.items()}
            after = {**after, "params": params, "np_rng": jw.rng_state(rng)}
        return after, loss

    zeros = {"w": jnp.zeros(()), "b": jnp.zeros(())}
    init = {
        "params": zeros,
        "opt_state": {"velocity": zeros},
        "key": jax.random.key(5),
        "data": {"epoch": 0, "index": 0},
    }
    if args.numpy_noise:
        init["np_rng"] = jw.rng_state(rng)
    if args.own_checkpoints:
        state, start = own_restore(args.own_checkpoints, init)
        if start:
            run.restored(start, state, source=str(args.own_checkpoints))
    else:
        state = run.restore(init)
    if args.numpy_noise:
        jw.set_rng_state(rng, state["np_rng"])
    if args.forget_data_position:
        state = {**state, "data": {"epoch": 0, "index": 0}}
    print(f"starting after step {run.start_step}")  # the SDK sends this to stderr
    for step in run.steps(state):
        state, loss = train_step(state, next_batch(state))
        run.progress(step, state, loss=loss)
        if args.own_checkpoints and step % EVERY == 0:
            own_save(args.own_checkpoints, step - args.label_as_orbax, state)
