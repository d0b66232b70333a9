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
    return result
