"""wardenctl dashboard: the web pages live in a room of their own, an optional extra."""

from __future__ import annotations

import argparse
import sys

from jobwarden.control.commands.output import EXIT_REFUSED


def cmd_dashboard(args: argparse.Namespace) -> int:
    """Serve the read-only dashboard (jobwarden.dashboard), or say which extra it needs."""
    try:
        from jobwarden.dashboard.command import cmd_dashboard as serve
    except ImportError as error:
        sys.stderr.write(
            f"wardenctl: the dashboard needs the 'dashboard' extra "
            f"(pip install 'jobwarden[dashboard]'): {error}\n"
        )
        return EXIT_REFUSED
    status: int = serve(args)
    return status
