"""``python -m jobwarden.worker --job FILE --checkpoint-dir DIR``: run one attempt of a job.

``--signing-key FILE`` signs every checkpoint and refuses unsigned or wrongly
signed ones on restore; ``--compile-cache DIR`` keeps compiled code across attempts.

Events go to stdout as JSON lines, human output to stderr; the exit status
names the outcome (docs/worker.md lists them).  The CPU determinism pins are
set here, before JAX is imported.  The attempt itself is `jobwarden.worker.builtin`:
the job's task driven by an SDK run (`jobwarden.sdk`), the product's one step loop.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from jobwarden import testfaults
from jobwarden.errors import JobwardenError
from jobwarden.events import Emitter
from jobwarden.jobfile import load_job
from jobwarden.runtime import exit_now, pin_environment
from jobwarden.testfaults import Fault

CACHE_ENV = "JOBWARDEN_COMPILE_CACHE"


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, pin the runtime, run the attempt, return its exit status."""
    parser = argparse.ArgumentParser(prog="python -m jobwarden.worker", description=__doc__)
    parser.add_argument("--job", type=Path, required=True, help="the job file (TOML or JSON)")
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        required=True,
        help="the checkpoint directory this attempt writes (and resumes from)",
    )
    parser.add_argument(
        "--compile-cache",
        type=Path,
        default=os.environ.get(CACHE_ENV),
        help=f"a private JAX compilation cache directory (or ${CACHE_ENV})",
    )
    parser.add_argument(
        "--signing-key",
        type=Path,
        help="sign checkpoints with HMAC-SHA256 under the key in FILE (ours, mode 0600), "
        "and restore only checkpoints signed with it",
    )
    args = parser.parse_args(argv)
    try:
        job = load_job(args.job)
    except JobwardenError as error:
        return Emitter(sys.stdout).failed(error)
    if testfaults.active(Fault.GARBAGE_ON_STDOUT):
        # Lines a supervisor must keep as evidence without crashing on them.
        sys.stdout.write("this is not an event\n" + "x" * (2 << 20) + "\n")
        sys.stdout.write('{"v": 1, "event": "progress", "step": "three"}\n')
        sys.stdout.flush()
    pin_environment(exact=job.run.exact)
    from jobwarden.worker.builtin import run_job

    cache = Path(args.compile_cache) if args.compile_cache else None
    return run_job(job, args.checkpoint_dir.absolute(), cache, args.signing_key)


if __name__ == "__main__":
    exit_now(main())
