"""The SDK's cost per update on the digits model (examples/digits), against the bare loop.

Side by side in one process, on the same compiled update of
examples/digits/model.py (Flax NNX MLP 64-128-10 + Adam: a state of 19 leaves,
113 KiB), it times:

* ``bare``: the jitted update, logging the loss of the update before
  (``float`` of it once the next is dispatched), as a loop that does not wait
  for each update before dispatching the next;
* ``hash_every=N``: the same loop inside ``jw.attach(...)`` with
  ``run.progress(step, state, loss=loss)`` after each update, the loss as the
  update returned it (docs/sdk.md): a progress event (appended to an events
  file, as ``> events.jsonl`` would) and the full-state hash on every N-th
  update, both finished at the next report, while the next update runs.
  ``checkpoints="external"``: no commits, whose cost is bench/checkpoint.py's
  business;
* ``hash_every=1 handed``: the same, with every hash handed to the emitter's
  thread, as a state of ``HASHED_HERE_BELOW`` or more has it; a smaller state
  is hashed on the training thread because this costs the loop more (the row
  shows by how much);
* ``bare waits`` and ``hash_every=1 waits``: a loop that waits for each update
  (``float(loss)``) before going on, bare and attached (the loss a float when
  reported): nothing runs while the SDK hashes.  Compared with each other.

Each round runs every variant for ``--updates`` updates from the same state, in
an order that rotates from round to round, and takes each variant's mean time
per update (so a hash every N-th update counts as 1/N of it).  A variant's
overhead is the median over rounds of its ratio to the bare loop of the same
round, minus one (a waiting variant's to ``bare waits``); ``in SDK`` is the time
spent inside ``run.progress`` as a share of the bare update, given for the
waiting loop only (in a loop that does not wait, the call is where it waits for
the update).  Flattening and hashing a fresh state alone
is timed in the same rounds, as the SDK does it (paths, leaf headers and the
per-component recipe cached per layout, the arrays' own buffers joined) and
uncached (`jobwarden.statetree.flatten` and ``state_hash``, which give the same
hash), to show where the time goes.
Also for a wider model (``--hidden``), whose larger state shows what
``hash_every`` buys.  Targets: at most 5 % of the update time on the digits
model, 2 % on a wider one.

    .venv/bin/python bench/sdk.py [--rounds 60] [--updates 50] [--hidden 128,1024]

Prints a table and writes ``bench/results/sdk.json``.  Needs the examples extra
(``pip install -c constraints.txt -e '.[examples]'``).  On a shared machine run
it when the load is low (the table shows the load average seen).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from jobwarden.runtime import pin_environment

pin_environment()  # single-threaded XLA, as an attached run has it; before JAX starts

import jax  # noqa: E402
from figures import at_most, records  # noqa: E402

import jobwarden.sdk as jw  # noqa: E402
from jobwarden import statetree as state_tree  # noqa: E402
from jobwarden.hashing import StateHasher, state_hash  # noqa: E402
from jobwarden.sdk import run as sdk_run  # noqa: E402
from jobwarden.sdk.leaves import HASHED_HERE_BELOW, Flattener  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
RESULTS = Path(__file__).resolve().parent / "results"
TARGET = 0.05
WIDE_TARGET = 0.02
"""issue 24's target for the 1,024-wide model (and any width but the example's 128)"""


def target_of(hidden: int) -> float:
    """The overhead allowed at one hash per update: 5 % for the example, 2 % wider."""
    return TARGET if hidden == 128 else WIDE_TARGET


HASH_EVERY = (1, 2, 5, 10, 100)
PACKAGES = ("jax", "jaxlib", "numpy", "flax", "optax", "xxhash")
MISSING = "the examples extra is not installed: pip install -c constraints.txt -e '.[examples]'"


@dataclass
class Variant:
    """One way of running the loop: its mean update time, and time in the SDK, per round."""

    hash_every: int | None
    """None: the bare loop, no SDK"""
    handed: bool = False
    """every hash handed to the emitter's thread, as a state of `HASHED_HERE_BELOW` is"""
    waits: bool = False
    """the loop waits for each update (``float(loss)``) before going on"""
    update_s: list[float] = field(default_factory=list)
    in_sdk_s: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The variant as the table heads it."""
        name = "bare" if self.hash_every is None else f"hash_every={self.hash_every}"
        return name + (" handed" if self.handed else "") + (" waits" if self.waits else "")


@dataclass
class ModelResult:
    """One model's figures, every variant measured in the same rounds."""

    hidden: int
    state_bytes: int
    leaves: int
    bare: Variant
    attached: list[Variant]
    bare_waits: Variant
    hash_s: list[tuple[float, float]]
    """per round: the SDK's cached flattening and hash, and the uncached one"""

    def overhead(self, variant: Variant) -> float:
        """The median over rounds of the variant's update time over the bare loop's, minus 1."""
        bare = self.bare_waits if variant.waits else self.bare
        pairs = zip(variant.update_s, bare.update_s, strict=True)
        return statistics.median(v / b - 1 for v, b in pairs)

    def in_sdk(self, variant: Variant) -> float | None:
        """The median over rounds of the time in the SDK's calls over the bare update time,
        for a loop that waits for each update (else the call holds that wait)."""
        if not variant.waits:
            return None
        pairs = zip(variant.in_sdk_s, self.bare_waits.update_s, strict=True)
        return statistics.median(s / b for s, b in pairs)

    def record(self) -> dict[str, Any]:
        """JSON-ready form: medians, ratios and every round's figures."""
        return {
            "hidden": self.hidden,
            "state_bytes": self.state_bytes,
            "leaves": self.leaves,
            "hash_median_s": statistics.median(h for h, _ in self.hash_s),
            "hash_uncached_median_s": statistics.median(u for _, u in self.hash_s),
            "bare": {
                "update_median_s": statistics.median(self.bare.update_s),
                "rounds_s": self.bare.update_s,
            },
            "bare_waits": {
                "update_median_s": statistics.median(self.bare_waits.update_s),
                "rounds_s": self.bare_waits.update_s,
            },
            "attached": [
                {
                    "hash_every": v.hash_every,
                    "handed": v.handed,
                    "waits": v.waits,
                    "update_median_s": statistics.median(v.update_s),
                    "overhead": self.overhead(v),
                    "in_sdk": self.in_sdk(v),
                    "target_met": self.overhead(v) <= target_of(self.hidden),
                    "rounds_s": v.update_s,
                    "in_sdk_rounds_s": v.in_sdk_s,
                }
                for v in self.attached
            ],
        }


