"""The protocol's older versions, made from the newest: one place that knows what changed.

A request names its version (``v``); the handlers speak only the newest, and
this module turns an older version's request into the newest's and the
newest's answer back into the older shape.  A change that only adds a field
or a command needs no new version; a change that renames, removes or reshapes
what a client reads does: it bumps `PROTOCOL_VERSION`, keeps the older version
in `SUPPORTED_VERSIONS`, and adds its step here (docs/protocol.md, "Versions").

Version 1 → 2:
- ``status`` without a job answered one object per job (``jobs``); version 2
  answers the table column by column (``columns``) unless asked for ``rows``.
- The daemon's records in ``tail`` and ``maintail`` answers name a transition's
  ends ``from``/``to`` (were ``source``/``target``), carry ``time_iso`` beside
  ``time`` (was ``timestamp``, ISO with a ``Z``), and an incident's line its
  ``symptom`` and, once closed, ``outcome`` (was one ``text``).
"""

from __future__ import annotations

from typing import Any

from jobwarden.protocol import PROTOCOL_VERSION, Request


def upgrade(request: Request) -> Request:
    """The request as the newest version asks it."""
    if request.version >= PROTOCOL_VERSION:
        return request
    args = request.args
    if request.cmd == "status" and args.get("job") is None and "rows" not in args:
        args = {**args, "rows": True}
    return Request(request.id, request.cmd, args, request.version)


def downgrade(request: Request, result: Any) -> Any:
    """The newest version's answer in the shape of the request's version."""
    if request.version >= PROTOCOL_VERSION or not isinstance(result, dict):
        return result
    key = {"tail": "lines", "maintail": "records"}.get(request.cmd)
    if key is None or not isinstance(result.get(key), list):
        return result
    return {**result, key: [version_1_record(item) for item in result[key]]}


def version_1_record(item: Any) -> Any:
    """A daemon record of a tail answer with version 1's names."""
    if not isinstance(item, dict):
        return item
    older = dict(item)
    if "from" in older and older.get("event") == "job.transition":
        older["source"], older["target"] = older.pop("from"), older.pop("to", None)
    if isinstance(older.get("time_iso"), str) and "v" not in older:  # not a worker event
        older["timestamp"] = older.pop("time_iso").replace("+00:00", "Z")
    if "incident" in older and "symptom" in older and older.get("origin") == "wardend":
        symptom, outcome = older.pop("symptom"), older.pop("outcome", None)
        older["text"] = outcome if outcome is not None else symptom
    return older
