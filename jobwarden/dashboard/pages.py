"""The pages: Jinja2 templates of the package, every value escaped unless marked safe.

The only markup let through is the package's own: the SVG of `plots` and a runbook
rendered by markdown-it with raw HTML off, so a job's own text (its command, its
stderr, a symptom quoting either) is shown as text and never becomes HTML.
"""

from __future__ import annotations

import datetime
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markdown_it import MarkdownIt
from markupsafe import Markup

from jobwarden.dashboard import plots
from jobwarden.dashboard.source import JobRow

_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False})


def runbook_html(text: str) -> Markup:
    """A runbook's markdown as HTML: raw HTML in it is shown as text, unsafe links dropped."""
    return Markup(_markdown.render(text))  # noqa: S704 - markdown-it escapes, html is off


def age(seconds: float | None) -> str:
    """``0:01:05`` for 65 s, as wardenctl status prints the last progress; ``-`` for none."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def moment(epoch: float | None) -> str:
    """An epoch time as UTC ISO 8601 to the second."""
    if not epoch:
        return "-"
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).isoformat(timespec="seconds")


def size(count: int | None) -> str:
    """Bytes in the largest unit under 1,024."""
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def row_fields(row: JobRow) -> dict[str, Any]:
    """One jobs-table row as the live stream sends it and the page's script writes it."""
    return {
        "id": row.id,
        "state": row.state,
        "attempt": row.attempt,
        "step": f"{row.step}/{row.steps if row.steps is not None else '?'}",
        "last": age(row.progress_age_s),
        "restarts": row.restarts_without_progress,
        "lost": f"{row.time_lost_s:.1f} s",
        "incidents": row.incidents,
    }


class Pages:
    """The templates, loaded once."""

    def __init__(self, drills: bool = False) -> None:
        self.env = Environment(
            loader=PackageLoader("jobwarden.dashboard", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(age=age, moment=moment, size=size)
        self.env.globals.update(
            loss_svg=plots.loss_svg,
            timeline_svg=plots.timeline_svg,
            goodput_svg=plots.goodput_svg,
            runbook_html=runbook_html,
            row_fields=row_fields,
            drills=drills,
        )

    def render(self, name: str, **values: Any) -> str:
        """One template, filled."""
        return self.env.get_template(name).render(**values)
