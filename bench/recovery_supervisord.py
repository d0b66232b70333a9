"""The supervisord variant of the recovery benchmark (`recovery.py`): the digits example
under supervisord (``autorestart=true``, ``startsecs=0``), no jobwarden.

Each sample is one supervisord of its own running ``examples/digits/train.py
--checkpoint-dir DIR --compile-cache CACHE --steps 2000`` in its folder (the
program resumes from its newest checkpoint by itself, the SDK's own store,
with the same compilation cache as the daemons' variants).  The bench SIGKILLs
the program right after its progress of update `KILL_AT` and measures the kill's
``time.time()`` to the first progress event of the next start: supervisord's
poll loop, then the cold start (interpreter, JAX, Flax, optax, the data, the
restore and the compilation).  No replay is checked: supervisord knows nothing
of the state.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from daemon import Wardend
from supervisord import Supervisord

KILL_AT = 40
DIGITS = Path(__file__).resolve().parent.parent / "examples" / "digits"
NAMES = {"digits-supervisord": "recovery: digits example under supervisord (autorestart)"}
FLAGS: dict[str, tuple[str, ...]] = {"digits-supervisord": ("--no-warm-spare",)}
"""The variant's daemon runs nothing: it only gives the sample a folder and the cache."""


def sample_supervisord(daemon: Wardend, job: str, variant: str) -> dict[str, Any]:
    """One digits run under its own supervisord, killed after `KILL_AT`, to its resumption."""
    folder = daemon.root.parent / "supervisord" / job
    argv = [sys.executable, str(DIGITS / "train.py"), "--checkpoint-dir", str(folder / "ck")]
    if daemon.cache is not None:
        argv += ["--compile-cache", str(daemon.cache)]
    sup = Supervisord(folder, [*argv, "--steps", "2000"], cwd=DIGITS)
    try:
        killed = sup.stream.kill_after(KILL_AT)
        resumed = sup.stream.resumed_after(killed)
    finally:
        sup.stop()
    return {"job": job, "recovery_s": resumed["time"] - killed, "spare": False}
