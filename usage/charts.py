"""Server-rendered bar chart geometry for the usage page (an inline SVG, no JavaScript).

The template (templates/usage/_daily_chart.svg.html) draws what :func:`daily_bar_chart`
computes: one ``<rect class="bar">`` per day, a y axis from 0 to a round maximum, and a date
label under every few bars.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

from usage.selectors import DailyUsage

# Plot geometry in SVG user units (the SVG scales to its container's width).
WIDTH = 720
HEIGHT = 240
LEFT = 64  # room for the y-axis labels
RIGHT = 8
TOP = 12
BOTTOM = 28  # room for the date labels
MAX_X_LABELS = 8


@dataclass(frozen=True)
class Bar:
    """One day's bar: position and size in SVG units, and what it stands for."""

    x: float
    y: float
    width: float
    height: float
    date: str  # ISO date (UTC day)
    tokens: int
    cost_usd: Decimal


@dataclass(frozen=True)
class Tick:
    """An axis label at ``x``/``y`` (SVG units)."""

    x: float
    y: float
    text: str


@dataclass(frozen=True)
class BarChart:
    width: int
    height: int
    plot_left: int
    plot_right: int
    plot_top: int
    plot_bottom: int  # the baseline's y
    axis_max: int  # tokens at the top of the y axis
    bars: list[Bar]
    y_ticks: list[Tick]
    x_ticks: list[Tick]


def nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5 x 10^k that is >= ``value`` (1 for 0): a readable axis maximum."""
    if value <= 1:
        return 1
    exponent = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * exponent >= value:
            return step * exponent
    return 10 * exponent  # not reached


def daily_bar_chart(days: list[DailyUsage]) -> BarChart:
    """Geometry for a bar per day of ``days`` (oldest first), bar height proportional to the
    day's tokens (prompt + completion) on an axis from 0 to :func:`nice_ceiling` of the busiest
    day. Days without usage get a bar of height 0, so there is always one bar per day."""
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = HEIGHT - TOP - BOTTOM
    baseline = TOP + plot_h
    axis_max = nice_ceiling(max((d.tokens for d in days), default=0))
    slot = plot_w / max(len(days), 1)
    bar_w = max(slot * 0.7, 1.0)
    bars = []
    for i, day in enumerate(days):
        h = plot_h * day.tokens / axis_max
        bars.append(
            Bar(
                x=round(LEFT + i * slot + (slot - bar_w) / 2, 2),
                y=round(baseline - h, 2),
                width=round(bar_w, 2),
                height=round(h, 2),
                date=day.date.isoformat(),
                tokens=day.tokens,
                cost_usd=day.cost_usd,
            )
        )
    y_ticks = [
        Tick(x=LEFT - 6, y=round(baseline - plot_h * value / axis_max, 2), text=f"{value:,}")
        for value in ((0, axis_max // 2, axis_max) if axis_max % 2 == 0 else (0, axis_max))
    ]
    every = max(1, math.ceil(len(days) / MAX_X_LABELS))
    x_ticks = [
        Tick(x=round(bar.x + bar.width / 2, 2), y=HEIGHT - 8, text=days[i].date.strftime("%b %-d"))
        for i, bar in enumerate(bars)
        if (len(days) - 1 - i) % every == 0  # always label today, the last bar
    ]
    return BarChart(
        width=WIDTH,
        height=HEIGHT,
        plot_left=LEFT,
        plot_right=WIDTH - RIGHT,
        plot_top=TOP,
        plot_bottom=baseline,
        axis_max=axis_max,
        bars=bars,
        y_ticks=y_ticks,
        x_ticks=x_ticks,
    )
