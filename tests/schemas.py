"""The published JSON Schemas (docs/schemas/), and checks of real outputs against them.

The suite's real daemons are checked as they run (`tests.daemon.Daemon` and `ctl`):
every answer of a command that has a schema, every ``--json`` output of wardenctl,
and, when the daemon stops, every record of its log, every event of every attempt and
every incident line it wrote.  A mismatch fails the test that made the output, naming
the schema, the path in the instance and what was wrong.
"""

from __future__ import annotations

import functools
import json
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from jobwarden.events import Event, parse_line

FOLDER = Path(__file__).resolve().parent.parent / "docs" / "schemas"

ANSWERS = {
    "status": "status.schema.json",
    "incidents": {"type": "array", "items": {"$ref": "incident.schema.json"}},
    "checkpoints": "checkpoints.schema.json",
    "tail": {
        "type": "object",
        "required": ["lines", "cursor"],
        "properties": {"lines": {"type": "array", "items": {"$ref": "tail.schema.json"}}},
    },
    "maintail": {
        "type": "object",
        "required": ["records", "cursor"],
        "properties": {"records": {"type": "array", "items": {"$ref": "daemon-log.schema.json"}}},
    },
    "inspect": "inspect.schema.json",
    **{
        cmd: {"$ref": f"answers.schema.json#/$defs/{name}"}
        for cmd, name in {
            "runbook": "runbook",
            "events": "events",
            "submit": "submit",
            "stop": "stop",
            "cancel": "results",
            "restart": "results",
            "remove": "results",
            "archive_checkpoint": "archive_checkpoint",
            "signal": "signal",
            "archived": "archived",
            "rejected": "rejected",
            "verify": "verify",
            "metrics": "metrics",
            "version": "version",
        }.items()
    },
}
"""The schema of each command's answer (protocol version 2), by command."""

CLI = {
    "status": "status.schema.json",
    "incidents": ANSWERS["incidents"],
    "checkpoints": "checkpoints.schema.json",
    "inspect": "inspect.schema.json",
}
"""The schema of each wardenctl command's ``--json`` output printed as one document."""

CLI_LINES = {"tail": "tail.schema.json", "maintail": "daemon-log.schema.json"}
"""The schema of each line of the wardenctl commands whose ``--json`` prints JSON Lines."""


@functools.cache
def registry() -> Registry:  # type: ignore[type-arg]  # generic in referencing
    """Every schema of the folder, by its ``$id``."""
    resources = []
    for path in sorted(FOLDER.glob("*.schema.json")):
        contents = json.loads(path.read_text())
        resources.append((contents["$id"], Resource.from_contents(contents)))
    return Registry().with_resources(resources)


@functools.cache
def _validator(key: str) -> Draft202012Validator:
    schema = json.loads(key)
    if isinstance(schema, str):
        schema = {"$ref": schema}
    return Draft202012Validator(
        schema, registry=registry(), format_checker=Draft202012Validator.FORMAT_CHECKER
    )


def validator(schema: str | dict[str, Any]) -> Draft202012Validator:
    """A validator of a schema file's name, or of a schema object that refers to files."""
    return _validator(json.dumps(schema, sort_keys=True))


def check(schema: str | dict[str, Any], instance: Any, where: str) -> None:
    """Raise AssertionError when ``instance`` (found at ``where``) breaks ``schema``."""
    error = next(iter(validator(schema).iter_errors(instance)), None)
    if error is None:
        return
    best = min(validator(schema).iter_errors(instance), key=lambda e: -len(e.absolute_path))
    path = "/".join(str(p) for p in best.absolute_path) or "(the whole)"
    shown = json.dumps(instance, default=str)[:600]
    raise AssertionError(f"{where} does not match {schema}: at {path}: {best.message}\n{shown}")


def check_answer(cmd: str, answer: Any, where: str) -> None:
    """Check a control answer of ``cmd`` when the command has a schema."""
    if cmd in ANSWERS:
        check(ANSWERS[cmd], answer, f"the {cmd} answer of {where}")


def check_cli(args: list[str], stdout: str, where: str) -> None:
    """Check what ``wardenctl ARGS --json`` printed, when its command has a schema."""
    command = args[0] if args else ""
    if "--json" not in args or not stdout.strip():
        return
    if command in CLI_LINES:
        for number, line in enumerate(stdout.splitlines(), 1):
            check(CLI_LINES[command], json.loads(line), f"wardenctl {command} line {number}")
    elif command in CLI:
        check(CLI[command], json.loads(stdout), f"wardenctl {' '.join(args)} ({where})")


def regular(path: Path) -> bool:
    """Whether ``path`` is a regular file itself (not a link, a FIFO or a folder a test
    planted where the daemon's file belongs)."""
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def json_lines(path: Path) -> Iterable[tuple[int, Any]]:
    """The JSON lines of a file with their numbers; a line that is not JSON is skipped when
    it is the last one (a daemon killed mid-write), and fails the check otherwise."""
    lines = path.read_text(errors="replace").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except ValueError:
            if number != len(lines):
                raise AssertionError(f"{path} line {number} is not JSON: {line[:200]}") from None


def check_root(root: Path) -> int:
    """Check every record, event and incident line a daemon wrote under ``root``; returns
    how many were checked.  Event lines a worker wrote that the daemon itself counts as
    malformed are evidence of a broken program, not outputs of jobwarden: they are left."""
    checked = 0
    log = root / "wardend.log"
    if regular(log):
        for number, record in json_lines(log):
            check("daemon-log.schema.json", record, f"{log} line {number}")
            checked += 1
    for events in sorted(filter(regular, root.glob("jobs/*/attempts/*/events.jsonl"))):
        for number, line in enumerate(events.read_text(errors="replace").splitlines(), 1):
            if isinstance(parse_line(line, number), Event):
                check("worker-events.schema.json", json.loads(line), f"{events} line {number}")
                checked += 1
    for incidents in sorted(filter(regular, root.glob("jobs/*/incidents.jsonl"))):
        for number, line in json_lines(incidents):
            check("incident.schema.json", incident_of(line), f"{incidents} line {number}")
            checked += 1
    return checked


def incident_of(line: dict[str, Any]) -> dict[str, Any]:
    """The incident record a line of incidents.jsonl holds: ``incident`` is its ``id``;
    ``event``, ``time`` and ``time_iso`` are the write's."""
    record = {k: v for k, v in line.items() if k not in ("incident", "event", "time", "time_iso")}
    return {"id": line["incident"], **record}
