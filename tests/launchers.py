"""A test-only launcher: every attempt runs through ``bash -c``, with no psutil at all.

It exists to show the launcher seam: it is written against
`jobwarden.daemon.launch.base` alone (its generic `ProcessGroupAttempt`), and the
daemon picks it with ``wardend --launcher tests.launchers:BashLauncher``
without a change to the policy or the supervisor.
"""

from __future__ import annotations

import asyncio

from jobwarden.daemon.launch.base import LINE_LIMIT, Launcher, LaunchSpec, ProcessGroupAttempt
from jobwarden.daemon.store.evidence import open_evidence

BANNER = "launched through bash"
SCRIPT = f'echo "{BANNER} $BASH_VERSION" >&2; exec "$@"'


class BashLauncher(Launcher):
    """Runs ``bash -c 'exec "$@"' bash ARGV...`` in a new session."""

    name = "bash"

    async def start(self, spec: LaunchSpec) -> ProcessGroupAttempt:
        """Start the attempt through bash."""
        spec.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open_evidence(spec.folder / "stderr.log") as stderr:
            proc = await asyncio.create_subprocess_exec(
                "bash",
                "-c",
                SCRIPT,
                "bash",
                *spec.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                env=spec.env,
                cwd=spec.cwd,
                start_new_session=True,
                limit=LINE_LIMIT,
            )
        return ProcessGroupAttempt(spec, proc)
