"""Command jobs: a user's own program, run as an argv list (never through a shell).

A job file names either a ``task`` or a ``command``.  A command job's
`Program` is its argv, an optional absolute ``workdir``, an ``env`` added to
the daemon's allow-listed worker environment, whether it uses `jobwarden.sdk`
(``sdk``, default true) and, for a plain program, an optional
``[heartbeat]``.  The rules here are those `jobwarden.jobfile` applies at
intake, each problem naming its field.
"""

from __future__ import annotations

import re
import resource
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV_PREFIXES = ("JOBWARDEN_", "WATCHDOG_")
RESERVED_ENV_NAMES = frozenset({"NOTIFY_SOCKET"})
"""Names a job's ``env`` may not set: the daemon's own (and `RESERVED_ENV_PREFIXES`)."""
EXEC_STRING_MAX = 32 * 4096
"""The most bytes execve takes in one argv or environment string, its NUL included (Linux's
MAX_ARG_STRLEN, 32 pages, whatever the stack limit): one more fails the launch with E2BIG."""
EXEC_TOTAL_FLOOR, EXEC_TOTAL_CAP = 32 * 4096, 6 * 1024 * 1024
"""Linux's bounds on what execve takes for argv and the environment together."""
POINTER_BYTES = 8
PROGRAM_FIELDS = ("command", "workdir", "env", "sdk", "heartbeat")
"""The top-level fields of a command job that a task job may not have."""


class HeartbeatSection(BaseModel):
    """How a plain program (``sdk = false``) shows it is alive: ``file`` or ``pattern``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    file: str | None = None
    """A file (relative to the workdir, or absolute) whose mtime the program bumps."""
    pattern: str | None = None
    """A regular expression that a stdout line must match (`re.search`)."""

    @field_validator("file")
    @classmethod
    def _file(cls, value: str | None) -> str | None:
        if value is not None and (not value or "\0" in value):
            raise ValueError("must be a non-empty path without NUL")
        return value

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not value:
            raise ValueError("must be a non-empty regular expression")
        try:
            re.compile(value)
        except re.error as error:
            raise ValueError(f"does not compile: {error}") from error
        return value

    def describe(self) -> str:
        """The heartbeat in words, for incidents."""
        if self.pattern is not None:
            return f"a stdout line matching {self.pattern!r}"
        return f"a change of the mtime of {self.file!r}"


def argv_problem(value: Any) -> str | None:
    """What is wrong with a ``command`` before its type is checked (None when nothing is)."""
    if isinstance(value, str):
        return 'must be an argv list such as ["python", "train.py"], never a shell line'
    if isinstance(value, list):
        if not value:
            return "must be a non-empty argv list"
        for index, item in enumerate(value):
            if isinstance(item, str) and (not item or "\0" in item):
                return f"argument {index} must be a non-empty string without NUL"
    return None


def workdir_problem(value: str) -> str | None:
    """What is wrong with a ``workdir``'s form (None when nothing is)."""
    if "\0" in value:
        return "must be a path without NUL"
    if not Path(value).is_absolute():
        return (
            f"{value!r} is relative: the daemon needs an absolute path (`wardenctl submit FILE` "
            "and `wardenctl drill --job FILE` resolve a relative one against the file's folder)"
        )
    return None


def env_problems(env: Any) -> list[str]:
    """What is wrong with the names and values of an ``env`` table, one line per entry."""
    if not isinstance(env, dict):
        return []
    found = []
    for name, value in env.items():
        if not ENV_NAME.fullmatch(name):
            found.append(f"env.{name}: not a variable name (expected [A-Za-z_][A-Za-z0-9_]*)")
        elif name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):
            found.append(
                f"env.{name}: reserved (JOBWARDEN_*, NOTIFY_SOCKET and WATCHDOG_* are the daemon's)"
            )
        elif isinstance(value, str) and "\0" in value:
            found.append(f"env.{name}: the value holds NUL")
    return found


