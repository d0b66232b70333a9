"""``wardenctl inspect`` and ``verify``: through the daemon for a job, on files for a path.

``inspect JOB [STEP]`` and ``verify JOB REFERENCE_JOB`` ask the daemon,
which reads the files as itself (a member of the control group cannot).
``inspect PATH`` and ``verify REFERENCE CANDIDATE`` with paths read the
files here, for root and offline use.  An argument is a path when it holds
a ``/``, ends in ``.safetensors`` or ``.jsonl``, or names something that
exists; anything else is a job id.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jobwarden.control.commands import files
from jobwarden.control.commands.daemon import ask
from jobwarden.control.commands.output import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, emit
from jobwarden.protocol import ControlError

PATH_SUFFIXES = (".safetensors", ".jsonl", ".pending")


def is_path(text: str) -> bool:
    """Whether a command-line argument names a file rather than a job."""
    return "/" in text or text.endswith(PATH_SUFFIXES) or Path(text).exists()


def cmd_inspect(args: argparse.Namespace) -> int:
    """Describe a checkpoint: a job's (through the daemon) or a file's."""
    from jobwarden.proof import inspect

    target: str = args.target
    if is_path(target):
        if args.step is not None:
            sys.stderr.write("wardenctl inspect: STEP goes with a job id, not with a file\n")
            return EXIT_USAGE
        if not Path(target).exists():
            sys.stderr.write(f"wardenctl inspect: {target}: no such file\n")
            return EXIT_USAGE
        args.file = Path(target)
        return files.cmd_inspect(args)
    record = ask(args, "inspect", job=target, step=args.step, values=args.values)
    emit(record, args.json, inspect.render)
    return EXIT_OK if record["verdict"]["ok"] else EXIT_REFUSED


def cmd_verify(args: argparse.Namespace) -> int:
    """Prove a continuation: two job ids through the daemon, or two paths here."""
    first, second = args.first, args.second
    paths = is_path(first), is_path(second)
    if all(paths):
        args.reference, args.candidate = Path(first), Path(second)
        return files.cmd_verify(args)
    if any(paths):
        sys.stderr.write(
            "wardenctl verify: give two job ids (JOB REFERENCE_JOB) or two paths "
            "(REFERENCE CANDIDATE), not one of each\n"
        )
        return EXIT_USAGE
    try:
        report = ask(args, "verify", job=first, reference=second)
    except ControlError as error:
        if error.code != "control.unverifiable":
            raise
        sys.stderr.write(f"wardenctl verify: {error.message}\n")
        return EXIT_USAGE
    text = report.pop("text")
    emit(report, args.json, lambda _: text)
    return EXIT_OK if report["proven"] else EXIT_REFUSED