def load_digits_model() -> Any:
    """examples/digits/model.py as a module; exits with a message when flax or sklearn lack."""
    sys.path.insert(0, str(EXAMPLES / "digits"))
    try:
        import model
    except ImportError as error:
        print(f"{MISSING} ({error})")
        raise SystemExit(2) from error
    return model


def bare(trainer: Any, state: Any, updates: int, waits: bool) -> tuple[float, float]:
    """The loop without the SDK: mean time per update (and 0 spent in the SDK), logging each
    update's loss once the next is dispatched, or (``waits``) before it is."""
    state, loss = trainer.step(state)
    float(loss)
    first = time.perf_counter()
    for _ in range(updates - 1):
        state, next_loss = trainer.step(state)
        float(next_loss if waits else loss)
        loss = next_loss
    float(loss)
    return (time.perf_counter() - first) / (updates - 1), 0.0


def attached(
    trainer: Any, state: Any, updates: int, hash_every: int, events: Path, *, waits: bool
) -> tuple[float, float]:
    """The loop inside an attached run: mean time per update, and of it in ``run.progress``.

    Timed from the end of the first update to the end of the last, like `bare`, so the
    ``ready`` and ``completed`` events (a hash each, once per run) are left out.
    """
    with jw.attach(
        config=asdict(trainer.config),
        data_hash="bench",
        name="digits-bench",
        steps=updates,
        hash_every=hash_every,
        checkpoints="external",
        events=events,
        argv=[],
        environ={},
    ) as run:
        in_sdk, first, last = 0.0, 0.0, 0.0
        for step in run.steps(state):
            state, loss = trainer.step(state)
            if waits:
                loss = float(loss)  # the result is ready: what follows is the SDK's own time
            entered = time.perf_counter()
            run.progress(step, state, loss=loss)
            last = time.perf_counter()
            if step == 1:
                first = last
            else:
                in_sdk += last - entered
    return (last - first) / (updates - 1), in_sdk / (updates - 1)


def hash_alone(trainer: Any, state: Any, samples: int) -> tuple[float, float]:
    """The mean time of flattening a fresh state to named host leaves and hashing them.

    As the SDK does it (paths, leaf headers and the per-component recipe cached per
    layout, the arrays' own buffers joined: `Flattener.snapshot`, `Snapshot.hash`), and
    uncached (`state.flatten`, `state_hash`: the same hash), each on the state of a new
    update, whose host copies nobody has made yet.  The caches are built before the
    timing starts (about 1.5 ms on the digits state, once per run).
    """
    flatten, hasher = Flattener(), StateHasher()
    flatten.snapshot(state).hash(hasher, 0)  # its caches built, as in a run after its first update
    spent = [0.0, 0.0]
    for sample in range(2 * samples):
        state, loss = trainer.step(state)
        float(loss)
        began = time.perf_counter()
        if sample % 2 == 0:
            flatten.snapshot(state).hash(hasher, sample)
        else:
            state_hash(state_tree.flatten(state), sample)
        spent[sample % 2] += time.perf_counter() - began
    return spent[0] / samples, spent[1] / samples


