"""``python -m jobwarden.worker.spare --job FILE``: a warm spare, pre-started and handed a job.

A recovery spends most of its time before the first update: importing JAX,
building the task's data and compiling its update.  A spare does all of that
ahead of time, on the initial state's shapes, holding no lock and touching no
checkpoint directory, then writes one line on stdout (``{"spare": "ready"}``,
read by the daemon and never kept as an event) and waits on stdin.

The daemon hands it one attempt as one JSON line: the attempt's job file,
checkpoint directory, compile cache, signing key and ``stderr.log``.  From
there it is exactly the worker (`jobwarden.worker.builtin.run_job`): it takes
the writer lock, restores, emits the same events and runs on; only the
prepared data and compiled update are reused.  End of stdin before a handoff
(the daemon stopped, or retires the spare) ends it at once, preparing or not.

A member of a group spare (started with the membership variables of a
multi-process job, `jobwarden.sdk.distributed`) joins the other members of its
group before it prepares (`jobwarden.worker.warm.prepare`), and answers the
handoff with one line (``{"spare": "taken"}``) before it becomes the attempt:
the daemon hands the group only when every member has answered, and discards
the whole group otherwise.

It is a process started fresh, never a fork of a process that has imported
JAX: XLA keeps threads a fork would not carry over.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any

from jobwarden import tasks
from jobwarden.jobfile import load_job
from jobwarden.runtime import exit_now
from jobwarden.sdk.distributed import Membership
from jobwarden.worker.warm import prepare

READY = {"spare": "ready"}
"""The line a prepared spare writes on stdout, before any event."""
TAKEN = {"spare": "taken"}
"""The line a member of a group spare writes on stdout when it reads its handoff."""


def read_handoff(lines: queue.Queue[str]) -> None:
    """Read the one handoff line; end the process at once on end of input."""
    line = sys.stdin.readline()
    if not line:
        exit_now(0)
    lines.put(line)


def take_over(handoff: dict[str, Any]) -> None:
    """Become the attempt: its stderr.log as fd 2, stdin from /dev/null as a worker's."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    stderr = os.open(handoff["stderr"], flags, 0o600)
    os.dup2(stderr, 2)
    os.close(stderr)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def main(argv: list[str] | None = None) -> int:
    """Prepare, report ready, wait for the handoff, then run the attempt as the worker."""
    parser = argparse.ArgumentParser(prog="python -m jobwarden.worker.spare", description=__doc__)
    parser.add_argument("--job", type=Path, required=True, help="a job of the task to prepare")
    parser.add_argument("--compile-cache", type=Path, help="the JAX compilation cache")
    args = parser.parse_args(argv)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=read_handoff, args=(lines,), daemon=True).start()
    # The task registry the spare prepared with is the one it runs with: scanning every
    # installed distribution's entry points again would cost a recovery about 0.1 s.
    setattr(tasks, "_scan", functools.cache(tasks._scan))  # noqa: B010 - a module function
    began = time.monotonic()
    member = Membership.from_environ()
    warm = prepare(load_job(args.job), args.compile_cache, member if member.group else None)
    ready = {**READY, "pid": os.getpid(), "prepared_s": round(time.monotonic() - began, 4)}
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    line = lines.get()
    handoff = json.loads(line)
    if member.group:
        sys.stdout.write(json.dumps(TAKEN) + "\n")
        sys.stdout.flush()
    take_over(handoff)
    from jobwarden.worker.builtin import run_job

    job = load_job(Path(handoff["job"]))
    cache = Path(handoff["compile_cache"]) if handoff.get("compile_cache") else None
    key = Path(handoff["signing_key"]) if handoff.get("signing_key") else None
    return run_job(
        job, Path(handoff["checkpoint_dir"]), cache, key, warm if warm.fits(job) else None
    )


if __name__ == "__main__":
    exit_now(main())
