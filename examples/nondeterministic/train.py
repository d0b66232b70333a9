"""Not reproducible on purpose: the data order comes from iterating a Python ``set``.

The digits model of ../digits, with its training set read from ten shards, as
if from ten files, gathered by iterating a ``set`` of their names (a common
way to deduplicate a file list).  A set of strings iterates in an order that
changes from one process to the next (string hashing is randomized per
process, ``PYTHONHASHSEED``), so every run, and every resume, concatenates the
shards in another order, and the same keyed shuffle then picks other images
for every batch.

Everything a checkpoint checks still matches: the data (hashed shard by shard,
in name order), the config, the sources, the data position in the state.  Only
the replay tells: `wardenctl verify` names update 1 as the first that differs
between two runs, in the components the batches feed (``model``,
``optimizer``), while ``data`` (the position) is equal.  The fix is
``sorted(names)`` instead of ``set(names)``.

    python train.py --checkpoint-dir a > a.jsonl
    python train.py --checkpoint-dir b > b.jsonl
    wardenctl verify a.jsonl b.jsonl       # NOT PROVEN: first diverging update 1
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np

import jobwarden.sdk as jw

DIGITS = Path(__file__).resolve().parent.parent / "digits"
sys.path.insert(0, str(DIGITS))

from model import Config, Digits, Trainer, load  # noqa: E402  (examples/digits/model.py)

SHARDS = 10


def gathered(data: Digits) -> tuple[Digits, dict[str, Any]]:
    """The training set as named shards put back together in a set's order, and the data's
    identity (the shards in name order, which every run agrees on)."""
    shards = {
        f"digits-{i:02d}": (data.x_train[i::SHARDS], data.y_train[i::SHARDS]) for i in range(SHARDS)
    }
    names = set(shards)  # THE BUG: a set of strings iterates in another order in each process
    print(f"shards gathered in the order: {' '.join(names)}", file=sys.stderr)
    x_train = np.concatenate([shards[name][0] for name in names])
    y_train = np.concatenate([shards[name][1] for name in names])
    identity = {"train": {name: shards[name] for name in sorted(shards)}, "test": data.x_test}
    return dataclasses.replace(data, x_train=x_train, y_train=y_train), identity


def main() -> None:
    """Train the digits model on the shards, gathered in the order of a set."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="updates in all (default 40)")
    args, _ = parser.parse_known_args()
    config = Config()
    data, identity = gathered(load(config))
    with jw.attach(
        config=dataclasses.asdict(config),
        sources=[__file__, DIGITS / "model.py"],
        data=identity,
        steps=args.steps,
        checkpoint_every=10,
    ) as run:
        parser.parse_args()  # the SDK took --checkpoint-dir out of sys.argv
        trainer = Trainer(config, data)
        state = run.restore(trainer.init_state)
        trainer.compile(state)
        for step in run.steps(state):
            state, loss = trainer.step(state)
            run.progress(step, state, loss=loss, examples=config.batch_size)


if __name__ == "__main__":
    main()