def exec_total_max() -> int:
    """The most bytes execve takes here for argv and the environment together, each string
    with its NUL and pointer: a quarter of the stack limit (``ulimit -s``), within Linux's
    bounds, as a launch from this process (the daemon's) would meet it."""
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    if soft == resource.RLIM_INFINITY:
        return EXEC_TOTAL_CAP
    return max(EXEC_TOTAL_FLOOR, min(EXEC_TOTAL_CAP, soft // 4))


def exec_problems(document: Mapping[str, Any]) -> list[str]:
    """What execve would refuse of a ``command`` and its ``env``, so that every launch would
    fail E2BIG: a string over `EXEC_STRING_MAX`, or all of them over `exec_total_max`."""
    command, env = document.get("command"), document.get("env")
    strings: list[tuple[str, str]] = []
    if isinstance(command, list):
        strings += [(f"command[{i}]", a) for i, a in enumerate(command) if isinstance(a, str)]
    if isinstance(env, dict):
        strings += [(f"env.{n}", f"{n}={v}") for n, v in env.items() if isinstance(v, str)]
    found, total = [], 0
    for field_name, text in strings:
        size = len(text.encode("utf-8", "surrogatepass")) + 1
        total += size + POINTER_BYTES
        if size > EXEC_STRING_MAX:
            what = "NAME=value" if field_name.startswith("env.") else "the argument"
            found.append(
                f"{field_name}: {what} is {size:,} bytes with its NUL; execve takes at most "
                f"{EXEC_STRING_MAX:,} (128 KiB) in one string (pass large data in a file)"
            )
    if total > (limit := exec_total_max()):
        found.append(
            f"command, env: {total:,} bytes together (each string with its NUL and an "
            f"{POINTER_BYTES}-byte pointer); execve takes at most {limit:,} here (a quarter of "
            "the stack limit, ulimit -s), before the daemon's own environment"
        )
    return found


def kind_problems(document: Mapping[str, Any]) -> list[str]:
    """A job runs a task or a command, never both, and each kind has only its own fields."""
    has_task, has_command = "task" in document, "command" in document
    if has_task and has_command:
        return [
            f"task, command: a job runs a task or a command, not both (found task = "
            f"{document['task']!r:.80} and command = {document['command']!r:.200})"
        ]
    if not has_task and not has_command:
        return ["task, command: one is required (a registered task, or an argv list)"]
    if has_task:
        return [
            f"{name}: applies to command jobs only, not to task {document['task']!r:.80}"
            for name in PROGRAM_FIELDS[1:]
            if name in document
        ]
    found = env_problems(document.get("env"))
    if "train" in document:
        found.append(
            "train: a command job's training fields are its program's own "
            "(jobwarden.sdk.attach(config=...)); [train] is for tasks"
        )
    sdk = document.get("sdk", True)
    heartbeat = document.get("heartbeat")
    if heartbeat is not None and sdk is not False:
        found.append(
            "heartbeat: only for a plain program (sdk = false); an SDK program's "
            "events are its heartbeat"
        )
    elif isinstance(heartbeat, dict) and ("file" in heartbeat) == ("pattern" in heartbeat):
        found.append("heartbeat: give exactly one of file or pattern")
    faults = document.get("faults")
    if sdk is False and isinstance(faults, dict):
        found += [
            f"faults.{name}: a plain program (sdk = false) cannot be given faults; "
            "only a program that uses jobwarden.sdk injects them"
            for name in faults
        ]
    return found


def workdir_problems(workdir: str) -> list[str]:
    """Whether a command job's workdir exists now, as a directory."""
    path = Path(workdir)
    if not path.exists():
        return [f"workdir: {workdir} does not exist"]
    if not path.is_dir():
        return [f"workdir: {workdir} is not a directory"]
    return []


@dataclass(frozen=True)
class Program:
    """A user's own program, as a command job runs it."""

    argv: tuple[str, ...]
    workdir: str | None
    """An absolute directory; None: the attempt's evidence folder."""
    env: Mapping[str, str] = field(hash=False)
    """Added on top of the daemon's allow-listed worker environment."""
    sdk: bool
    """Whether the program uses `jobwarden.sdk` (events on stdout); False: a plain program."""
    heartbeat: HeartbeatSection | None = None

    def label(self, limit: int = 120) -> str:
        """The command as a shell would show it, within ``limit`` characters.

        A long command keeps every argument's meaning: absolute paths lose their
        folders first (``.../train.py``), then the middle is cut, never the end.
        """
        text = shlex.join(self.argv)
        if len(text) <= limit:
            return text
        text = shlex.join(_short_path(arg) for arg in self.argv)
        if len(text) <= limit:
            return text
        half = (limit - 3) // 2
        return text[:half] + "..." + text[len(text) - (limit - 3 - half) :]

    def to_record(self) -> dict[str, Any]:
        """The program's fields of a job file, as JSON-ready data."""
        record: dict[str, Any] = {
            "command": list(self.argv),
            "workdir": self.workdir,
            "env": dict(self.env),
            "sdk": self.sdk,
        }
        if self.heartbeat is not None:
            record["heartbeat"] = self.heartbeat.model_dump(exclude_none=True)
        return record


def _short_path(arg: str) -> str:
    """An absolute path as ``.../name``; any other argument unchanged."""
    if arg.startswith("/") and "/" in arg[1:]:
        return ".../" + arg.rsplit("/", 1)[1]
    return arg
