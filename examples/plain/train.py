"""A training program that knows nothing of jobwarden: wardend supervises it by its heartbeat.

Softmax regression on scikit-learn's bundled digits in plain JAX and optax, the
way many scripts are written: it prints ``step N loss X`` after every update
(flushed, so a supervisor reading the pipe sees each line at once), saves its
own checkpoint (``numpy.savez``, written to a temporary file and renamed into
place) every ``--checkpoint-every`` updates, and continues from it when run
again.  Under wardend (job.toml: ``sdk = false``, ``[heartbeat] pattern``) a
line matching ``^step [0-9]+`` is a sign of life: a run that prints none for
``stall_timeout_s`` is stopped as stalled and restarted.  Its recoveries are
marked *unverified*: nothing proves that the resumed updates equal an
uninterrupted run's (examples/digits shows what the SDK adds).

    python train.py --checkpoint-dir ck
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np


def main() -> None:
    """Train, printing a heartbeat line per update and checkpointing now and then."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"))
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--learning-rate", type=float, default=0.5)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import optax
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = jnp.asarray(digits.data / 16.0, dtype=jnp.float32)
    labels = jnp.asarray(digits.target)
    tx = optax.sgd(args.learning_rate)

    @jax.jit
    def update(params: dict, opt_state: tuple, key: jax.Array) -> tuple:
        take = jax.random.choice(key, images.shape[0], (args.batch_size,), replace=False)

        def loss_of(params: dict) -> jax.Array:
            logits = images[take] @ params["w"] + params["b"]
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels[take]).mean()

        loss, grads = jax.value_and_grad(loss_of)(params)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    params = {"w": jnp.zeros((64, 10)), "b": jnp.zeros(10)}
    opt_state, start = tx.init(params), 0
    saved = args.checkpoint_dir / "latest.npz"
    if saved.exists():
        with np.load(saved) as arrays:
            params = {"w": jnp.asarray(arrays["w"]), "b": jnp.asarray(arrays["b"])}
            start = int(arrays["step"])
        print(f"resuming after step {start} from {saved}", flush=True)
    key = jax.random.key(0)
    for step in range(start + 1, args.steps + 1):
        params, opt_state, loss = update(params, opt_state, jax.random.fold_in(key, step))
        print(f"step {step} loss {float(loss):.4f}", flush=True)
        if step % args.checkpoint_every == 0 or step == args.steps:
            args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            pending = saved.with_suffix(".pending.npz")
            np.savez(pending, w=np.asarray(params["w"]), b=np.asarray(params["b"]), step=step)
            os.replace(pending, saved)
    accuracy = float(((images @ params["w"] + params["b"]).argmax(-1) == labels).mean())
    print(f"done: {args.steps} updates, training accuracy {accuracy:.1%}", flush=True)


if __name__ == "__main__":
    main()
