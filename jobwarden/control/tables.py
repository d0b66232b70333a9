"""The daemon's answers as text for a terminal: the status table, a job's detail, events."""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any


def iso_time(seconds: float) -> str:
    """Epoch seconds as ISO 8601 in the local zone, with its offset: 2026-12-02T01:20:47+00:00."""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC).astimezone()
    return moment.isoformat(timespec="seconds")


def duration(seconds: float | None) -> str:
    """Seconds as supervisorctl writes an uptime (``0:01:23``, ``2 days, 3:04:05``); ``-``
    when absent."""
    if seconds is None:
        return "-"
    return str(timedelta(seconds=max(0, int(seconds))))


def size(mib: float | None) -> str:
    """A size in MiB as people read it (``412 MB``, ``1.2 GB``); ``-`` when absent."""
    if mib is None:
        return "-"
    value = mib * 2**20
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if value >= 10 or unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"


def cell(value: Any) -> str:
    """A value as a table cell: ``-`` when absent, never ``None``."""
    return "-" if value is None else str(value)


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    """Rows under a header, each column padded to its widest value."""
    lines = [header, *rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def progress(step: int | None, steps: int | None) -> str:
    """``step/steps``, ``-`` for what the program does not report (``-`` alone for neither)."""
    return "-" if step is None and steps is None else f"{cell(step)}/{cell(steps)}"


STATUS_HEADER = ("JOB", "STATE", "ATTEMPT", "STEP", "LAST", "CKPT", "PID", "RSS", "UPTIME")


def render_status(data: dict[str, Any]) -> str:
    """The status table from its columns, the jobs per state, and the rejected requests."""
    c = data["columns"]
    rows = [
        (
            str(c["id"][i]),
            str(c["state"][i]),
            str(c["attempt"][i]),
            progress(c["step"][i], c["steps"][i]),
            duration(c["last_progress_age_s"][i]),
            cell(c["newest_checkpoint_step"][i]),
            cell(c["pid"][i]),
            size(c["rss_mb"][i]),
            duration(c["uptime_s"][i]),
        )
        for i in range(len(c["id"]))
    ]
    totals = data["totals"]
    per_state = ", ".join(f"{n} {state}" for state, n in totals["states"].items())
    count = totals["jobs"]
    lines = [
        table(STATUS_HEADER, rows) if rows else "no jobs",
        *([f"{count} job{'s' * (count != 1)}: {per_state}"] if count else []),
    ]
    rejected = totals.get("rejected", 0)
    if rejected:
        lines.append(f"{rejected} rejected request{'s' * (rejected != 1)}: wardenctl rejected")
    return "\n".join(lines)


def render_job(data: dict[str, Any]) -> str:
    """One job's detail view."""
    shown = {
        **data,
        "rss_mb": size(data.get("rss_mb")),
        "incidents": ", ".join(data.get("incidents") or []) or None,
    }
    lines = [
        f"{k}: {cell(shown.get(k))}"
        for k in (
            "id",
            "state",
            "reason",
            "task",
            "checkpoint",
            "attempt",
            "restarts",
            "restarts_without_progress",
            "failures_in_window",
            "diverged_at_step",
            "step",
            "steps",
            "checkpoint_every",
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
    lines += render_members(data.get("members"))
    lines += render_spare(data.get("spare"))
    lines += render_goodput(data.get("goodput"))
    lines.append("history:")
    lines += [f"  {h.get('from', '-')} -> {h['to']}: {h['reason']}" for h in data["history"]]
    return "\n".join(lines)


def render_spare(spare: dict[str, Any] | None) -> list[str]:
    """The job's spare waiting for its next attempt, in one line (none without one)."""
    if not spare:
        return []
    held = size(spare.get("rss_mb"))
    if "members" in spare:
        return [f"spare: {spare['state']}, {held}, one per member ({len(spare['members'])})"]
    return [f"spare: {spare['state']}, {held}, pid {spare.get('pid')}"]


MEMBERS_HEADER = ("MEMBER", "PID", "NODE", "RSS", "STEP", "LAST", "READY", "EXIT")


def render_members(members: list[dict[str, Any]] | None) -> list[str]:
    """A multi-process job's members, one line each (none for a single process): those
    running, or how those of its newest attempt ended."""
    if not members:
        return []
    rows = [
        (
            str(m["process"]),
            cell(m.get("pid")),
            cell(m.get("node")),
            size(m.get("rss_mb")),
            cell(m.get("step")),
            duration(m.get("progress_age_s")),
            "yes" if m.get("ready") else "no",
            member_exit(m),
        )
        for m in members
    ]
    return ["members:", *("  " + line for line in table(MEMBERS_HEADER, rows).splitlines())]


def member_exit(member: dict[str, Any]) -> str:
    """How a member ended: its signal or status, ``(stopped)`` when the daemon stopped it
    after another failed; ``-`` while it runs."""
    ended = member.get("exit_signal") or member.get("exit_status")
    if ended is None:
        return "-"
    return f"{ended} (stopped)" if member.get("stopped") else str(ended)


def render_goodput(found: dict[str, Any] | None) -> list[str]:
    """The job's goodput and its badput by cause, largest first (none when not reported)."""
    if not found or found.get("goodput") is None:
        return []
    badput = sorted(found["badput_s"].items(), key=lambda item: -item[1])
    causes = ", ".join(f"{name} {duration(secs)}" for name, secs in badput if secs >= 0.001)
    return [
        f"goodput: {100 * found['goodput']:.1f} % of {duration(found['wall_s'])} "
        f"({found['new_updates']} new updates, {found['replayed_updates']} replayed)",
        f"badput: {causes or 'none'}",
    ]


def render_incidents(data: list[dict[str, Any]]) -> str:
    """Incidents, one line each."""
    return (
        "\n".join(f"{i['id']}  {i['kind']:<22} {i['status']:<10} {i['outcome']}" for i in data)
        or "no incidents"
    )


def render_event(event: dict[str, Any]) -> str:
    """One event as a readable line."""
    stamp = iso_time(event.get("time") or 0)
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
