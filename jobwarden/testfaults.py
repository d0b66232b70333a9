"""Test-only faults: behaviour broken on purpose, switched on by ``$JOBWARDEN_TEST_FAULT``.

The test suite uses them to prove that a check can fail (a drill that must
notice a wrong restore, a daemon that must keep garbage as evidence).  They
are never set outside the test suite; docs/worker.md lists them.
"""

from __future__ import annotations

import enum
import os
import signal
import time
from collections.abc import Mapping
from typing import Any

ENV = "JOBWARDEN_TEST_FAULT"
PAUSE_S = 60.0
"""How long `pause_if` blocks: far longer than a test needs to SIGKILL the daemon."""


class Fault(enum.StrEnum):
    """Each test-only fault, by the value ``$JOBWARDEN_TEST_FAULT`` takes."""

    BLOCK_LOOP_ON_SIGUSR2 = "block_loop_on_sigusr2"
    """wardend: SIGUSR2 blocks the loop, to show watchdog pings come from the loop."""
    ZERO_OPT_STATE_ON_RESTORE = "zero_opt_state_on_restore"
    """worker: a weights-only restore (optimizer state zeroed), which replay must catch."""
    GARBAGE_ON_STDOUT = "garbage_on_stdout"
    """worker: lines that are not events, which the daemon must keep without crashing."""
    PAUSE_AFTER_LAUNCH = "pause_after_launch"
    """wardend: block right after a worker is started and before its pid is saved, so a
    test can SIGKILL the daemon at that instant (logged first as ``testfault.paused``)."""
    CRASH_AFTER_SHARD = "crash_after_shard"
    """worker, sharded commit of step `SHARD_FAULT_STEP`: SIGKILL itself once its shard file
    is durable, before the members' reports are gathered."""
    CRASH_BEFORE_RECORD = "crash_before_record"
    """worker (member 0), sharded commit of step `SHARD_FAULT_STEP`: SIGKILL itself once the
    commit record's pending file is durable, before its rename."""
    CRASH_AFTER_RECORD = "crash_after_record"
    """worker (member 0), sharded commit of step `SHARD_FAULT_STEP`: SIGKILL itself right
    after the commit record's rename, before retention and the ``checkpoint`` event."""


SHARD_FAULT_STEP = 4
"""The step whose sharded commit the ``crash_*shard*``/``*record`` faults kill."""


def active(fault: Fault, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``fault`` is switched on in ``environ`` (default: this process's)."""
    return (os.environ if environ is None else environ).get(ENV) == fault.value


def pause_if(fault: Fault, **where: Any) -> None:
    """When ``fault`` is on: log ``testfault.paused`` with ``where``, then block `PAUSE_S`."""
    if active(fault):
        import structlog  # here: a worker would otherwise import it (and rich) for nothing

        structlog.get_logger("wardend.testfaults").warning("testfault.paused", fault=fault, **where)
        time.sleep(PAUSE_S)


def crash_if(fault: Fault, step: int) -> None:
    """When ``fault`` is on and ``step`` is `SHARD_FAULT_STEP`: SIGKILL this process."""
    if step == SHARD_FAULT_STEP and active(fault):
        os.kill(os.getpid(), signal.SIGKILL)


def environment(fault: Fault) -> dict[str, str]:
    """The variable that switches ``fault`` on, to merge into a child's environment."""
    return {ENV: fault.value}