def bench_model(model: Any, hidden: int, rounds: int, updates: int, events: Path) -> ModelResult:
    """Every variant on one model size, side by side for ``rounds`` rounds."""
    config = replace(model.Config(), hidden=hidden)
    trainer = model.Trainer(config, model.load(config))
    start = trainer.init_state
    trainer.compile(start)
    bare(trainer, start, 20, waits=True)  # first dispatches, caches
    start, _ = trainer.step(start)  # one update in: Adam's moments are not zeros
    leaves = state_tree.flatten(start)
    variants = [Variant(None)] + [Variant(n) for n in HASH_EVERY] + [Variant(1, handed=True)]
    variants += [Variant(None, waits=True), Variant(1, waits=True)]
    hashes = []
    for number in range(rounds):
        shift = number % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            every, waits = variant.hash_every, variant.waits
            if every is None:
                update, in_sdk = bare(trainer, start, updates, waits)
            else:
                sdk_run.HASHED_HERE_BELOW = 0 if variant.handed else HASHED_HERE_BELOW
                update, in_sdk = attached(trainer, start, updates, every, events, waits=waits)
                sdk_run.HASHED_HERE_BELOW = HASHED_HERE_BELOW
            variant.update_s.append(update)
            variant.in_sdk_s.append(in_sdk)
        hashes.append(hash_alone(trainer, start, updates // 4))
    size = sum(array.nbytes for _, array in leaves)
    attached_ = [v for v in variants if v.hash_every is not None]
    bare_waits = next(v for v in variants if v.hash_every is None and v.waits)
    return ModelResult(hidden, size, len(leaves), variants[0], attached_, bare_waits, hashes)


def table(results: list[ModelResult]) -> list[str]:
    """The results as text: per model a line of its state and hash cost, then a row per variant."""
    lines = []
    for result in results:
        cached = statistics.median(h for h, _ in result.hash_s)
        uncached = statistics.median(u for _, u in result.hash_s)
        lines.append(
            f"hidden={result.hidden}: state {result.state_bytes / 1024:.0f} KiB in "
            f"{result.leaves} leaves; flatten + hash {cached * 1e6:.0f} us "
            f"(uncached {uncached * 1e6:.0f} us)"
        )
        lines.append(f"  {'variant':<20} {'per update':>11} {'overhead':>9} {'in SDK':>7}  target")
        for variant in result.attached:
            if variant is result.attached[0] or (variant.waits and variant.hash_every == 1):
                bare = result.bare_waits if variant.waits else result.bare
                median = statistics.median(bare.update_s)
                lines.append(f"  {bare.name:<20} {median * 1e6:>8.0f} us {'':>9} {'':>7}")
            over, in_sdk = result.overhead(variant), result.in_sdk(variant)
            lines.append(
                f"  {variant.name:<20} {statistics.median(variant.update_s) * 1e6:>8.0f} us "
                f"{over:>+9.1%} {'-' if in_sdk is None else f'{in_sdk:.1%}':>7}  "
                f"{'met' if over <= target_of(result.hidden) else 'missed'}"
            )
    return lines


def version_of(name: str) -> str | None:
    """An installed distribution's version, or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=60, help="side-by-side rounds (60)")
    parser.add_argument(
        "--updates", type=int, default=50, help="updates per variant per round (50)"
    )
    parser.add_argument(
        "--hidden", default="128,1024", help="hidden widths, comma-separated (128: the example)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "sdk.json", help="JSON results")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table and write the JSON results."""
    args = parse_args(argv)
    model = load_digits_model()
    widths = [int(w) for w in args.hidden.split(",")]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="sdk-bench-") as folder:
        events = Path(folder) / "events.jsonl"
        results = []
        for hidden in widths:
            print(f"measuring hidden={hidden} ...", file=sys.stderr, flush=True)
            results.append(bench_model(model, hidden, args.rounds, args.updates, events))
    load_after = os.getloadavg()
    print(
        f"SDK cost per update: medians of {args.rounds} side-by-side rounds of {args.updates} "
        f"updates, single-threaded XLA (pool of {os.environ.get('NPROC')}), load average "
        f"{load_before[0]:.1f} -> "
        f"{load_after[0]:.1f} on {os.cpu_count()} CPUs; "
        f"target <= {TARGET:.0%}, {WIDE_TARGET:.0%} wider"
    )
    for line in table(results):
        print(line)
    record = {
        "benchmark": "sdk",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {"rounds": args.rounds, "updates": args.updates, "hidden": widths},
        "environment": {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "load_average": {"before": load_before, "after": load_after},
            "jax_backend": jax.default_backend(),
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "nproc": os.environ.get("NPROC"),
            "packages": {name: version_of(name) for name in PACKAGES},
        },
        "target": {"hidden_128": TARGET, "wider": WIDE_TARGET},
        "models": [r.record() for r in results],
        "figures": records(
            [
                at_most(
                    f"SDK overhead per update, hidden {r.hidden}, {v.name}",
                    r.overhead(v) * 100,
                    target_of(r.hidden) * 100,
                    ".1f",
                    " %",
                )
                for r in results
                for v in r.attached
                if not v.handed and not v.waits  # references, not targets
            ]
        ),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
