"""The uninterrupted reference runs the reliability sections compare final states with."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.reliability import References


@pytest.fixture(scope="session")
def references(tmp_path_factory: pytest.TempPathFactory, compile_cache: Path) -> References:
    """Reference finals by (seed, steps), each run once per test process on the warm cache."""
    return References(tmp_path_factory.mktemp("references"), compile_cache)
