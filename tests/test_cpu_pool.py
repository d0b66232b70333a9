"""The pinned runtime's bits do not depend on how many CPUs the process may use.

XLA's CPU client sizes its thread pools to the CPUs a process may use (``NPROC``
overrides it), and splits some reductions by that size even with one intra-op
thread: without the pinned pool, a column sum gives other bits in a process
allowed one CPU than in one allowed two.  Real JAX processes, each started
fresh (the pool is sized as JAX starts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from jobwarden.runtime import PINNED_ENV, PINNED_XLA_FLAGS

PROGRAM = textwrap.dedent(
    """
    import json, os, sys
    cpus = json.loads(sys.argv[1])
    if cpus:
        os.sched_setaffinity(0, cpus)
    import jax, jax.numpy as jnp, numpy as np, xxhash
    x = jax.random.normal(jax.random.key(0), (1024, 1024))
    column_sums = np.asarray(jax.jit(lambda a: a.sum(axis=0))(x))
    pool = [
        name for name in os.listdir("/proc/self/task")
        if open(f"/proc/self/task/{name}/comm").read().strip() == "tf_XLAEigen"
    ]
    print(json.dumps({"bits": xxhash.xxh3_64(column_sums.tobytes()).hexdigest(),
                      "pool": len(pool)}))
    """
)


def pinned_env(*, pool: bool) -> dict[str, str]:
    """This environment with the pins, with or without the pinned pool size."""
    env = {name: value for name, value in os.environ.items() if name != "NPROC"}
    env.update({name: value for name, value in PINNED_ENV.items() if pool or name != "NPROC"})
    env["XLA_FLAGS"] = " ".join(PINNED_XLA_FLAGS)
    return env


def run_all(runs: dict[str, tuple[dict[str, str], list[int]]]) -> dict[str, dict[str, object]]:
    """Each named run of `PROGRAM` (environment, CPUs allowed), side by side."""
    started = {
        name: subprocess.Popen(
            [sys.executable, "-c", PROGRAM, json.dumps(cpus)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (env, cpus) in runs.items()
    }
    found = {}
    for name, process in started.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err[-2000:]
        found[name] = json.loads(out.strip().splitlines()[-1])
    return found


def test_the_pinned_bits_are_the_same_on_one_cpu_and_on_two() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("SKIPPED LOUDLY: this process may use one CPU only; the test compares 1 and 2")
    found = run_all(
        {
            "one cpu": (pinned_env(pool=True), cpus[:1]),
            "two cpus": (pinned_env(pool=True), cpus[:2]),
            "two cpus, pool unpinned": (pinned_env(pool=False), cpus[:2]),
        }
    )
    assert found["one cpu"]["bits"] == found["two cpus"]["bits"]
    assert found["two cpus"]["pool"] == 1
    # Without the pinned pool the client has a thread per CPU, and other bits: the
    # hazard the pin removes is real on this runtime.
    assert found["two cpus, pool unpinned"]["pool"] == 2
    assert found["two cpus, pool unpinned"]["bits"] != found["one cpu"]["bits"]
