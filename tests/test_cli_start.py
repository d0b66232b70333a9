"""wardenctl's start: each command builds its own parser and imports its own module alone,
and parses its arguments exactly as the parser of every command does."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobwarden.control import cli

EXAMPLES = [
    ["status"],
    ["--root", "r", "status", "job", "--json", "--all"],
    ["--timeout=3", "incidents", "j"],
    ["runbook", "i1", "--json"],
    ["drill", "crash", "--steps", "9", "--launcher", "local"],
    ["submit", "f.toml", "--replace"],
    ["dashboard", "--listen", "127.0.0.1:0", "--drills", "out/demo"],
    ["stop", "a", "b"],
    ["cancel", "all", "--json"],
    ["restart", "a"],
    ["remove", "a"],
    ["archive", "a"],
    ["signal", "a", "USR1"],
    ["rejected", "-n", "5"],
    ["resume", "a"],
    ["checkpoints", "a", "--json"],
    ["--socket", "s", "tail", "a", "-n", "3", "--kind", "incident.*", "--daemon"],
    ["maintail", "-f"],
    ["metrics"],
    ["shutdown", "--json"],
    ["verify", "a", "b", "--json"],
    ["inspect", "a", "3", "--values"],
    ["version", "--root", "after"],
    ["wait-ready", "--within", "2", "-q"],
]
"""One command line of every command (`cli.COMMANDS`)."""


def subcommands(parser: argparse.ArgumentParser) -> set[str]:
    """The command names a parser knows."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(action.choices)


def test_every_command_is_known_to_the_start() -> None:
    """`COMMANDS` names every command of the full parser but help, and the examples cover it."""
    assert subcommands(cli.build_parser()) - {"help"} == cli.COMMANDS
    assert {cli.chosen_command(argv) for argv in EXAMPLES} == cli.COMMANDS


@pytest.mark.parametrize("argv", EXAMPLES, ids=" ".join)
def test_one_command_parser_parses_as_the_full_one(argv: list[str]) -> None:
    """The parser of the chosen command alone gives the namespace the full parser gives."""
    chosen = cli.chosen_command(argv)
    assert chosen is not None
    only = cli.build_parser(chosen)
    assert {chosen} == subcommands(only)
    assert vars(cli.build_parser().parse_args(argv)) == vars(only.parse_args(argv))


@pytest.mark.parametrize(
    "argv",
    [[], ["help"], ["help", "status"], ["-h"], ["--ro", "r", "status"], ["stauts"], ["--root"]],
)
def test_anything_else_builds_every_command(argv: list[str]) -> None:
    """No command, help, an option argparse must interpret, or a typo: every parser is built."""
    assert cli.chosen_command(argv) is None


def test_status_imports_only_what_it_needs(tmp_path: Path) -> None:
    """`wardenctl status` imports no other command, nor JAX, NumPy, pydantic, orjson, TOML or
    the events module, which would cost its start tens of milliseconds."""
    script = (
        "import json, sys\n"
        "from jobwarden.control.cli import main\n"
        f"status = main(['--socket', {str(tmp_path / 'none.sock')!r}, 'status'])\n"
        "print(json.dumps([status, sorted(sys.modules)]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    status, modules = json.loads(done.stdout)
    assert status == 1  # nothing answers on that socket
    heavy = {"jax", "numpy", "pydantic", "orjson", "tomllib", "dataclasses", "jobwarden.events"}
    others = {
        f"jobwarden.control.commands.{name}" for name in ("drills", "evidence", "tailing", "files")
    }
    assert set() == (heavy | others) & set(modules)
