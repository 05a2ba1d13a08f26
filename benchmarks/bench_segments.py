"""Metric segments: JSON Lines (the fsspec backend's format so far) against Apache Parquet.

    python -m benchmarks.bench_segments [--points 10000000] [--rounds 5] [--quick]

Encode: the CPU time per point (``time.process_time``, all threads) of turning one flush's
columns into a segment's bytes, as the tracker's worker thread does at every flush: the
JSON encoder (``_encode_column`` per name, the backend's) against
:func:`~async_tracker.backend.fsspec.parquet.encode_segment`. Two flushes of a training loop
logging 4 metrics per step: 10,000 steps (a full batch) and 100 steps (a small flush). The
grouping of a flush's points into columns (``_columns_by_name``) comes before both and is
shown on its own.

A third figure, for reference: ``encode_segment`` given the same columns as numpy arrays
(what a flush of the packed ingress, which holds columns of machine numbers, could pass).

Decode: one metric of ``--points`` points in one segment, read back into columns: the
backend's JSON reader (``parse_segment_columns``: lists), the dashboard's JSON reader
(``async_tracker.ui.segments``: numpy, times left as text until a chart asks) and
:func:`~async_tracker.backend.fsspec.parquet.decode_segment` with every column, and with steps and
values alone (what a chart by step reads). CPU time counts pyarrow's reader threads; wall
time is shown too.

Rounds alternate the formats; each figure is a median over rounds, and ratios are to the
JSON encoder or the backend's JSON reader of the same run.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from async_tracker.backend.fsspec import _columns_by_name, _encode_column, parse_segment_columns
from async_tracker.backend.fsspec.columns import parse_segment
from async_tracker.backend.fsspec.parquet import decode_segment, encode_segment
from async_tracker.records import MetricRow

NAMES = ("loss", "acc", "lr", "grad_norm")
T0 = 1.79e9


def flush_rows(steps: int, start: int = 0) -> list[MetricRow]:
    """A training loop's flush: 4 metrics per step, in call order, as the ingress holds them."""
    rng = np.random.default_rng(start)
    loss = (2.0 + np.cumsum(rng.normal(0.0, 0.01, steps))).tolist()
    rows: list[MetricRow] = []
    for i in range(steps):
        step, x, now = start + i, loss[i], T0 + (start + i) * 0.05
        rows += [
            ("loss", x, step, now),
            ("acc", 1.0 / (1.0 + x * x), step, now + 1e-6),
            ("lr", 3e-4 * (0.999**i), step, now + 2e-6),
            ("grad_norm", abs(x) * 3.1, step, now + 3e-6),
        ]
    return rows


def encode_json(
    columns: dict[str, tuple[Sequence[int], Sequence[float], Sequence[float]]],
) -> bytes:
    data = b"".join(_encode_column(n, s, v, t, "bench") for n, (s, v, t) in columns.items())
    hashlib.sha1(data).hexdigest()  # the backend names the segment by it
    return data


def encode_parquet(
    columns: dict[str, tuple[Sequence[int], Sequence[float], Sequence[float]]],
) -> bytes:
    data = encode_segment("bench-run", "0123456789abcdef", 1_000, columns)
    hashlib.sha1(data).hexdigest()
    return data


