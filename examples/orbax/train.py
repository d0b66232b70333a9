"""Orbax keeps the checkpoints, jobwarden proves the replays: the digits model of ../digits.

A program that already saves with Orbax's `CheckpointManager` keeps it and
attaches to jobwarden with ``checkpoints="external"`` for verification only:
every update's full-state hash is logged, and a resume is reported with
``run.restored(step, state)``, so `wardenctl verify` (and wardend's replay
check) proves that every resumed update equals the uninterrupted run's.  Orbax's
files get none of jobwarden's checksum, provenance gate or quarantine
(docs/sdk.md, "Bring your own checkpointer").

The model, data and state are examples/digits/model.py's: Orbax saves and
restores the whole state pytree as it is (NNX state, Adam's moments, the
dropout and shuffle keys as typed PRNG keys, the data position), asynchronously.

    python train.py --checkpoint-dir ck > events.jsonl    # run again to resume
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

import jobwarden.sdk as jw

DIGITS = Path(__file__).resolve().parent.parent / "digits"
sys.path.insert(0, str(DIGITS))

from model import Config, Trainer, load  # noqa: E402  (examples/digits/model.py)


def main() -> None:
    """Train with Orbax checkpoints in the run's checkpoint directory, verified by jobwarden."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60, help="updates in all (default 60)")
    args, _ = parser.parse_known_args()
    config = Config()
    data = load(config)
    with jw.attach(
        config=asdict(config),
        sources=[__file__, DIGITS / "model.py"],
        data=asdict(data),
        steps=args.steps,
        checkpoint_every=10,
        checkpoints="external",
    ) as run:
        parser.parse_args()  # the SDK took --checkpoint-dir out of sys.argv
        import orbax.checkpoint as ocp

        trainer = Trainer(config, data)
        every = run.checkpoint_every
        options = ocp.CheckpointManagerOptions(max_to_keep=run.keep_checkpoints)
        directory = run.checkpoint_dir or Path("checkpoints").absolute()
        # run.checkpointer: a save in flight is waited for whenever the run stops
        with run.checkpointer(ocp.CheckpointManager(directory, options=options)) as manager:
            state, saved = trainer.init_state, manager.latest_step()
            if saved is not None:
                state = manager.restore(saved, args=ocp.args.StandardRestore(state))
                run.restored(saved, state, source=str(Path(directory) / str(saved)))
            trainer.compile(state)
            step = run.start_step
            for step in run.steps(state):
                state, loss = trainer.step(state)
                run.progress(step, state, loss=loss, examples=config.batch_size)
                if step % every == 0 or step == run.total_steps:
                    manager.save(step, args=ocp.args.StandardSave(state))
            if run.preempted and manager.latest_step() != step:
                manager.save(step, args=ocp.args.StandardSave(state), force=True)
        print(f"step {step}: test accuracy {trainer.test_accuracy(state):.1%}")


if __name__ == "__main__":
    main()
