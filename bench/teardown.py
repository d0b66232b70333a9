"""A crashed JAX worker's exit: SIGKILL to the exit seen, with and without its code pages.

The kernel frees a dying process's mapped pages one by one before its parent can
see the exit (a pidfd turns readable, ``waitpid`` returns), so that teardown
stands between a worker's crash and the supervisor's incident.  A JAX process
maps most of its libraries' code once it has compiled (about 130 MB); an attached
run lets go of those clean pages after its first update
(`jobwarden.runtime.release_code_pages`).

Each round starts both variants as whole processes of this virtualenv, in an
order that rotates: the pinned environment, ``import jax``, one jitted update
of a 256 x 256 matrix compiled and run; then, for ``released``, the release and
the update run again (its hot code mapped again, as a training loop's would be);
for ``as a spare``, the release as a warm spare makes it before it waits (the
heap's free memory given back, the anonymous memory put in huge pages where
whole ones fit) and the update run again.
The bench reads the process's RSS, sends SIGKILL and times until a pidfd on it is
readable.  Medians over rounds, and the ratio of the medians.

    .venv/bin/python bench/teardown.py [--rounds 15]

Prints a table and writes ``bench/results/teardown.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from daemon_records import wait_exit
from figures import context, records

from jobwarden.runtime import pin_environment

WORKER = """
import sys
import jax, jax.numpy as jnp
from jobwarden.runtime import release_code_pages
update = jax.jit(lambda x: (jnp.tanh(x @ x.T) * 0.5).sum())
x = jnp.ones((256, 256), jnp.float32)
update(x).block_until_ready()
if sys.argv[1] == "released":
    release_code_pages()
    update(x).block_until_ready()
if sys.argv[1] == "as a spare":
    release_code_pages(heap=True, collapse=True)
    update(x).block_until_ready()
sys.stdout.write("ready\\n")
sys.stdout.flush()
sys.stdin.read()
"""
VARIANTS = ("as started", "released", "as a spare")


def one(variant: str, env: dict[str, str]) -> tuple[float, int]:
    """SIGKILL to exit seen (s), and the RSS (bytes) it had, for one process."""
    process = subprocess.Popen(
        [sys.executable, "-c", WORKER, variant],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert process.stdout is not None
    if process.stdout.readline() != b"ready\n":
        raise SystemExit(f"the {variant} worker did not start (exit {process.wait()})")
    status = Path(f"/proc/{process.pid}/status").read_text()
    rss = int(status.split("VmRSS:")[1].split()[0]) << 10
    began = time.time()
    os.kill(process.pid, signal.SIGKILL)
    exited = wait_exit(process.pid, 60)  # a child not yet waited for: its pidfd still opens
    process.wait()
    if exited is None:
        raise SystemExit(f"the {variant} worker's exit was not seen")
    return exited - began, rss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "teardown.json"
    )
    args = parser.parse_args(argv)
    env = dict(os.environ)
    pin_environment(env)
    exits: dict[str, list[float]] = {v: [] for v in VARIANTS}
    sizes: dict[str, list[int]] = {v: [] for v in VARIANTS}
    load = [os.getloadavg()[0]]
    for number in range(args.rounds):
        shift = number % len(VARIANTS)
        for variant in VARIANTS[shift:] + VARIANTS[:shift]:
            seen, rss = one(variant, env)
            exits[variant].append(seen)
            sizes[variant].append(rss)
    load.append(os.getloadavg()[0])
    median = {v: statistics.median(exits[v]) for v in VARIANTS}
    ratio = median["released"] / median["as started"]
    print(
        f"SIGKILL -> exit seen (pidfd), medians of {args.rounds} alternated rounds, "
        f"load average {load[0]:.1f} -> {load[1]:.1f} on {os.cpu_count()} CPUs"
    )
    print(f"  {'variant':12s} {'exit p50':>9s} {'max':>9s} {'RSS':>8s}")
    for variant in VARIANTS:
        print(
            f"  {variant:12s} {median[variant] * 1e3:7.1f} ms {max(exits[variant]) * 1e3:6.1f} ms"
            f" {statistics.median(sizes[variant]) / 2**20:5.0f} MB"
        )
    print(f"  released / as started: {ratio:.2f}")
    print(f"  as a spare / as started: {median['as a spare'] / median['as started']:.2f}")
    figures = [
        context(f"teardown: SIGKILL -> exit seen, {name}, p50", median[name] * 1e3, ".1f", " ms")
        for name in VARIANTS
    ]
    record: dict[str, Any] = {
        "rounds": args.rounds,
        "load_average": load,
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
        "exit_s": exits,
        "rss_bytes": sizes,
        "ratio": ratio,
        "figures": records(figures),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
