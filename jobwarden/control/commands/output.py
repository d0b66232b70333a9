"""What a ``wardenctl`` command hands back: a text or JSON answer on stdout, and an exit status.

The statuses follow supervisorctl's LSB convention where one applies.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

EXIT_OK = 0
EXIT_REFUSED = 1  # the daemon is not reachable or refused the request; a check did not hold
EXIT_USAGE = 2
EXIT_ATTENTION = 3  # `status`: some job needs attention (failed or escalated)
EXIT_NO_SUCH = 4
EXIT_BUSY = 5  # the daemon is there but did not take or answer the request in time


TIME_KEYS = frozenset(
    {
        "time",
        "opened",
        "closed",
        "started",
        "ended",
        "archived",
        "submitted",
        "created",
        "read",
        "last_progress_time",
    }
)
"""Fields that hold epoch seconds; JSON output gives each an ISO 8601 twin, ``<key>_iso``
(`jobwarden.events.iso_twin`: UTC, to the millisecond)."""


def with_iso_times(data: Any) -> Any:
    """``data`` with an ISO 8601 twin beside every epoch-seconds field of `TIME_KEYS`."""
    if isinstance(data, list):
        return [with_iso_times(item) for item in data]
    if not isinstance(data, dict):
        return data
    from jobwarden.events import iso_twin  # only --json needs it, and events.py costs ~10 ms

    out = {}
    for key, value in data.items():
        out[key] = with_iso_times(value)
        plain = isinstance(value, int | float) and not isinstance(value, bool)
        if key in TIME_KEYS and plain and value > 0 and f"{key}_iso" not in data:
            out[f"{key}_iso"] = iso_twin(value)
    return out


def emit(data: Any, as_json: bool, text: Callable[[Any], str]) -> None:
    """Write ``data`` to stdout as indented JSON (epoch times with ISO 8601 twins), or as
    ``text`` renders it."""
    shown = json.dumps(with_iso_times(data), indent=2, default=str) if as_json else text(data)
    sys.stdout.write(shown + "\n")


def show_help(
    parser: argparse.ArgumentParser, commands: argparse._SubParsersAction[Any], topic: str | None
) -> int:
    """``wardenctl help [COMMAND]``: the same text as ``--help``."""
    if topic is None:
        parser.print_help()
        return 0
    chosen = commands.choices.get(topic)
    if chosen is None:
        sys.stderr.write(f"wardenctl: no command {topic!r}; `wardenctl help` lists them\n")
        return EXIT_USAGE
    chosen.print_help()
    return 0
