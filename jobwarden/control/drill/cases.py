"""The five drills by name: crash, stall, duplicate writer, corrupt and incompatible checkpoints.

Each takes a `Drill` and returns its checks and a summary (`Outcome`); `run_drills` keeps the
evidence beside them.
"""

from __future__ import annotations

from collections.abc import Callable

from jobwarden.control.drill.context import Drill
from jobwarden.control.drill.recovering import corrupt, crash, stall
from jobwarden.control.drill.refusing import duplicate_writer, incompatible
from jobwarden.control.drill.verdict import Outcome

DRILLS: dict[str, Callable[[Drill], Outcome]] = {
    "crash": crash,
    "stall": stall,
    "duplicate-writer": duplicate_writer,
    "corrupt": corrupt,
    "incompatible": incompatible,
}
