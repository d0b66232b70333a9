"""A member of a multi-process attempt that exits 0 before it completed is the one blamed."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from jobwarden.daemon.launch.base import ExitInfo, LaunchSpec
from jobwarden.daemon.launch.local import LocalLauncher
from jobwarden.daemon.launch.members import EARLY_EXIT_CODE, GroupAttempt
from jobwarden.events import Event
from jobwarden.jobfolder import MEMBERS_FILE

FOLLOW_BOUND_S = 20.0
"""Far more than the group's settle and stop take; far less than member 0's 60 s hang."""

MEMBER = """
import json, os, sys, time
def say(kind, **fields):
    print(json.dumps({"event": kind, **fields}), flush=True)
say("ready", step=0, warmup_s=0.1, state_hash="h0", components={})
for step in (1, 2, 3):
    say("progress", step=step, loss=1.0, examples=8, update_s=0.01, state_hash=None)
if os.environ["JOBWARDEN_PROCESS_ID"] == "1":
    sys.exit(0)  # leaves after update 3, as if it had finished
time.sleep(60)  # member 0: waits in its collective for member 1
"""


def test_a_member_that_exits_0_early_fails_the_attempt_and_is_blamed(tmp_path: Path) -> None:
    """Member 1 exits 0 after update 3: the attempt fails at once, member 1 blamed by a
    failed event of its own, member 0 stopped rather than left to the stall timeout."""
    spec = LaunchSpec(
        "mp", 1, tmp_path, [sys.executable, "-c", MEMBER], {"PATH": os.environ["PATH"]}, processes=2
    )
    forwarded: list[Event] = []

    async def run() -> tuple[GroupAttempt, ExitInfo]:
        group = await GroupAttempt.start(spec, LocalLauncher().spawn)
        try:
            info = await asyncio.wait_for(
                group.follow(forwarded.append, lambda m: None), FOLLOW_BOUND_S
            )
        finally:
            group.kill()
        return group, info

    group, info = asyncio.run(run())
    assert group.failed_member == 1
    failures = [e for e in forwarded if e.kind == "failed"]
    assert [(e["code"], e["process"]) for e in failures] == [(EARLY_EXIT_CODE, 1)]
    assert "completed" not in [e.kind for e in forwarded]
    assert info.status == 0  # member 1's own status, with the failure named above
    members = json.loads((tmp_path / MEMBERS_FILE).read_text())
    assert members["failed_member"] == 1
    assert members["members"][0]["exit_status"] == -15
