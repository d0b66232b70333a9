"""``wardenctl``: the operator's command line.

``verify`` and ``inspect`` work on files and need no daemon.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobwarden import __version__

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2


def _print(data: Any, as_json: bool, text: Callable[[Any], str]) -> None:
    sys.stdout.write((json.dumps(data, indent=2, default=str) if as_json else text(data)) + "\n")


def cmd_verify(args: argparse.Namespace) -> int:
    """Prove (or refuse) that CANDIDATE continues REFERENCE exactly."""
    from jobwarden.control import verify

    try:
        report = verify.verify(verify.load_run(args.reference), verify.load_run(args.candidate))
    except verify.VerifyInputError as error:
        sys.stderr.write(f"wardenctl verify: {error}\n")
        return EXIT_USAGE
    if args.json:
        _print(report.as_record(), True, str)
    else:
        sys.stdout.write(verify.render(report) + "\n")
    return EXIT_OK if report.proven else EXIT_REFUSED


def cmd_inspect(args: argparse.Namespace) -> int:
    """Describe a checkpoint file and its verdict."""
    from jobwarden.control import inspect

    record = inspect.describe(args.file, values=args.values)
    _print(record, args.json, inspect.render)
    return EXIT_OK if record["verdict"]["ok"] else EXIT_REFUSED


def cmd_version(args: argparse.Namespace) -> int:
    """Print the client's version."""
    _print({"wardenctl": __version__}, args.json, lambda d: f"wardenctl {d['wardenctl']}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    parser = argparse.ArgumentParser(prog="wardenctl", description="Control and inspect jobwarden.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    verify = commands.add_parser("verify", help="prove a resumed run continued the reference")
    verify.add_argument("reference", type=Path, help="events file or run folder of the reference")
    verify.add_argument("candidate", type=Path, help="events file or run folder of the resumed run")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.set_defaults(func=cmd_verify)

    inspect = commands.add_parser("inspect", help="show a checkpoint's identity and verdict")
    inspect.add_argument("file", type=Path)
    inspect.add_argument("--json", action="store_true", help="print as JSON")
    inspect.add_argument("--values", action="store_true", help="include the arrays of small states")
    inspect.set_defaults(func=cmd_inspect)

    version = commands.add_parser("version", help="print the version")
    version.add_argument("--json", action="store_true")
    version.set_defaults(func=cmd_version)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``wardenctl``."""
    args = build_parser().parse_args(argv)
    status: int = args.func(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
