"""The figures the dashboard's charts draw, from :meth:`sqlmq.Insights.throughput` and
:meth:`~sqlmq.Insights.throughput_by_queue`: the rates a uPlot chart plots (drawn in the
browser by ``static/dashboard.js``), and the overview's sparklines, drawn here as inline
SVG so that the table refreshing itself every few seconds redraws them with no script, no
flicker and nothing to free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..insights import Bucket

#: The overview's sparkline, in SVG user units (the cell's size is the stylesheet's).
SPARK_WIDTH = 120.0
SPARK_HEIGHT = 24.0


def throughput(buckets: Sequence[Bucket], step: float) -> dict[str, Any]:
    """Per-minute rates at each bucket's end (unix seconds): completed, failed (FAILED,
    CANCELLED and EXPIRED: every ending that was not a success) and retried."""
    scale = 60.0 / step
    return {
        "t": [b.end.timestamp() for b in buckets],
        "completed": [b.completed * scale for b in buckets],
        "failed": [(b.failed + b.cancelled + b.expired) * scale for b in buckets],
        "retried": [b.retried * scale for b in buckets],
        "step": step,
    }


def total(by_queue: Mapping[str, Sequence[Bucket]]) -> list[Bucket]:
    """The buckets of every queue added up (all queues' lists have the same buckets, as
    :meth:`~sqlmq.Insights.throughput_by_queue` reads them at one moment)."""
    lists = list(by_queue.values())
    if not lists:
        return []
    return [Bucket(column[0].start, column[0].end,
                   *(sum(getattr(b, f) for b in column)
                     for f in ("completed", "failed", "cancelled", "expired", "retried")))
            for column in zip(*lists, strict=True)]


@dataclass(frozen=True, slots=True)
class Sparkline:
    """One queue's completions per bucket as an SVG polyline (``points``) and the area
    under it (``area``), scaled to its own peak, with the figures its tooltip names."""

    points: str
    area: str
    latest: int
    peak: int
    total: int

    @property
    def view_box(self) -> str:
        return f"0 0 {SPARK_WIDTH:g} {SPARK_HEIGHT:g}"


def sparkline(values: Sequence[int]) -> Sparkline:
    """``values`` oldest first, the newest at the right edge; all zeros: a flat line at
    the bottom."""
    peak = max(values, default=0)
    n = len(values)
    top, bottom = 1.0, SPARK_HEIGHT - 1.0
    coords = []
    for i, v in enumerate(values):
        x = SPARK_WIDTH * i / (n - 1) if n > 1 else SPARK_WIDTH
        y = bottom - (bottom - top) * (v / peak if peak else 0.0)
        coords.append(f"{x:.1f},{y:.1f}")
    points = " ".join(coords)
    area = f"0,{bottom:.1f} {points} {SPARK_WIDTH:.1f},{bottom:.1f}" if coords else ""
    return Sparkline(points, area, values[-1] if values else 0, peak, sum(values))


def sparklines(by_queue: Mapping[str, Sequence[Bucket]]) -> dict[str, Sparkline]:
    """Each queue's completions per bucket, as :func:`sparkline`."""
    return {q: sparkline([b.completed for b in buckets]) for q, buckets in by_queue.items()}


__all__ = ["SPARK_HEIGHT", "SPARK_WIDTH", "Sparkline", "sparkline", "sparklines",
           "throughput", "total"]
