"""Plots as SVG drawn on the server: loss curves, an attempts timeline, a goodput bar.

Every text that comes from a job goes through `markupsafe.escape`; colours are CSS
classes of the package's own style sheet (the page's policy allows no inline style).
"""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

from jobwarden.dashboard.source import Curve, Goodput, Transition

WIDTH, HEIGHT, MARGIN = 640, 220, 36
MAX_POINTS = 2000
"""Points drawn per curve at most: a longer curve is thinned evenly, its ends kept."""
SETTLED = frozenset({"completed", "cancelled", "failed", "escalated"})


def assembled(parts: list[str]) -> Markup:
    """The parts as markup: every text of a job in them went through `escape`."""
    return Markup("".join(parts))  # noqa: S704 - built here, job texts escaped


def _scale(low: float, high: float, start: float, end: float) -> tuple[float, float]:
    """The factor and offset that map [low, high] onto [start, end]."""
    span = high - low or 1.0
    factor = (end - start) / span
    return factor, start - low * factor


def thinned(points: Sequence[tuple[int, float]]) -> Sequence[tuple[int, float]]:
    """At most `MAX_POINTS` of ``points``, evenly spaced, the first and last kept."""
    if len(points) <= MAX_POINTS:
        return points
    stride = len(points) / (MAX_POINTS - 1)
    return [points[int(i * stride)] for i in range(MAX_POINTS - 1)] + [points[-1]]


def loss_svg(curves: Sequence[Curve], reference: Curve | None = None) -> Markup:
    """Every attempt's loss by update, overlaid; a drill's reference run drawn beneath."""
    drawn = [*([reference] if reference else []), *curves]
    every = [point for curve in drawn for point in curve.points]
    if not every:
        return Markup('<p class="empty">No loss logged yet.</p>')
    xs, ys = [p[0] for p in every], [p[1] for p in every]
    fx, ox = _scale(min(xs), max(xs), MARGIN, WIDTH - 8)
    fy, oy = _scale(min(ys), max(ys), HEIGHT - MARGIN, 8)
    parts = [
        f'<svg class="plot loss" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        'aria-label="loss by update">',
        f'<line class="axis" x1="{MARGIN}" y1="{HEIGHT - MARGIN}" x2="{WIDTH - 8}" '
        f'y2="{HEIGHT - MARGIN}"/>',
        f'<line class="axis" x1="{MARGIN}" y1="8" x2="{MARGIN}" y2="{HEIGHT - MARGIN}"/>',
        f'<text class="tick" x="{MARGIN}" y="{HEIGHT - 20}">{min(xs)}</text>',
        f'<text class="tick end" x="{WIDTH - 8}" y="{HEIGHT - 20}">{max(xs)}</text>',
        f'<text class="tick" x="2" y="16">{max(ys):.3g}</text>',
        f'<text class="tick" x="2" y="{HEIGHT - MARGIN}">{min(ys):.3g}</text>',
        f'<text class="tick mid" x="{WIDTH / 2}" y="{HEIGHT - 4}">update</text>',
    ]
    keys = []
    for index, curve in enumerate(drawn):
        is_reference = reference is not None and index == 0
        name = "reference" if is_reference else f"attempt {curve.attempt}"
        css = "reference" if is_reference else f"series c{curve.attempt % 6}"
        keys.append(f'<span class="key {css}">{name}</span>')
        points = thinned(curve.points)
        line = " ".join(f"{x * fx + ox:.1f},{y * fy + oy:.1f}" for x, y in points)
        parts.append(f'<g class="{css}" data-attempt="{curve.attempt}"><title>{name}</title>')
        parts.append(f'<polyline points="{line}"/>')
        parts.extend(
            f'<circle class="point" cx="{x * fx + ox:.1f}" cy="{y * fy + oy:.1f}" r="2.5">'
            f"<title>{name}, update {x}: loss {y:.6g}</title></circle>"
            for x, y in points
        )
        parts.append("</g>")
    parts.append("</svg>")
    legend = "".join(keys)
    return assembled([*parts, f'<p class="legend">{legend}</p>'])


def timeline_svg(history: Sequence[Transition], now: float) -> Markup:
    """The job's states over time, one band per state held, each incident marked."""
    if not history:
        return Markup('<p class="empty">No history yet.</p>')
    start = history[0].time
    end = history[-1].time if history[-1].target in SETTLED else now
    end = max(end, history[-1].time, start + 1e-3)
    fx, ox = _scale(start, end, MARGIN, WIDTH - 8)
    top, band = 20, 28
    parts = [f'<svg class="plot timeline" viewBox="0 0 {WIDTH} 90" role="img" aria-label="states">']
    for index, moved in enumerate(history):
        until = history[index + 1].time if index + 1 < len(history) else end
        x0, x1 = moved.time * fx + ox, until * fx + ox
        state = escape(moved.target)
        parts.append(
            f'<rect class="band state-{state}" x="{x0:.1f}" y="{top}" '
            f'width="{max(x1 - x0, 1.5):.1f}" height="{band}">'
            f"<title>{state} for {until - moved.time:.2f} s: {escape(moved.reason)}</title></rect>"
        )
        if moved.reason.startswith("attempt ") and moved.reason.endswith(" launched"):
            parts.append(
                f'<text class="tick" x="{x0:.1f}" y="{top - 6}">'
                f"{escape(moved.reason.removesuffix(' launched'))}</text>"
            )
        if moved.incident:
            name = escape(moved.incident)
            parts.append(
                f'<a href="/incident/{name}"><path class="incident" '
                f'd="M{x0:.1f},{top + band + 2} l-6,12 h12 z"><title>incident {name}</title>'
                f'</path><text class="tick{" end" if x0 > WIDTH - 90 else ""}" '
                f'x="{x0 + (-8 if x0 > WIDTH - 90 else 8):.1f}" y="{top + band + 14}">{name}</text>'
                "</a>"
            )
    parts.append(
        f'<text class="tick" x="{MARGIN}" y="86">0 s</text>'
        f'<text class="tick end" x="{WIDTH - 8}" y="86">{end - start:.1f} s</text></svg>'
    )
    states = sorted({moved.target for moved in history})
    legend = "".join(f'<span class="key state-{escape(s)}">{escape(s)}</span>' for s in states)
    return assembled([*parts, f'<p class="legend">{legend}</p>'])


def goodput_svg(goodput: Goodput | None) -> Markup:
    """The job's wall time as one bar: productive updates, then each cause of badput."""
    if goodput is None or goodput.wall_s <= 0:
        return Markup('<p class="empty">No goodput counted yet.</p>')
    causes = [("productive", goodput.productive_s)]
    causes += [(cause, s) for cause, s in goodput.badput_s.items() if s > 0]
    total = sum(s for _, s in causes) or 1.0
    x, parts = (
        0.0,
        [
            f'<svg class="plot goodput" viewBox="0 0 {WIDTH} 34" role="img" '
            'aria-label="goodput by cause">'
        ],
    )
    legend = []
    for index, (cause, seconds) in enumerate(causes):
        width = seconds / total * WIDTH
        name = escape(cause)
        parts.append(
            f'<rect class="cause k{index % 10}" x="{x:.1f}" y="2" width="{width:.1f}" height="30">'
            f"<title>{name}: {seconds:.3f} s</title></rect>"
        )
        legend.append(f'<span class="key cause k{index % 10}">{name} {seconds:.2f} s</span>')
        x += width
    parts.append("</svg>")
    return assembled([*parts, f'<p class="legend">{"".join(legend)}</p>'])
