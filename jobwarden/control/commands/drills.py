"""``wardenctl drill``: run the named drills and report their verdicts."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from jobwarden.control.commands.output import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, emit
from jobwarden.errors import UnsafeCacheError
from jobwarden.runtime import check_private_directory

if TYPE_CHECKING:
    from jobwarden.control.drill.jobs import DrillJobError

# The options that shape the default job's training and run; a user's job file has its own.
DEFAULT_JOB_OPTIONS = ("seed", "task", "steps", "checkpoint_every")


def cmd_drill(args: argparse.Namespace) -> int:
    """Rehearse failures through a daemon; exit 0 only if every check of every drill held.
    ``--launcher`` is handed to the private daemon through ``JOBWARDEN_DRILL_LAUNCHER``
    (drill/daemon.py reads it)."""
    if getattr(args, "launcher", None) is not None:
        os.environ["JOBWARDEN_DRILL_LAUNCHER"] = args.launcher
    # Imported here: the drills import numpy (through the checkpoint format), which no
    # other command should pay for at start-up.
    from jobwarden.control import drill

    # The options not given are absent from ``args`` (SUPPRESS): DrillParams' defaults hold.
    given = vars(args)
    params = dataclasses.replace(
        drill.DrillParams(),
        **{f.name: given[f.name] for f in dataclasses.fields(drill.DrillParams) if f.name in given},
    )
    names = list(drill.DRILLS) if args.drill == "all" else [args.drill]
    shaping = [f"--{name.replace('_', '-')}" for name in DEFAULT_JOB_OPTIONS if name in given]
    if args.job is not None and shaping:
        sys.stderr.write(
            f"wardenctl: {', '.join(shaping)} shape the default job; --job drills "
            f"{args.job} as written (change its [train] or [run] instead)\n"
        )
        return EXIT_USAGE
    try:
        job = drill.prepare(names, args.job, params)
    except drill.DrillJobError as error:
        return _cannot(error)
    root = Path(args.root) if args.root else None
    cache: Path | None = args.compile_cache
    if cache is not None:
        if root is not None:
            sys.stderr.write(
                "wardenctl: --compile-cache is the private daemon's; the daemon of --root "
                "keeps its own\n"
            )
            return EXIT_USAGE
        try:
            cache = check_private_directory(cache.absolute())
        except UnsafeCacheError as error:
            sys.stderr.write(f"wardenctl: {error.code}: {error.message}\n")
            return EXIT_USAGE
    try:
        results = drill.run_drills(names, root, Path(args.out), job, params, compile_cache=cache)
    except drill.DrillJobError as error:  # a program's own [run], once its reference told it
        return _cannot(error)
    if args.json:
        records = [r.as_record() for r in results]
        emit(
            records[0]
            if len(records) == 1
            else {"ok": all(r.ok for r in results), "drills": records},
            True,
            str,
        )
    else:
        sys.stdout.write("\n\n".join(drill.render(r) for r in results) + "\n")
        if len(results) > 1:
            passed = sum(r.ok for r in results)
            sys.stdout.write(f"\n{passed}/{len(results)} drills passed\n")
    return EXIT_OK if all(r.ok for r in results) else EXIT_REFUSED


def _cannot(error: DrillJobError) -> int:
    """Say why the job cannot be drilled; the usage status."""
    sys.stderr.write(f"wardenctl: cannot drill {error.origin}:\n")
    sys.stderr.write("".join(f"  {problem}\n" for problem in error.problems))
    return EXIT_USAGE
