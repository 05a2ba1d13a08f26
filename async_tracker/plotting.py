"""Metric curves against step, one panel per metric, several runs overlaid: what
``AppRun.plot()`` returns and ``async-tracker plot`` saves.

matplotlib (the ``plot`` extra) draws through its Agg canvas on a bare ``Figure``: no pyplot,
so no GUI backend, no global figure state, nothing left open in a long-lived process. The
figure is a :class:`~async_tracker.run_figure.RunFigure`, which a notebook shows as an image
by itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from async_tracker.records import TrackerMetric

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PANEL_HEIGHT_IN = 2.6
FIGURE_WIDTH_IN = 8.0
MISSING_MATPLOTLIB = (
    "plotting needs matplotlib, which is not installed: pip install 'async-tracker[plot]'"
)

Curves = Mapping[str, Mapping[str, Sequence[TrackerMetric]]]  # run id -> metric -> points


def select(curves: Curves, wanted: Sequence[str] | None) -> list[str]:
    """The metrics to draw: those asked for, else every metric of any run, in order of
    appearance."""
    available = list(dict.fromkeys(name for run in curves.values() for name in run))
    if not available:
        raise ValueError(f"no metrics recorded for {', '.join(map(repr, curves))}")
    if not wanted:
        return available
    missing = [m for m in wanted if m not in available]
    if missing:
        raise ValueError(
            f"no metric {', '.join(map(repr, missing))} in these runs; "
            f"they have: {', '.join(available)}"
        )
    return list(dict.fromkeys(wanted))


def draw(curves: Curves, metrics: Sequence[str]) -> Figure:
    """One panel per metric, x = step, one line per run (same colour across panels)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        from async_tracker.run_figure import RunFigure
    except ImportError as exc:
        raise ImportError(MISSING_MATPLOTLIB) from exc

    # A Figure that a notebook shows as an image by itself (see run_figure.py).
    fig = RunFigure(
        figsize=(FIGURE_WIDTH_IN, 1.0 + PANEL_HEIGHT_IN * len(metrics)), layout="constrained"
    )
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(metrics), 1, sharex=True, squeeze=False)[:, 0]
    colours = [f"C{i % 10}" for i in range(len(curves))]
    for ax, metric in zip(axes, metrics):
        for colour, (run_id, run) in zip(colours, curves.items()):
            points = run.get(metric, ())
            if not points:
                continue
            # Infinities become gaps: matplotlib cannot place them, and NaN already is one.
            values = [p.value if math.isfinite(p.value) else math.nan for p in points]
            ax.plot([p.step for p in points], values, color=colour, label=run_id, linewidth=1.2)
        ax.set_title(metric, loc="left", fontsize="medium")
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("step")
    handles, labels = [], []
    for ax in axes:  # the legend lists each run once, even if its first panel lacks it
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    # Above the panels, outside them: run ids are long and would hide the curves.
    fig.legend(
        handles,
        labels,
        loc="outside upper center",
        ncols=min(len(labels), 2),
        fontsize="small",
        frameon=False,
    )
    return fig


