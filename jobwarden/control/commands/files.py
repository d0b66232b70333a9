"""The commands that work on files and need no daemon: ``verify`` and ``inspect``."""

from __future__ import annotations

import argparse
import sys

from jobwarden.control.commands.output import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, emit


def cmd_verify(args: argparse.Namespace) -> int:
    """Prove (or refuse) that CANDIDATE continues REFERENCE exactly."""
    from jobwarden.proof import verify

    try:
        report = verify.verify(verify.load_run(args.reference), verify.load_run(args.candidate))
    except verify.VerifyInputError as error:
        sys.stderr.write(f"wardenctl verify: {error}\n")
        return EXIT_USAGE
    if args.json:
        emit(report.as_record(), True, str)
    else:
        sys.stdout.write(verify.render(report) + "\n")
    return EXIT_OK if report.proven else EXIT_REFUSED


def cmd_inspect(args: argparse.Namespace) -> int:
    """Describe a checkpoint file and its verdict."""
    from jobwarden.proof import inspect

    record = inspect.describe(args.file, values=args.values)
    emit(record, args.json, inspect.render)
    return EXIT_OK if record["verdict"]["ok"] else EXIT_REFUSED
