"""Train the digits model (model.py) under jobwarden: 95.8 % held-out accuracy in 120 updates.

    python train.py --checkpoint-dir ck > events.jsonl    # fails, is killed...
    python train.py --checkpoint-dir ck >> events.jsonl   # running it again resumes

Standalone, ``--checkpoint-dir`` says where checkpoints go; under wardend the
run file does (docs/sdk.md).  The held-out accuracy is reported every
``--eval-every`` updates and at the last, as the ``test_accuracy`` metric of
the progress event and on stderr.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from model import Config, Trainer, load

import jobwarden.sdk as jw


def main() -> None:
    """Train under jobwarden: standalone with ``--checkpoint-dir DIR``, or under wardend."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=120, help="updates in all (default 120)")
    parser.add_argument("--eval-every", type=int, default=40, help="held-out evaluation cadence")
    args, _ = parser.parse_known_args()
    config = Config()
    data = load(config)
    with jw.attach(
        config=asdict(config),
        sources=[__file__, Path(__file__).with_name("model.py")],
        data=asdict(data),
        steps=args.steps,
        checkpoint_every=10,
    ) as run:
        parser.parse_args()  # the SDK took its own options (--checkpoint-dir) out of sys.argv
        trainer = Trainer(config, data)
        # The update is compiled on the state's shapes: in a spare, before it waits.
        state = run.restore(trainer.init_state, warmup=trainer.compile)
        for step in run.steps(state):
            state, loss = trainer.step(state)
            metrics: dict[str, float] = {}
            if step % args.eval_every == 0 or step == run.total_steps:
                metrics["test_accuracy"] = trainer.test_accuracy(state)
                accuracy = metrics["test_accuracy"]
                print(f"step {step}: loss {float(loss):.4f}, test accuracy {accuracy:.1%}")
            run.progress(step, state, loss=loss, examples=config.batch_size, metrics=metrics)


if __name__ == "__main__":
    main()
