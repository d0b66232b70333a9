"""A job file's ``[slurm]`` section: where and how long its attempts run under ``--launcher slurm``.

Validated at intake with the rest of the job file (a bad field rejects the
request, every problem listed); operational, never hashed.  Tasks per node
are ``[run] processes`` (one Slurm task per member), so they are not set here.
Each field given overrides the daemon's own setting (``wardend --slurm-*``).
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from jobwarden.decoding import loads_json, loads_toml

TIME_PATTERN = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}|\d+-\d+|UNLIMITED|INFINITE")
"""Slurm's ``--time`` forms: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
PARTITION_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")


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
