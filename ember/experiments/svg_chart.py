"""Small inline SVG charts for the HTML run reports: lines over steps or time, and the spread of
a metric over seeds. Plain SVG text (no scripts, no fonts from elsewhere), so a report is one
self-contained file that any browser opens offline; every point carries a <title> tooltip.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#2563eb", "#c2410c", "#059669", "#7c3aed", "#db2777", "#0891b2", "#ca8a04", "#4b5563",
           "#dc2626", "#65a30d")
WIDTH, HEIGHT = 560, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 14, 30, 46


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]
    color: str = PALETTE[0]
    line: bool = True  # join the points
    dots: bool = False  # mark each point (held-out evaluations)
    dashed: bool = False
    tooltips: list[str] = field(default_factory=list)


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values (1, 2 or 5 x 10^k apart) covering [low, high]."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return []
    if high <= low:
        low, high = low - 1, high + 1
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step - 1e-9) * step
    ticks, value = [], first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e7 or abs(value) < 1e-3:
        return f"{value:.1e}"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


class _Frame:
    """Data -> pixel mapping and the axes of one chart."""

    def __init__(self, xs: list[float], ys: list[float], pad_y: float = 0.06, top: float = TOP) -> None:
        self.top = top
        self.x0, self.x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
        lo, hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
        span = hi - lo or max(abs(hi), 1.0)
        self.y0, self.y1 = lo - pad_y * span, hi + pad_y * span
        if self.x1 == self.x0:
            self.x0, self.x1 = self.x0 - 1, self.x1 + 1

    def x(self, v: float) -> float:
        return LEFT + (v - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT)

    def y(self, v: float) -> float:
        return HEIGHT - BOTTOM - (v - self.y0) / (self.y1 - self.y0) * (HEIGHT - self.top - BOTTOM)

    def axes(self, xlabel: str, ylabel: str, x_ticks: list[tuple[float, str]] | None = None) -> list[str]:
        parts = [f'<rect x="{LEFT}" y="{self.top}" width="{WIDTH - LEFT - RIGHT}" height="{HEIGHT - self.top - BOTTOM}" '
                 'fill="#fff" stroke="#d9dee5"/>']
        for t in nice_ticks(self.y0, self.y1):
            py = self.y(t)
            parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py:.1f}" y2="{py:.1f}" stroke="#eef1f5"/>')
            parts.append(f'<text x="{LEFT - 6}" y="{py + 4:.1f}" text-anchor="end">{escape(fmt(t))}</text>')
        ticks = x_ticks if x_ticks is not None else [(t, fmt(t)) for t in nice_ticks(self.x0, self.x1)]
        for t, label in ticks:
            px = self.x(t)
            parts.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{HEIGHT - BOTTOM}" y2="{HEIGHT - BOTTOM + 4}" '
                         'stroke="#888"/>')
            parts.append(f'<text x="{px:.1f}" y="{HEIGHT - BOTTOM + 17}" text-anchor="middle">{escape(label)}</text>')
        parts.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.0f}" y="{HEIGHT - 8}" text-anchor="middle">'
                     f'{escape(xlabel)}</text>')
        parts.append(f'<text transform="translate(14 {(self.top + HEIGHT - BOTTOM) / 2:.0f}) rotate(-90)" '
                     f'text-anchor="middle">{escape(ylabel)}</text>')
        return parts


def _legend(legend: list[tuple[str, str, bool]]) -> tuple[list[str], float]:
    """Legend entries in rows that fit the chart's width (none for a single series): (SVG, the
    top margin the plot then needs)."""
    if len(legend) < 2:
        return [], TOP
    items, x, row = [], LEFT, 0
    for label, colour, dashed in legend:
        width = 30 + 6.2 * len(label)
        if x + width > WIDTH and x > LEFT:
            x, row = LEFT, row + 1
        y = 26 + 13 * row
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        items.append(f'<line x1="{x}" x2="{x + 16}" y1="{y - 4}" y2="{y - 4}" stroke="{colour}" '
                     f'stroke-width="2.5"{dash}/><text x="{x + 20}" y="{y}">{escape(label)}</text>')
        x += width
    return items, TOP + 13 * row + 6


def _svg(title: str, parts: list[str], legend: list[str]) -> str:
    head = f'<text x="{LEFT}" y="14" font-weight="600">{escape(title)}</text>'
    return (f'<svg class="chart" role="img" aria-label="{escape(title)}" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11" fill="#1d2330">'
            + head + "".join(legend) + "".join(parts) + "</svg>")


def line_chart(title: str, series: list[Series], xlabel: str, ylabel: str) -> str:
    """Lines (and dots) of several series over a shared x axis."""
    series = [s for s in series if s.points]
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points if math.isfinite(y)]
    legend, top = _legend([(s.label, s.color, s.dashed) for s in series])
    frame = _Frame(xs, ys, top=top)
    parts = frame.axes(xlabel, ylabel)
    for s in series:
        points = [(x, y) for x, y in s.points if math.isfinite(y)]
        if s.line and len(points) > 1:
            path = " ".join(f"{frame.x(x):.1f},{frame.y(y):.1f}" for x, y in points)
            dash = ' stroke-dasharray="5 3"' if s.dashed else ""
            parts.append(f'<polyline class="series" points="{path}" fill="none" stroke="{s.color}" '
                         f'stroke-width="1.8"{dash}><title>{escape(s.label)}</title></polyline>')
        if s.dots or len(points) == 1:
            for k, (x, y) in enumerate(points):
                tip = s.tooltips[k] if k < len(s.tooltips) else f"{s.label}: {fmt(y)} at {fmt(x)}"
                parts.append(f'<circle class="point" cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" r="3.2" '
                             f'fill="{s.color}"><title>{escape(tip)}</title></circle>')
    return _svg(title, parts, legend)


def spread_chart(title: str, groups: list[tuple[str, list[tuple[str, float]]]], ylabel: str) -> str:
    """Per group, one dot per seed (tooltip: the seed) with the mean as a bar and ± 1 std."""
    ys = [v for _, values in groups for _, v in values if math.isfinite(v)]
    frame = _Frame([0.0, float(len(groups) + 1)], ys, pad_y=0.15)
    parts = frame.axes("", ylabel, [(i + 1, name) for i, (name, _) in enumerate(groups)])
    for i, (name, values) in enumerate(groups):
        finite = [(seed, v) for seed, v in values if math.isfinite(v)]
        if not finite:
            continue
        cx = frame.x(i + 1)
        mean = sum(v for _, v in finite) / len(finite)
        if len(finite) > 1:
            std = math.sqrt(sum((v - mean) ** 2 for _, v in finite) / (len(finite) - 1))
            parts.append(f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{frame.y(mean - std):.1f}" '
                         f'y2="{frame.y(mean + std):.1f}" stroke="#888" stroke-width="1.5"/>')
        parts.append(f'<line class="mean" x1="{cx - 16:.1f}" x2="{cx + 16:.1f}" y1="{frame.y(mean):.1f}" '
                     f'y2="{frame.y(mean):.1f}" stroke="{color(i)}" stroke-width="3"><title>{escape(name)} mean '
                     f'{fmt(mean)}</title></line>')
        for k, (seed, v) in enumerate(finite):
            offset = (k - (len(finite) - 1) / 2) * 6
            parts.append(f'<circle class="point" cx="{cx + offset:.1f}" cy="{frame.y(v):.1f}" r="3.5" fill="none" '
                         f'stroke="{color(i)}" stroke-width="1.6"><title>{escape(name)}, seed {escape(str(seed))}: '
                         f'{fmt(v)}</title></circle>')
    return _svg(title, parts, [])
