"""The in-process unit tests: files are written for real, but not forced to the disk."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Skip fsync: these tests read back what the daemon wrote, they do not pull the plug
    (tests/test_intake_safety.py does), and on a busy disk each fsync costs milliseconds."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)
