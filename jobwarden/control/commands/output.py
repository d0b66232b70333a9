"""What a ``wardenctl`` command hands back: a text or JSON answer on stdout, and an exit status.

The statuses follow supervisorctl's LSB convention where one applies.
"""

from __future__ import annotations

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


def emit(data: Any, as_json: bool, text: Callable[[Any], str]) -> None:
    """Write ``data`` to stdout as indented JSON, or as ``text`` renders it."""
    sys.stdout.write((json.dumps(data, indent=2, default=str) if as_json else text(data)) + "\n")