def cpu_per_call(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per call, over ``repeat`` calls."""
    gc.collect()
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.process_time() - c0) / repeat, (time.perf_counter() - w0) / repeat


def bench_encode(steps: int, rounds: int, target_s: float) -> dict[str, float]:
    rows = flush_rows(steps)
    points = len(rows)
    columns = _columns_by_name(rows)
    json_size, parquet_size = len(encode_json(columns)), len(encode_parquet(columns))
    # Calls per round: about target_s of JSON encoding.
    once, _ = cpu_per_call(lambda: encode_json(columns), 3)
    repeat = max(1, int(target_s / max(once, 1e-6)))
    # The same points as numpy arrays: what a flush of the packed ingress could hand over.
    arrays = {
        name: (np.array(s, np.int64), np.array(v, np.float64), np.array(t, np.float64))
        for name, (s, v, t) in columns.items()
    }
    group, js, pq_, pq_np = [], [], [], []
    for _ in range(rounds):
        group.append(cpu_per_call(lambda: _columns_by_name(rows), repeat)[0])
        js.append(cpu_per_call(lambda: encode_json(columns), repeat)[0])
        pq_.append(cpu_per_call(lambda: encode_parquet(columns), repeat)[0])
        pq_np.append(cpu_per_call(lambda: encode_parquet(arrays), repeat)[0])  # type: ignore[arg-type]
    per = 1e9 / points
    return {
        "points": points,
        "group_ns": statistics.median(group) * per,
        "json_ns": statistics.median(js) * per,
        "parquet_ns": statistics.median(pq_) * per,
        "parquet_np_ns": statistics.median(pq_np) * per,
        "json_bytes": json_size / points,
        "parquet_bytes": parquet_size / points,
    }


def bench_decode(points: int, rounds: int) -> dict[str, tuple[float, float]]:
    rng = np.random.default_rng(1)
    steps = list(range(points))
    values = (2.0 + np.cumsum(rng.normal(0.0, 0.01, points))).tolist()
    times = (T0 + np.arange(points) * 0.05).tolist()
    columns = {"loss": (steps, values, times)}
    json_data = encode_json(columns)
    parquet_data = encode_parquet(columns)
    del steps, values, times, columns
    readers: dict[str, Callable[[], object]] = {
        "json (backend reader)": lambda: parse_segment_columns(json_data),
        "json (dashboard reader)": lambda: parse_segment(json_data),
        "parquet, all columns": lambda: decode_segment(parquet_data),
        "parquet, step+value": lambda: decode_segment(parquet_data, columns=()),
    }
    sizes = {"json": len(json_data), "parquet": len(parquet_data)}
    print(
        f"decode: one metric of {points:,} points; segment {sizes['json'] / 1e6:.0f} MB "
        f"as JSON, {sizes['parquet'] / 1e6:.0f} MB as Parquet"
    )
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in readers}
    for _ in range(rounds):
        for name, read in readers.items():
            got[name].append(cpu_per_call(read, 1))
    return {
        name: (statistics.median(c for c, _ in t), statistics.median(w for _, w in t))
        for name, t in got.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--points", type=int, default=10_000_000, help="points decoded")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes")
    args = parser.parse_args()
    points, rounds, target = args.points, args.rounds, 0.2
    if args.quick:
        points, rounds, target = 100_000, 2, 0.02
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"pyarrow {pa.__version__}, {platform.platform()}, load {load:.2f}"
    )
    print()
    print("encode: CPU per point of one flush (4 metrics per step)")
    print(
        f"{'flush':>14} {'group':>8} {'json':>8} {'parquet':>8} {'ratio':>6} "
        f"{'pq (numpy in)':>14} {'json B/pt':>10} {'pq B/pt':>8}"
    )
    for steps in (10_000, 100):
        r = bench_encode(steps, rounds, target)
        print(
            f"{steps:>7,} steps {r['group_ns']:6.0f}ns {r['json_ns']:6.0f}ns "
            f"{r['parquet_ns']:6.0f}ns {r['parquet_ns'] / r['json_ns']:6.2f} "
            f"{r['parquet_np_ns']:12.0f}ns {r['json_bytes']:10.1f} {r['parquet_bytes']:8.1f}"
        )
    print(
        "  (group: _columns_by_name, before either; ratio: parquet / json; pq (numpy in): "
        "the same columns given as numpy arrays)"
    )
    print()
    decoded = bench_decode(points, rounds)
    base_cpu, base_wall = decoded["json (backend reader)"]
    print(f"{'reader':>25} {'cpu (s)':>8} {'wall (s)':>9} {'cpu ratio':>10} {'wall ratio':>11}")
    for name, (cpu, wall) in decoded.items():
        print(f"{name:>25} {cpu:8.3f} {wall:9.3f} {cpu / base_cpu:10.3f} {wall / base_wall:11.3f}")
    print("  (ratios: to the backend's JSON reader)")


if __name__ == "__main__":
    main()
