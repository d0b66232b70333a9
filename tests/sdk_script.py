"""A user's script written top to bottom: `jw.start` instead of a ``with`` block.

Not a test module: tests/test_sdk_forms.py runs it as a real process, standalone
or under wardend.  Linear regression on 24 points in batches of 4 from
`jw.Epochs` (reshuffled each epoch, the position in the state), with jitter
drawn from a numpy ``Generator`` carried by `jw.rng_state`.  ``--raise-at N``
raises an error of the program's own after update N.
"""

import sys

import numpy as np

import jobwarden.sdk as jw

raise_at = int(sys.argv[sys.argv.index("--raise-at") + 1]) if "--raise-at" in sys.argv else 0
xs = np.linspace(-1, 1, 24, dtype=np.float32)
ys = 3 * xs - 0.5
run = jw.start(config={"rate": 0.2}, sources=[__file__], data={"x": xs, "y": ys}, steps=12)

import jax  # noqa: E402  (imported after the run is entered, as the docs advise)
import jax.numpy as jnp  # noqa: E402

rng = np.random.default_rng(3)
data = jw.Epochs(examples=len(xs), batch_size=4, seed=0)


@jax.jit
def update(params, x, y):
    loss, grads = jax.value_and_grad(lambda p: jnp.mean((p["w"] * x + p["b"] - y) ** 2))(params)
    return jax.tree_util.tree_map(lambda p, g: p - 0.2 * g, params, grads), loss


zeros = {"w": jnp.zeros(()), "b": jnp.zeros(())}
state = run.restore({"params": zeros, "data": data.start, "rng": jw.rng_state(rng)})
jw.set_rng_state(rng, state["rng"])
for step, (batch, position) in zip(run.steps(state), data.batches(state["data"]), strict=False):
    params, loss = update(state["params"], xs[batch], ys[batch])
    params = {name: value + 1e-3 * rng.standard_normal() for name, value in params.items()}
    state = {"params": params, "data": position, "rng": jw.rng_state(rng)}
    run.progress(step, state, loss=loss)
    if step == raise_at:
        raise RuntimeError(f"the program's own bug at update {step}")
print(f"done at step {run.start_step}..{run.total_steps}")
run.close()
