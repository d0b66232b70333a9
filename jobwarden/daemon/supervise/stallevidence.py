"""A stalled attempt: what it was doing at detection (psutil status, CPU in the gap, stacks),
then its stop.

`stop_stalled` gathers this evidence, with the phase it was stuck in and, for a
job of several processes, the member the others wait for, before it stops the
attempt (SIGTERM, `STALL_KILL_GRACE_S`, SIGKILL); `daemon.diagnosis` writes
it into the incident.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import structlog

from jobwarden.daemon.store import evidence
from jobwarden.daemon.store.jobs import JobTable
from jobwarden.daemon.supervise.attempt import Attempt
from jobwarden.daemon.supervise.phases import StallPhase, awaited
from jobwarden.states import JobState

log = structlog.get_logger("wardend.stalled")
STALL_KILL_GRACE_S = 1.0
STACK_DUMP_WAIT_S = 0.3
S = JobState


async def stop_stalled(table: JobTable, attempt: Attempt, phase: StallPhase, gap: float) -> None:
    """Take the stalled attempt's evidence, move its job to ``stalled`` (naming the phase, and
    the member of a job of several processes), then stop it."""
    record, timeout = attempt.record, attempt.stall.timeout_s
    try:
        found = await stall_evidence(attempt, phase, gap, timeout)
        found.update(attempt.running.members_view())
        attempt.stall_evidence = found
        member = found.get("stalled_member") if record.job.run.processes > 1 else None
        where = f" in the {phase} phase" if record.job.emits_events else ""  # a heartbeat's: none
        where += f" of member {member}" if member is not None else ""
        if record.state in (S.RUNNING, S.STARTING, S.RECOVERING):
            table.transition(
                record,
                S.STALLED,
                f"no {awaited(phase, record.job.emits_events)} for {gap:.2f} s{where} "
                f"(timeout {timeout:g} s)",
                gap_s=round(gap, 4),
            )
    finally:
        await attempt.running.stop(STALL_KILL_GRACE_S)


async def stall_evidence(
    attempt: Attempt, phase: StallPhase, gap: float, timeout: float
) -> dict[str, Any]:
    """What a stalled program was doing: psutil status, CPU used in the gap, every thread's stack.

    The stack dump comes from the SDK's faulthandler (SIGUSR1), read back from
    its stderr and also kept as ``stack-dump.txt``.  A plain program is sent no
    SIGUSR1 (it would end one that does not handle it) and gives no dump.  About
    0 % CPU is a hung program, about 100 % a spinning one.
    """
    sample = attempt.running.sample()
    cpu_gap = None
    if attempt.cpu_mark is not None and "cpu_s" in sample:
        mark_time, mark_cpu = attempt.cpu_mark
        span = time.monotonic() - mark_time
        used = sample["cpu_s"] - mark_cpu
        cpu_gap = {
            "cpu_s": round(used, 3),
            "over_s": round(span, 3),
            "percent": round(100 * used / span, 1) if span > 0 else None,
        }
    dump, dump_path = None, None
    if attempt.record.job.emits_events:
        dump, dump_path = await _stack_dump(attempt)
    log.warning(
        "attempt.stalled",
        job=attempt.record.id,
        attempt=attempt.number,
        phase=phase.value,
        gap_s=gap,
        status=sample.get("status"),
        cpu=cpu_gap,
    )
    return {
        "phase": phase,
        "phase_s": round(attempt.stall.clock.time() - attempt.stall.entered, 4),
        "timeout_s": timeout,
        "gap_s": round(gap, 4),
        "overshoot_s": round(gap - timeout, 4),
        "last_event": attempt.last_event,
        "last_progress": attempt.last_progress,
        "psutil_status": sample.get("status"),
        "cpu_during_gap": cpu_gap,
        "stack_dump": dump,
        "stack_dump_file": None if dump_path is None else str(dump_path),
    }


async def _stack_dump(attempt: Attempt) -> tuple[str, Path]:
    """Ask the program for every thread's stack (SIGUSR1) and keep what its stderr got."""
    stderr_path = attempt.folder / "stderr.log"
    offset = stderr_path.stat().st_size if stderr_path.exists() else 0
    attempt.running.signal(signal.SIGUSR1)
    await asyncio.sleep(STACK_DUMP_WAIT_S)
    try:
        with stderr_path.open("rb") as stream:
            stream.seek(offset)
            dump = stream.read(64 * 1024).decode(errors="replace")
    except OSError as error:
        dump = f"(no stack dump: {evidence.describe(error)})"
    dump_path = attempt.folder / "stack-dump.txt"
    evidence.keep(dump_path, dump)
    return dump, dump_path
