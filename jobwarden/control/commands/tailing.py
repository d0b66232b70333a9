"""``wardenctl tail`` and ``maintail``: the end of a job's lines, or of the daemon's log.

``tail JOB`` prints the job's last lines (``-n``, default 20): its worker's
events and, interleaved in time, the daemon's own actions for it (lines
marked ``wardend``: transitions, stalls, exits and their signal, incidents).
``-f`` starts from the end and follows until the job rests; ``--daemon``
keeps the daemon's lines only, ``--kind`` lines of some kinds only (``-n``
counts the lines kept); ``--stderr`` shows an attempt's stderr instead.
``maintail`` shows the daemon's own log, one readable line per record.
Ctrl-C ends either with status 130.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from typing import Any

from jobwarden.control.commands.daemon import RESTING_STATES, ask
from jobwarden.control.commands.output import EXIT_OK, with_iso_times
from jobwarden.control.tables import iso_time, render_event

FOLLOW_PAUSE_S = 0.25
HIDDEN = frozenset({"timestamp", "time", "time_iso", "level", "event"})
"""Fields every line shows in its own place."""
HIDDEN_IN_TAIL = HIDDEN | {"origin", "attempt", "job"}


FIELD_CHARS = 120
"""A field's value is cut past this many characters; a list's items are cut one by one."""
LIST_ITEMS = 32
"""At most this many items of a list field are shown, then how many more there are."""


def _cut(text: str) -> str:
    return text if len(text) <= FIELD_CHARS else text[: FIELD_CHARS - 3] + "..."


def _value(value: Any) -> str:
    """A field's value for a text line: a list item by item (each member of a large job
    keeps its pid in view), anything else whole up to `FIELD_CHARS`."""
    if isinstance(value, list):
        items = [_cut(json.dumps(item)) for item in value[:LIST_ITEMS]]
        more = [f"... {len(value) - LIST_ITEMS} more"] if len(value) > LIST_ITEMS else []
        return "[" + ", ".join(items + more) + "]"
    return _cut(json.dumps(value) if isinstance(value, dict) else str(value))


def render_action(record: dict[str, Any]) -> str:
    """One of the daemon's actions for a job, as a tail line."""
    stamp = iso_time(record.get("time") or 0)
    attempt = record.get("attempt")
    head = f"#{attempt if attempt else '-'} {stamp} wardend {record.get('event', '?')}"
    if record.get("event") == "job.transition":
        source, target = (
            record.get("from", record.get("source")),
            record.get("to", record.get("target")),
        )
        text = f"{source} -> {target}: {record.get('reason')}"
        return f"{head} {text}"
    if "incident" in record and "symptom" in record:
        text = record.get("outcome") or record["symptom"]
        return f"{head} {record['incident']} {record.get('kind')} {record.get('status')}: " + (
            _value(text or "-")
        )
    fields = " ".join(
        f"{k}={_value(v)}"
        for k, v in record.items()
        if k not in HIDDEN_IN_TAIL and v is not None  # an absent value is left out, never None
    )
    return f"{head} {fields}".rstrip()


def render_line(item: dict[str, Any]) -> str:
    """One tail line: a worker event, a plain program's output, or a daemon action."""
    if item.get("origin") == "wardend":
        return render_action(item)
    if item.get("event") == "output" and "time" not in item:
        stamp = f" {iso_time(item['read'])}" if "read" in item else ""
        return f"#{item.get('attempt')}{stamp} {item.get('line', '')}"
    return render_event(item)


def render_record(record: dict[str, Any]) -> str:
    """One record of the daemon's log: time, level, event, key=value."""
    if record.get("event") == "malformed":
        return f"? {record.get('line', '')}"
    stamp = record.get("timestamp")
    if isinstance(record.get("time"), int | float):
        moment = datetime.datetime.fromtimestamp(record["time"]).astimezone()
        stamp = moment.isoformat(timespec="milliseconds")
    level = str(record.get("level", "-")).upper()
    fields = " ".join(f"{k}={_value(v)}" for k, v in record.items() if k not in HIDDEN)
    return f"{stamp} {level:<7} {record.get('event', '?')} {fields}".rstrip()


def cmd_tail(args: argparse.Namespace) -> int:
    """Print the end of a job's lines; -f follows them until the job rests."""
    request: dict[str, Any] = {
        "job": args.job,
        "lines": args.lines,
        "stream": "stderr" if args.stderr else "events",
        "daemon": not args.no_daemon,
    }
    if args.daemon_only:
        request["worker"] = False
    if args.kind:
        request["kinds"] = args.kind
    if args.attempt is not None:
        request["attempt"] = args.attempt
    data = ask(args, "tail", **request)
    shown = [None]  # the attempt whose stderr lines are being printed
    while True:
        for item in data["lines"]:
            sys.stdout.write(_format(item, args, shown) + "\n")
        sys.stdout.flush()
        if not args.follow:
            return EXIT_OK
        if not data["lines"]:
            if data["state"] in RESTING_STATES:
                return EXIT_OK
            time.sleep(FOLLOW_PAUSE_S)
        data = ask(args, "tail", cursor=data["cursor"], **request)


def _format(item: dict[str, Any], args: argparse.Namespace, shown: list[Any]) -> str:
    if args.json:
        return json.dumps(with_iso_times(item))
    if not args.stderr:
        return render_line(item)
    if shown[0] != item["attempt"]:
        shown[0] = item["attempt"]
        return f"==> attempt {item['attempt']} stderr <==\n{item['line']}"
    return str(item["line"])


def cmd_maintail(args: argparse.Namespace) -> int:
    """Print the end of the daemon's own log; -f follows it."""
    data = ask(args, "maintail", lines=args.lines)
    while True:
        for record in data["records"]:
            shown = json.dumps(with_iso_times(record)) if args.json else render_record(record)
            sys.stdout.write(shown + "\n")
        sys.stdout.flush()
        if not args.follow:
            return EXIT_OK
        if not data["records"]:
            time.sleep(FOLLOW_PAUSE_S)
        data = ask(args, "maintail", cursor=data["cursor"])
