"""Downsampling a curve for a chart of a given width: min/max per pixel bucket.

A chart ``width`` pixels wide shows at most two distinct values per pixel column: the
lowest and the highest point that falls in it. :func:`min_max` keeps exactly those points
(the first of equals), plus the curve's first and last points, so that a spike of one
point among ten million is drawn where it is and the ends of the curve are where the data
ends. At most ``2 * width + 2`` points come out, whatever went in; a curve that small
already comes out whole. Buckets split the x range evenly (x as step or time), so a gap in
the data stays a gap. NaN values are ignored by the extremes (a bucket of NaN alone keeps
its first point, which the chart draws as a gap).

Vectorised with numpy (C loops over the points): ten million points take tens of
milliseconds, which is what lets the server downsample per request.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

# The widest chart a request may ask for, in pixels (a 4K screen, with some margin).
MAX_WIDTH = 4096
# The width used when a request gives none.
DEFAULT_WIDTH = 1200

FloatArray = npt.NDArray[np.float64]
IndexArray = npt.NDArray[np.intp]
# x of a chart: steps (int64) or times (float64), sorted.
XArray = npt.NDArray[np.int64] | npt.NDArray[np.float64]


def max_points(width: int) -> int:
    """The most points :func:`min_max` returns for ``width``."""
    return 2 * clamp_width(width) + 2


def clamp_width(width: int) -> int:
    return max(1, min(MAX_WIDTH, int(width)))


def min_max(x: XArray, y: FloatArray, width: int) -> IndexArray:
    """The indices of the points to draw of the curve ``(x, y)`` (``x`` sorted ascending),
    ascending: per bucket of the x range (``width`` buckets) the lowest and the highest
    ``y``, and the first and last point. All indices when the curve is small enough."""
    n = len(x)
    width = clamp_width(width)
    if n <= 2 * width + 2:
        return np.arange(n, dtype=np.intp)
    lo, hi = float(x[0]), float(x[-1])
    # x is sorted, so each bucket is a contiguous run of indices: where each starts, found
    # by binary search of the bucket edges (no pass over the points for it).
    edges = np.linspace(lo, hi, width + 1)[1:-1] if hi > lo else np.empty(0)
    bounds = np.unique(np.concatenate(([0], np.searchsorted(x, edges, "left"), [n])))
    keep = [0, n - 1]
    # One argmin and one argmax per bucket: a pass over the points in C per extreme, and a
    # Python step per bucket (a few thousand), not per point.
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        seg = y[a:b]
        low, high = int(seg.argmin()), int(seg.argmax())
        if np.isnan(seg[low]):  # argmin/argmax stop at a NaN: the extremes of the rest
            if np.isnan(seg).all():
                keep.append(a)
                continue
            low, high = int(np.nanargmin(seg)), int(np.nanargmax(seg))
        keep += (a + low, a + high)
    return np.unique(np.array(keep, dtype=np.intp))


def window(x: XArray, xmin: float | None, xmax: float | None) -> slice:
    """The slice of the sorted ``x`` inside ``[xmin, xmax]``, with one point more on each
    side where there is one, so that the line runs to the edges of a zoomed chart."""
    start = 0 if xmin is None else max(0, int(np.searchsorted(x, xmin, "left")) - 1)
    stop = len(x) if xmax is None else min(len(x), int(np.searchsorted(x, xmax, "right")) + 1)
    return slice(start, max(start, stop))


__all__ = ["DEFAULT_WIDTH", "MAX_WIDTH", "clamp_width", "max_points", "min_max", "window"]
