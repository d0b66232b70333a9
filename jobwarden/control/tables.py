"""The daemon's answers as text for a terminal: the status table, a job's detail, events."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.0f}m"


def render_status(data: dict[str, Any]) -> str:
    """Status rows as a table."""
    header = ("JOB", "STATE", "ATTEMPT", "STEP", "LAST", "CKPT", "PID", "RSS", "UPTIME")
    rows = [header] + [
        (
            r["id"],
            r["state"],
            str(r["attempt"]),
            f"{r['step']}/{r['steps']}",
            _age(r["last_progress_age_s"]),
            "-" if r["newest_checkpoint_step"] is None else str(r["newest_checkpoint_step"]),
            str(r["pid"] or "-"),
            "-" if r["rss_mb"] is None else f"{r['rss_mb']:.0f}M",
            _age(r["uptime_s"]),
        )
        for r in data["jobs"]
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def render_job(data: dict[str, Any]) -> str:
    """One job's detail view."""
    lines = [
        f"{k}: {data[k]}"
        for k in (
            "id",
            "state",
            "reason",
            "task",
            "checkpoint",
            "attempt",
            "restarts",
            "step",
            "steps",
            "newest_checkpoint_step",
            "pid",
            "rss_mb",
            "cpu_percent",
            "process_status",
            "threads",
            "replayed_updates",
            "time_lost_s",
            "incidents",
        )
    ]
    lines.append("history:")
    lines += [f"  {h.get('from', '-')} -> {h['to']}: {h['reason']}" for h in data["history"]]
    return "\n".join(lines)


def render_incidents(data: list[dict[str, Any]]) -> str:
    """Incidents, one line each."""
    return (
        "\n".join(f"{i['id']}  {i['kind']:<22} {i['status']:<10} {i['outcome']}" for i in data)
        or "no incidents"
    )


def render_event(event: dict[str, Any]) -> str:
    """One event as a readable line."""
    stamp = time.strftime("%H:%M:%S", time.localtime(event.get("time", 0)))
    kind = event.get("event", "?")
    skip = {"v", "event", "time", "attempt", "components", "runtime", "traceback"}
    fields = " ".join(f"{k}={_short(v)}" for k, v in event.items() if k not in skip)
    return f"#{event.get('attempt')} {stamp} {kind:<10} {fields}"


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value):
        return value[:12]
    text = json.dumps(value) if isinstance(value, list | dict) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def render_checkpoints(rows: list[dict[str, Any]]) -> str:
    """Checkpoint files with their verdicts."""
    lines = []
    for row in rows:
        verdict = row["verdict"]
        mark = "ok" if verdict["ok"] else verdict.get("code", "refused")
        lines.append(
            f"{row['where']:<11} step {row['step']!s:>6}  {row['bytes']!s:>10} B  "
            f"{mark:<22} {Path(row['file']).name}  {verdict.get('message', '')}"
        )
    return "\n".join(lines) or "no checkpoint files"
