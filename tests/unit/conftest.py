"""The in-process unit tests: files written for real but not forced to the disk, and the
supervisor's real-time waits around a stall made short."""

from __future__ import annotations

import os

import pytest

from jobwarden.daemon.supervise import stallevidence


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Skip fsync: these tests read back what the daemon wrote, they do not pull the plug
    (tests/test_intake_safety.py does), and on a busy disk each fsync costs milliseconds."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


@pytest.fixture(autouse=True)
def quick_stall_handling(monkeypatch: pytest.MonkeyPatch) -> None:
    """No real wait for a stalled worker's stack dump, and a short SIGTERM-to-kill grace."""
    monkeypatch.setattr(stallevidence, "STACK_DUMP_WAIT_S", 0.0)
    monkeypatch.setattr(stallevidence, "STALL_KILL_GRACE_S", 0.01)
