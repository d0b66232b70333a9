"""The sections of a job file that tell the daemon how to run it: ``[supervision]``, how
it watches and restarts the job, and ``[slurm]``, where and how long its attempts run
under ``--launcher slurm``.

Both are validated at intake with the rest of the job file (a bad field rejects the
request, every problem listed) and are operational, never hashed: a resume may change
them.  Tasks per node are ``[run] processes`` (one Slurm task per member), so they are
not set in ``[slurm]``; each of its fields overrides the daemon's own setting
(``wardend --slurm-*``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from jobwarden.decoding import loads_json, loads_toml

TIME_PATTERN = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}|\d+-\d+|UNLIMITED|INFINITE")
"""Slurm's ``--time`` forms: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
PARTITION_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")


class PhaseTimeouts(BaseModel):
    """The ``[supervision]`` fields that set a phase's watch outright, in seconds; None (the
    default) learns it from what the job has shown (docs/daemon.md, "Stall detection").
    ``startup_timeout_s`` and ``stall_timeout_s`` (the steps') are `SupervisionSection`'s."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    restore_timeout_s: float | None = Field(None, gt=0, le=86400)
    """``started`` until ``ready``: the restore and the program's set-up"""
    compile_timeout_s: float | None = Field(None, gt=0, le=86400)
    """``ready`` until the first update's ``progress``"""
    commit_timeout_s: float | None = Field(None, gt=0, le=86400)
    """a commit, from the ``progress`` that announces it to its ``checkpoint``"""
    final_timeout_s: float | None = Field(None, gt=0, le=86400)
    """the last update (where a program evaluates), and ``completed`` until the exit"""


class SupervisionSection(PhaseTimeouts):
    """How the daemon watches and restarts the job (the phases' own watches: `PhaseTimeouts`)."""

    startup_timeout_s: float = Field(60.0, gt=0, le=86400)
    stall_timeout_s: float | None = Field(None, gt=0, le=86400)
    """None: automatic (daemon/supervise/stall.py: max(60 s, 10x the slowest update seen))"""
    max_restarts: int = Field(3, ge=0, le=1000)
    """restarts in a row without progress before the job fails (daemon/supervise/budget.py)"""
    restart_limit: int = Field(20, ge=1, le=100_000)
    """failures within restart_limit_window_s, progress or not, before the job fails"""
    restart_limit_window_s: float = Field(300.0, gt=0, le=30 * 86400)
    restart_backoff_s: float = Field(0.5, ge=0, le=3600)
    """the wait before the second restart in a row (the first is immediate), doubled after"""
    restart_backoff_max_s: float = Field(30.0, ge=0, le=86400)
    restart_reset_after_s: float = Field(10.0, ge=0, le=86400)
    """an attempt that ran this long was healthy: the next restart is immediate again"""
    fatal_exit_codes: tuple[Annotated[int, Field(strict=True, ge=1, le=255)], ...] = Field(
        (), strict=False, max_length=255
    )
    """exit statuses that fail the job with no restart (systemd's RestartPreventExitStatus=)"""
    max_rss_mb: int | None = Field(None, ge=1)
    """None: no limit (the kernel's OOM killer and a systemd MemoryMax= still apply)"""
    stop_grace_s: float = Field(30.0, gt=0, le=3600)
    on_mismatch: Literal["escalate", "continue"] = "escalate"
    """a replay that differs: stop and escalate, or record it and let the job go on"""


class SlurmSection(BaseModel):
    """The per-job Slurm settings."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    partition: str | None = None
    time_limit: str | None = None
    """Slurm's ``--time``: ``30`` (minutes), ``1:30:00``, ``2-00:00:00``"""
    nodes: int | None = Field(None, ge=1, le=4096)

    @field_validator("partition")
    @classmethod
    def _partition(cls, value: str | None) -> str | None:
        if value is not None and not PARTITION_PATTERN.fullmatch(value):
            raise ValueError("must be a partition name matching [A-Za-z0-9._-]{1,64}")
        return value

    @field_validator("time_limit")
    @classmethod
    def _time_limit(cls, value: str | None) -> str | None:
        if value is not None and not TIME_PATTERN.fullmatch(value):
            raise ValueError(
                "must be a Slurm time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
            )
        return value


def section_of(job_folder: Path) -> SlurmSection | None:
    """The ``[slurm]`` section of the request kept in ``jobs/<id>/`` (``request.toml`` or
    ``request.json``); None without one.  The request passed intake, so it parses."""
    for request in sorted(job_folder.glob("request.*")):
        try:
            text = request.read_text()
            document = loads_json(text) if request.suffix == ".json" else loads_toml(text)
            found = document.get("slurm") if isinstance(document, dict) else None
            return SlurmSection.model_validate(found) if found is not None else None
        except (OSError, ValueError):
            return None
    return None
