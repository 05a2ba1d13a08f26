"""Core benchmarks of async_tracker: the cost of the write path, as ratios.

Every figure is a ratio to a baseline measured in the same process, in the same run, in
alternated short rounds, and compared by medians: the machines these run on are shared and
noisy, so absolute times mislead. Run from the repository root::

    python -m benchmarks.bench_core            # full size, about a minute
    python -m benchmarks.bench_core --quick    # smoke run, a few seconds
    python -m benchmarks.bench_core --json bench.json

Benchmarks (see benchmarks/README.md):

* ``blocking``: 100 writes over a third-party blocking ``TrackerBase`` whose every method
  sleeps 50 ms: the time the caller is blocked in those calls, then ``close()``. Runs first,
  so that its first call also starts the process's tracker loop (cold), then again (warm).
* ``calls``: the median cost of one ``AppRun.log_metric`` call against a bare method that
  appends the same tuple to a ``deque``, with the flusher thread running.
* ``loop``: the slowdown of a CPU-bound pure-Python training loop that logs 4 metrics per
  step, against the same loop without logging and against the loop appending the same
  tuples to a bare deque; the flusher's delivery work per record.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext, suppress
from typing import Any

from async_tracker import AppRun, AsyncTrackerBase, TrackerBase
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.records import Lineage, TrackerArtifact, TrackerSource
from async_tracker.runtime.process import runtime
from async_tracker.settings import RunOptions

perf_ns = time.perf_counter_ns
cpu_ns = time.process_time_ns

# Targets of issue 12 (benchmarks, not tests).
TARGET_CALL_RATIO = 1.5
TARGET_LOOP_SLOWDOWN_PCT = 2.0
TARGET_BLOCKED_MS = 5.0


# ---------------------------------------------------------------------------------------------
# Backends


class BackendFactory:
    """Builds a fresh backend for the ``calls`` and ``loop`` benchmarks."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.tmp: str | None = None
        if kind == "fsspec":
            try:
                import fsspec

                from async_tracker.backend.fsspec import FsspecTracker
            except ImportError as exc:
                raise SystemExit(f"--backend fsspec: not available here ({exc})") from exc
            self.tmp = tempfile.mkdtemp(prefix="async-tracker-bench-")
            self._fs = fsspec.filesystem("file")
            self._fsspec_tracker = FsspecTracker

    def new(self) -> TrackerBase | AsyncTrackerBase:
        if self.kind == "memory":
            return InMemoryTracker()
        assert self.tmp is not None
        return self._fsspec_tracker(self._fs, self.tmp)

    def forget(self, backend: TrackerBase | AsyncTrackerBase) -> None:
        """Drops what a memory backend stored (keeps memory flat); only call when idle."""
        if isinstance(backend, InMemoryTracker):
            backend.runs.clear()

    def cleanup(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def machine() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def median(xs: list[float]) -> float:
    return statistics.median(xs)


# ---------------------------------------------------------------------------------------------
# 1. calls: AppRun.log_metric against a bare deque append


class BareDeque:
    """The baseline: a bare method appending the same tuple AppRun appends."""

    def __init__(self) -> None:
        self.records: deque[tuple[Any, ...]] = deque()

    def log_metric(self, name: str, value: float, step: int | None = None) -> None:
        self.records.append((name, value, step, time.time()))


class BareDequeNoTime:
    """A barer baseline: the same append without the timestamp (a lower bound)."""

    def __init__(self) -> None:
        self.records: deque[tuple[Any, ...]] = deque()

    def log_metric(self, name: str, value: float, step: int | None = None) -> None:
        self.records.append((name, value, step))


# One timing function per variant, each with its own call site: a call site shared by several
# types would make the interpreter's inline caches (3.11+) flip between them.
def time_apprun(obj: AppRun, steps: range) -> int:
    value = 0.25
    t0 = perf_ns()
    for step in steps:
        obj.log_metric("loss", value, step)
    return perf_ns() - t0


def time_bare(obj: BareDeque, steps: range) -> int:
    value = 0.25
    t0 = perf_ns()
    for step in steps:
        obj.log_metric("loss", value, step)
    return perf_ns() - t0


def time_bare_no_time(obj: BareDequeNoTime, steps: range) -> int:
    value = 0.25
    t0 = perf_ns()
    for step in steps:
        obj.log_metric("loss", value, step)
    return perf_ns() - t0


def time_empty(steps: range) -> int:
    t0 = perf_ns()
    for _ in steps:
        pass
    return perf_ns() - t0


def bench_calls(factory: BackendFactory, rounds: int, calls: int, drain: bool) -> dict[str, Any]:
    """Alternates rounds of ``calls`` calls of each variant (in a new random order each round)
    and compares the median cost per call, net of the empty loop's cost.

    The AppRun's flusher thread runs throughout. With ``drain``, ``flush()`` delivers each
    round's records between rounds, outside the timed region, so that a timed round never
    pays for another round's delivery. Without it, the flusher drains on its own schedule
    (every ``batch_size`` records or ``flush_interval``) while rounds run, competing for the
    GIL as it would in a real job; the medians show the typical call.
    """
    backend = factory.new()
    run = AppRun("bench-calls", [backend])
    bare = BareDeque()
    bare_nt = BareDequeNoTime()
    steps = range(calls)
    variants: list[tuple[str, Callable[[range], int]]] = [
        ("AppRun.log_metric", lambda steps: time_apprun(run, steps)),
        ("bare deque append (with time.time())", lambda steps: time_bare(bare, steps)),
        ("bare deque append (no timestamp)", lambda steps: time_bare_no_time(bare_nt, steps)),
        ("empty loop", time_empty),
    ]
    # Warm up: starts the run's flusher, specializes the code.
    for _, timed in variants:
        timed(steps)
    run.flush()
    factory.forget(backend)
    samples: dict[str, list[float]] = {name: [] for name, _ in variants}
    rng = random.Random(0)
    for r in range(rounds):
        for name, timed in rng.sample(variants, len(variants)):
            samples[name].append(timed(steps) / calls)
        bare.records.clear()
        bare_nt.records.clear()
        if drain:
            run.flush()
            factory.forget(backend)
        elif r % 20 == 19:
            factory.forget(backend)  # racy with the flusher but harmless: keeps memory flat
    t0 = perf_ns()
    report = run.close()
    close_ms = (perf_ns() - t0) / 1e6

    empty = median(samples["empty loop"])
    med = {name: median(xs) for name, xs in samples.items()}
    net = {name: med[name] - empty for name in med if name != "empty loop"}
    apprun, bare_t, bare_nt_t = (net[name] for name, _ in variants[:3])
    return {
        "backend": factory.kind,
        "drained_between_rounds": drain,
        "rounds": rounds,
        "calls_per_round": calls,
        "median_ns_per_call_gross": med,
        "median_ns_per_call_net": net,
        "ratio_vs_bare": apprun / bare_t,
        "ratio_vs_bare_no_timestamp": apprun / bare_nt_t,
        "ratio_vs_bare_gross": med["AppRun.log_metric"] / med[variants[1][0]],
        "close_ms": close_ms,
        "close_ok": report.ok,
        "delivered": report.delivered,
    }


# ---------------------------------------------------------------------------------------------
# 2. loop: a CPU-bound training loop, with and without logging


def work(n: int) -> float:
    """Pure-Python arithmetic standing in for a training step."""
    acc = 0.0
    x = 1.0
    for i in range(n):
        x = x * 1.000001 + i * 1e-9
        acc += x
    return acc / n


def calibrate(step_us: float) -> int:
    """The ``n`` for which ``work(n)`` takes about ``step_us`` microseconds here, now: the
    median of many short tries, rescaled three times (the machine's speed varies with load)."""
    n = 1000
    for _ in range(4):
        ts = []
        for _ in range(100):
            t0 = perf_ns()
            work(n)
            ts.append(float(perf_ns() - t0))
        n = max(1, round(n * step_us * 1e3 / median(ts)))
    return n


def loop_plain(run: AppRun | None, start: int, steps: int, n: int) -> float:
    total = 0.0
    for step in range(start, start + steps):
        loss = work(n)
        acc, lr, grad = loss * 0.5, 1e-3 / (step + 1), loss * 2.0
        total += loss + acc + lr + grad
    return total


def loop_log_metrics(run: AppRun | None, start: int, steps: int, n: int) -> float:
    assert run is not None
    total = 0.0
    for step in range(start, start + steps):
        loss = work(n)
        acc, lr, grad = loss * 0.5, 1e-3 / (step + 1), loss * 2.0
        total += loss + acc + lr + grad
        run.log_metrics({"loss": loss, "acc": acc, "lr": lr, "grad_norm": grad}, step=step)
    return total


def loop_log_metric(run: AppRun | None, start: int, steps: int, n: int) -> float:
    assert run is not None
    total = 0.0
    for step in range(start, start + steps):
        loss = work(n)
        acc, lr, grad = loss * 0.5, 1e-3 / (step + 1), loss * 2.0
        total += loss + acc + lr + grad
        run.log_metric("loss", loss, step)
        run.log_metric("acc", acc, step)
        run.log_metric("lr", lr, step)
        run.log_metric("grad_norm", grad, step)
    return total


_bare_records: deque[tuple[Any, ...]] = deque()


def loop_bare_append(run: AppRun | None, start: int, steps: int, n: int) -> float:
    """The issue's baseline in the loop: the same 4 tuples ``log_metric`` keeps, appended to a
    bare deque (``time.time()`` each), emptied at the end of the round as a flush would."""
    append, now = _bare_records.append, time.time
    total = 0.0
    for step in range(start, start + steps):
        loss = work(n)
        acc, lr, grad = loss * 0.5, 1e-3 / (step + 1), loss * 2.0
        total += loss + acc + lr + grad
        append(("loss", loss, step, now()))
        append(("acc", acc, step, now()))
        append(("lr", lr, step, now()))
        append(("grad_norm", grad, step, now()))
    _bare_records.clear()
    return total


LoopFn = Callable[[AppRun | None, int, int, int], float]
METRICS_PER_STEP = 4
BARE_APPEND = "bare deque.append x 4 per step"


def bootstrap_ci(xs: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of ``xs``."""
    rng = random.Random(seed)
    meds = sorted(median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


async def _hold(release: threading.Event, held: threading.Event) -> None:
    held.set()
    release.wait()  # blocks the tracker loop's thread on purpose: no flusher wake-ups


@contextmanager
def tracker_loop_paused() -> Iterator[None]:
    """Blocks the process's tracker loop (benchmark only): the flusher neither wakes nor
    delivers meanwhile, as if no tracker ran. Records wait in their buffers."""
    release, held = threading.Event(), threading.Event()
    runtime().loop.submit(_hold, release, held)
    held.wait()
    try:
        yield
    finally:
        release.set()


def delivery_us_per_record(factory: BackendFactory, reps: int) -> dict[str, float]:
    """What the flusher spends per record: ``close()`` of a run holding just under one batch
    (default ``batch_size``, so the flusher has not started on it), less ``close()`` of a run
    holding one record, divided by the records. Measured in the process's CPU time (the
    caller waits, so that is the flusher's work, which holds the GIL), and by the wall clock."""
    points = RunOptions().batch_size // METRICS_PER_STEP - 1
    records = points * METRICS_PER_STEP
    times: dict[tuple[bool, str], list[float]] = {
        (full, clock): [] for full in (True, False) for clock in ("cpu", "wall")
    }
    for i in range(reps):
        for full in (True, False):
            run = AppRun(f"bench-delivery-{i}-{full}", [factory.new()])
            run.add_metadata(rep=i)
            run.flush()  # started and idle
            if full:
                for step in range(points):
                    for name in ("loss", "acc", "lr", "grad_norm"):
                        run.log_metric(name, 0.5, step)
            else:
                run.add_metadata(rep=i)
            c0, t0 = cpu_ns(), perf_ns()
            run.close()
            times[full, "wall"].append(float(perf_ns() - t0))
            times[full, "cpu"].append(float(cpu_ns() - c0))
    out = {"records": float(records)}
    for clock in ("cpu", "wall"):
        fixed = median(times[False, clock])
        out[f"{clock}_us_per_record"] = (median(times[True, clock]) - fixed) / 1e3 / records
        out[f"{clock}_close_fixed_ms"] = fixed / 1e6
    return out


def bench_loop(
    factory: BackendFactory, total_steps: int, round_steps: int, step_us: float
) -> dict[str, Any]:
    """A CPU-bound training loop of ``total_steps`` steps per variant, cut into rounds of
    ``round_steps`` steps, the variants in a new random order each round: no logging;
    ``log_metrics`` of 4 metrics per step; 4 ``log_metric`` calls per step; and, for
    reference, the same 4 tuples appended to a bare deque (the floor of keeping records at
    all), and no logging with the tracker loop paused (no flusher thread waking at all).

    Each logging variant writes to one ``AppRun`` (default options) for the whole benchmark,
    as a long job would; its flusher delivers in the background on its own schedule, and
    each of its rounds ends with ``flush()`` inside the timed region: a round pays for the
    delivery of its own records (the flusher's GIL share), never for another round's, and
    the no-logging round after it finds nothing left to deliver. Rounds are long (about half
    a second: the flusher cuts a full batch of its own inside each), so that the one extra
    flush per round is a small part of them. A round is timed by the
    wall clock (the target) and by the process's CPU time (all threads). Slowdowns are
    medians of per-round ratios to the same round's no-logging loop: adjacent rounds cancel
    the load of other tenants of the machine."""
    n = calibrate(step_us)
    base, paused = "no logging", "no logging, tracker loop paused"
    variants: list[tuple[str, LoopFn, bool]] = [
        (base, loop_plain, False),
        ("log_metrics (4 per step)", loop_log_metrics, True),
        ("4 x log_metric per step", loop_log_metric, True),
        (BARE_APPEND, loop_bare_append, False),
        (paused, loop_plain, False),
    ]
    runs: dict[str, AppRun] = {}
    for name, _, logs in variants:
        if logs:
            runs[name] = AppRun(f"bench-loop-{name}", [factory.new()])
            runs[name].add_metadata(variant=name)  # a job records its config first
            runs[name].flush()
    wall: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    cpu: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    rounds = max(1, total_steps // round_steps)
    rng = random.Random(1)
    all_ok = True
    for r in range(-2, rounds):  # two warm-up rounds
        for name, fn, _ in rng.sample(variants, len(variants)):
            run = runs.get(name)
            with tracker_loop_paused() if name == paused else nullcontext():
                c0, t0 = cpu_ns(), perf_ns()
                fn(run, (r + 2) * round_steps, round_steps, n)
                if run is not None:
                    all_ok = run.flush().ok and all_ok
                t1, c1 = perf_ns(), cpu_ns()
            if r >= 0:
                wall[name].append(float(t1 - t0))
                cpu[name].append(float(c1 - c0))
    for run in runs.values():
        report = run.close()
        expected = 1 + METRICS_PER_STEP * (rounds + 2) * round_steps
        all_ok = all_ok and report.ok and report.delivered == expected
    delivery = delivery_us_per_record(factory, 9)

    base_med = median(wall[base])
    step_us_measured = base_med / round_steps / 1e3
    out: dict[str, Any] = {
        "backend": factory.kind,
        "rounds": rounds,
        "round_steps": round_steps,
        "steps_per_variant": rounds * round_steps,
        "work_n": n,
        "step_us_measured": step_us_measured,
        "delivery": delivery,
        "delivery_pct_per_step": (
            METRICS_PER_STEP * delivery["cpu_us_per_record"] / step_us_measured * 100
        ),
        "all_delivered": all_ok,
        "variants": {},
    }
    for name, _, logs in variants[1:]:
        paired = [v / b for v, b in zip(wall[name], wall[base])]
        paired_cpu = [v / b for v, b in zip(cpu[name], cpu[base])]
        lo, hi = bootstrap_ci(paired)
        entry: dict[str, Any] = {
            "slowdown_pct": (median(paired) - 1) * 100,
            "slowdown_pct_ci95": [(lo - 1) * 100, (hi - 1) * 100],
            "slowdown_pct_cpu": (median(paired_cpu) - 1) * 100,
            "slowdown_pct_ratio_of_sums": (sum(wall[name]) / sum(wall[base]) - 1) * 100,
            "logs": logs,
        }
        if logs:
            # Against the loop with the tracker loop paused: as if there were no tracker.
            vs_none = median([v / p for v, p in zip(wall[name], wall[paused])])
            entry["slowdown_pct_vs_no_tracker"] = (vs_none - 1) * 100
            # Against the same records appended to a bare deque: what the tracker adds over
            # keeping them at all (allocating 4 tuples and timestamps per step is not free).
            vs_bare = median([v / b for v, b in zip(wall[name], wall[BARE_APPEND])])
            entry["slowdown_pct_vs_bare_append"] = (vs_bare - 1) * 100
        out["variants"][name] = entry
    return out


# ---------------------------------------------------------------------------------------------
# 2b. worker: the tracker's own CPU per record, by stage

# The stages of the worker's path that a record takes, as (stage, module, attribute): the
# functions are wrapped in this process only (benchmark-only: the shipped code has no timers),
# and a missing one is skipped, so that an older version of the package runs here too.
# Wrapped functions run once per batch (or per file), so the timers cost nothing per record.
WORKER_STAGES: list[tuple[str, str, str]] = [
    ("drain", "async_tracker.ingress", "Ingress.drain"),
    ("drain", "async_tracker.ingress", "Packed.take"),
    ("drain", "async_tracker.ingress", "Packed.take_columns"),
    ("cut", "async_tracker.pipeline.cutter", "Cutter.cut"),
    ("cut", "async_tracker.pipeline.cutter", "Cutter.cut_columns"),
    ("group", "async_tracker.backend.fsspec.writer", "_columns_by_name"),
    ("group", "async_tracker.backend.fsspec.parquet", "row_columns"),
    ("encode", "async_tracker.backend.fsspec.parquet", "encode_segment"),
    ("encode", "async_tracker.backend.fsspec.metricfiles", "segment_digest"),
    ("summary", "async_tracker.backend.fsspec.writer", "summarize_columns"),
    ("summary", "async_tracker.backend.fsspec.writer", "summarize_batch"),
    ("summary", "async_tracker.store.summary", "WriterSummary.with_batch"),
    ("summary", "async_tracker.backend.fsspec.writer", "_encode_json"),
    ("write", "async_tracker.backend.fsspec.storage", "_Storage._put_many_sync"),
    # At the run's end: its segments compacted into one file, and that file's overview.
    ("compact", "async_tracker.backend.fsspec.parquet", "compact"),
    ("overview", "async_tracker.backend.fsspec.parquet", "overview"),
]


def _timed(stage: str, fn: Callable[..., Any], acc: dict[str, int]) -> Callable[..., Any]:
    """``fn`` adding its thread's CPU time to ``acc[stage]`` (on whichever thread runs it).
    A call nested in another stage's is counted in its own stage only."""
    active = threading.local()

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if getattr(active, "on", False):
            return fn(*args, **kwargs)
        active.on = True
        t0 = time.thread_time_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[stage] += time.thread_time_ns() - t0
            active.on = False

    return wrapper


def install_stage_timers(acc: dict[str, int]) -> list[str]:
    """Wraps :data:`WORKER_STAGES` (benchmark only); returns those found."""
    import importlib

    found = []
    for stage, module_name, attr in WORKER_STAGES:
        try:
            owner: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part, None)
        fn = getattr(owner, name, None) if owner is not None else None
        if fn is None or not callable(fn):
            continue
        acc.setdefault(stage, 0)
        setattr(owner, name, _timed(stage, fn, acc))
        found.append(f"{module_name}:{attr}")
    return found


IDLE_S = 2.0


def bench_worker(
    factory: BackendFactory, steps: int, step_us: float, stages: bool
) -> dict[str, Any]:
    """The worker's CPU per record: a loop of ``steps`` steps of ~``step_us`` of pure-Python
    work logging 4 metrics per step (``log_metric``) into one run, then ``close()``. The
    worker's share is the process's CPU time less the logging thread's: the tracker loop,
    its worker threads and the spool thread, all of whose Python holds the GIL that the
    training loop then waits for. With ``stages``, each stage's thread CPU (see
    :data:`WORKER_STAGES`); "other" is the rest (the event loop, lanes, scheduling)."""
    acc: dict[str, int] = {}
    wrapped: list[str] = []
    if stages:
        # The codec's modules load at the first write, in a worker thread; loaded here first,
        # so that their functions are wrapped before the first batch.
        with suppress(ImportError):
            import async_tracker.backend.fsspec.parquet  # noqa: F401
        wrapped = install_stage_timers(acc)
    n = calibrate(step_us)
    run = AppRun("bench-worker", [factory.new()])
    run.add_metadata(variant="worker")
    run.flush()
    gc_ns = [0]
    gc_start = threading.local()

    def gc_timer(phase: str, info: dict[str, int]) -> None:
        # The collections that other threads run: triggered by whichever thread allocates
        # past the threshold, and paid by it, whoever made the garbage.
        if threading.current_thread() is threading.main_thread():
            return
        if phase == "start":
            gc_start.t = time.thread_time_ns()
        elif hasattr(gc_start, "t"):
            gc_ns[0] += time.thread_time_ns() - gc_start.t

    # What the tracker's threads spend with an open run and nothing logged (its wake-ups):
    # a cost per second, not per record, which the loop's figure includes.
    i0, w0 = cpu_ns(), perf_ns()
    time.sleep(IDLE_S)
    idle_ms_per_s = (cpu_ns() - i0) / 1e6 / ((perf_ns() - w0) / 1e9)
    for key in acc:
        acc[key] = 0
    gc.callbacks.append(gc_timer)
    c0, m0, t0 = cpu_ns(), time.thread_time_ns(), perf_ns()
    for step in range(steps):
        loss = work(n)
        run.log_metric("loss", loss, step)
        run.log_metric("acc", loss * 0.5, step)
        run.log_metric("lr", 1e-3 / (step + 1), step)
        run.log_metric("grad_norm", loss * 2.0, step)
    ce, me, te = cpu_ns(), time.thread_time_ns(), perf_ns()
    report = run.close()
    c1, m1 = cpu_ns(), time.thread_time_ns()
    gc.callbacks.remove(gc_timer)
    records = steps * METRICS_PER_STEP
    worker = (c1 - c0) - (m1 - m0)
    per_stage = {k: v / 1e3 / records for k, v in acc.items()}
    if stages:
        per_stage["other"] = worker / 1e3 / records - sum(per_stage.values())
    return {
        "backend": factory.kind,
        "steps": steps,
        "records": records,
        "step_us_measured": (te - t0) / 1e3 / steps,
        "worker_us_per_record": worker / 1e3 / records,
        # While the loop ran (before close()): what the training loop shared the GIL with.
        "worker_us_per_record_in_loop": ((ce - c0) - (me - m0)) / 1e3 / records,
        "close_us_per_record": ((c1 - ce) - (m1 - me)) / 1e3 / records,
        "gc_us_per_record": gc_ns[0] / 1e3 / records,
        "idle_ms_per_s": idle_ms_per_s,
        "records_per_s": records / ((te - t0) / 1e9),
        "main_thread_us_per_step": (me - m0) / 1e3 / steps,
        "stages_us_per_record": per_stage,
        "wrapped": wrapped,
        "delivered_all": report.ok and report.delivered == records + 1,
    }


# ---------------------------------------------------------------------------------------------
# 3. blocking: a third-party TrackerBase that takes 50 ms per call


class SlowTracker(TrackerBase):
    """A third-party blocking backend: every method sleeps ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.calls = 0
        self._metadata: dict[str, object] = {}
        self._artifacts: dict[str, TrackerArtifact] = {}

    def _slow(self) -> None:
        self.calls += 1
        time.sleep(self.delay)

    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        self._slow()
        self._artifacts[name] = TrackerArtifact(name, path, metadata)

    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        self._slow()
        return dict(self._artifacts)

    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        self._slow()
        self._metadata.update(kwargs)

    def metadata(self, run_id: str) -> Mapping[str, object]:
        self._slow()
        return dict(self._metadata)

    def add_source(self, run_id: str, source_id: str, artifact_name: str | None = None) -> None:
        self._slow()

    def sources(self, run_id: str, artifact_name: str | None = None) -> list[TrackerSource]:
        self._slow()
        return []

    def lineage(self, run_id: str) -> Lineage:
        self._slow()
        return Lineage(run_id)

    def run_ids(self, **kwargs: str) -> list[str]:
        self._slow()
        return []


@contextmanager
def quiet_logger(name: str) -> Iterator[None]:
    """Silences the expected 'backend takes no metrics' warning of a TrackerBase backend."""
    import logging

    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def bench_blocking(run_id: str, writes: int, delay: float, close_timeout: float) -> dict[str, Any]:
    """``writes`` calls cycling add_metadata, add_artifact (distinct names) and log_metric,
    back to back, each timed; then close(), timed, with its FlushReport."""
    slow = SlowTracker(delay)
    with quiet_logger("async_tracker.run"):
        run = AppRun(run_id, [slow], close_timeout=close_timeout)
    per_call: list[float] = []
    kinds = {"add_metadata": 0, "add_artifact": 0, "log_metric": 0}
    for i in range(writes):
        t0 = perf_ns()
        if i % 3 == 0:
            run.add_metadata(**{f"key_{i}": i, "step": i})
        elif i % 3 == 1:
            run.add_artifact(f"checkpoint-{i}", f"/tmp/ckpt/{i}.pt", {"step": i})
        else:
            run.log_metric("loss", 1.0 / (i + 1), i)
        per_call.append((perf_ns() - t0) / 1e6)
        kinds[("add_metadata", "add_artifact", "log_metric")[i % 3]] += 1
    t0 = perf_ns()
    report = run.close()
    close_s = (perf_ns() - t0) / 1e9
    return {
        "writes": writes,
        "mix": kinds,
        "backend_delay_ms": delay * 1e3,
        "blocked_ms_total": sum(per_call),
        "blocked_ms_first_call": per_call[0],
        "blocked_ms_rest": sum(per_call[1:]),
        "blocked_ms_max_after_first": max(per_call[1:], default=0.0),
        "backend_calls": slow.calls,
        "close_s": close_s,
        "close_timeout_s": close_timeout,
        "report": {
            "ok": report.ok,
            "delivered": report.delivered,
            "pending": report.pending,
            "spooled": report.spooled,
            "dropped": report.dropped,
            "errors": dict(report.errors),
            "timed_out": report.timed_out,
        },
    }


# ---------------------------------------------------------------------------------------------
# Output


def verdict(ok: bool) -> str:
    return "OK" if ok else "OVER TARGET"


def print_report(res: dict[str, Any]) -> None:
    m = res["machine"]
    print(
        f"machine: {m['cpu_count']} CPUs, {m['implementation']} {m['python']}, {m['platform']}, "
        f"load average {m['load_average_1min']} at start"
    )
    print(f"command: {res['command']}")
    print()
    for key in ("blocking_cold", "blocking_warm"):
        if key not in res:
            continue
        b = res[key]
        rep = b["report"]
        first = (
            "starts the tracker loop: cold process"
            if key == "blocking_cold"
            else "tracker loop already running"
        )
        print(
            f"[{key}] {b['writes']} writes {b['mix']} over a TrackerBase sleeping "
            f"{b['backend_delay_ms']:.0f} ms per call"
        )
        print(
            f"  caller blocked, all {b['writes']} calls: {b['blocked_ms_total']:8.3f} ms  "
            f"(target < {TARGET_BLOCKED_MS:.0f} ms: "
            f"{verdict(b['blocked_ms_total'] < TARGET_BLOCKED_MS)})"
        )
        print(f"    first call ({first}): {b['blocked_ms_first_call']:.3f} ms")
        print(
            f"    the other {b['writes'] - 1}: {b['blocked_ms_rest']:.3f} ms "
            f"(slowest {b['blocked_ms_max_after_first']:.3f} ms)"
        )
        print(
            f"  close(): {b['close_s']:.3f} s, {b['backend_calls']} backend calls; report: "
            f"ok={rep['ok']} delivered={rep['delivered']} pending={rep['pending']} "
            f"spooled={rep['spooled']} dropped={rep['dropped']} errors={rep['errors']}"
        )
        print("  (a TrackerBase has no metric method: its lane skips the log_metric records)")
        print()
    for key in ("calls", "calls_concurrent"):
        if key not in res:
            continue
        c = res[key]
        how = (
            "flusher thread running; each round's records delivered between rounds, untimed"
            if c["drained_between_rounds"]
            else "flusher thread draining concurrently on its own schedule (GIL contention)"
        )
        print(
            f"[{key}] cost per call, {c['rounds']} alternated rounds x {c['calls_per_round']} "
            f"calls, backend {c['backend']}; {how}"
        )
        print(f"  {'variant':<40}{'median ns/call':>16}{'net of loop':>14}")
        for name, gross in c["median_ns_per_call_gross"].items():
            net = c["median_ns_per_call_net"].get(name)
            net_s = f"{net:14.1f}" if net is not None else ""
            print(f"  {name:<40}{gross:16.1f}{net_s}")
        ok = c["ratio_vs_bare"] <= TARGET_CALL_RATIO
        print(
            f"  log_metric / bare append (medians, net): {c['ratio_vs_bare']:.2f}x  "
            f"(target <= {TARGET_CALL_RATIO:.1f}x: {verdict(ok)})"
        )
        print(
            f"  log_metric / bare append without timestamp: "
            f"{c['ratio_vs_bare_no_timestamp']:.2f}x;  gross (loop included): "
            f"{c['ratio_vs_bare_gross']:.2f}x"
        )
        print()
    if "loop" in res:
        lo = res["loop"]
        d = lo["delivery"]
        print(
            f"[loop] {lo['steps_per_variant']} steps per variant of ~{lo['step_us_measured']:.0f} "
            f"us pure-Python work, in {lo['rounds']} rounds of {lo['round_steps']} steps, "
            f"variants in random order;\n  each logging variant writes to one AppRun (default "
            f"options, backend {lo['backend']}) whose flusher delivers in the background, and "
            f"ends each round\n  with flush(), timed: a round pays for its own records' delivery"
        )
        print(
            f"  {'variant':<32}{'slowdown':>9}{'95% CI':>17}{'cpu':>8}{'vs none':>9}"
            f"{'vs bare':>9}"
        )
        for name, v in lo["variants"].items():
            ci = "[{:+.2f}, {:+.2f}]".format(*v["slowdown_pct_ci95"])
            line = f"  {name:<32}{v['slowdown_pct']:+8.2f}%{ci:>17}{v['slowdown_pct_cpu']:+7.2f}%"
            if v["logs"]:
                line += f"{v['slowdown_pct_vs_no_tracker']:+8.2f}%"
                line += f"{v['slowdown_pct_vs_bare_append']:+8.2f}%"
            print(line)
        print(
            "  slowdown: median over rounds of (round's loop, delivery included / the same "
            "round's loop\n    without logging) - 1, wall clock (the tracker loop idle but "
            "running in the no-logging round)\n"
            "  cpu: the same in the process's CPU time (all threads)\n"
            "  vs none: against the loop without logging with the tracker loop paused (no "
            "tracker at all)\n"
            f"  vs bare: against the loop appending the same tuples to a bare deque (the "
            f"baseline of the\n    call benchmark), each round's records dropped at its end\n"
            f"  delivery alone: {d['cpu_us_per_record']:.2f} us of flusher CPU per record "
            f"({d['wall_us_per_record']:.2f} us wall), measured by close() of a run holding "
            f"{d['records']:.0f} records,\n"
            f"    = {lo['delivery_pct_per_step']:.2f}% of a step at 4 records per step "
            "(included in the slowdown above)"
        )
        logging = [v for v in lo["variants"].values() if v["logs"]]
        worst = max(v["slowdown_pct"] for v in logging)
        ok = worst <= TARGET_LOOP_SLOWDOWN_PCT
        print(
            f"  target <= {TARGET_LOOP_SLOWDOWN_PCT:.0f}%: {verdict(ok)}"
            f"; every record delivered: {lo['all_delivered']}"
        )
        print()


def _child_args(args: argparse.Namespace, part: str, out: str) -> list[str]:
    """This script's arguments for one part, measured in a subprocess."""
    return [
        "--only", part, "--backend", args.backend, "--step-us", str(args.step_us),
        "--loop-steps", str(args.loop_steps), "--round-steps", str(args.round_steps),
        "--worker-steps", str(args.worker_steps), "--json", out,
    ]  # fmt: skip


def _spread(xs: list[float]) -> str:
    return f"{median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]"


def compare_with_baseline(
    args: argparse.Namespace, parts: list[str], argv: list[str] | None
) -> int:
    """Each part measured in fresh subprocesses, this tree's and the baseline's in turn
    (who goes first alternates), ``--alt-rounds`` times: the machine's load moves both
    alike. Prints medians and ranges over the rounds, and the ratio of the medians."""
    import subprocess

    trees = {"this": os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
             "base": os.path.abspath(args.baseline)}  # fmt: skip
    script = os.path.abspath(__file__)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        part: {"this": [], "base": []} for part in parts
    }
    print(
        f"machine: {machine()}\ncommand: python -m benchmarks.bench_core "
        f"{' '.join(sys.argv[1:] if argv is None else argv)}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-core-alt-") as tmp:
        for r in range(args.alt_rounds):
            for part in parts:
                order = ["this", "base"] if r % 2 == 0 else ["base", "this"]
                for who in order:
                    out = os.path.join(tmp, f"{part}-{who}-{r}.json")
                    env = {**os.environ, "PYTHONPATH": trees[who]}
                    cmd = [sys.executable, script, *_child_args(args, part, out)]
                    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
                    with open(out) as f:
                        results[part][who].append(json.load(f)[part])
                    print(f"  round {r + 1}/{args.alt_rounds}: {part} ({who}) done", flush=True)
    print(f"load average now: {os.getloadavg()[0] if hasattr(os, 'getloadavg') else None}")
    print(f"this tree: {trees['this']}\nbaseline:  {trees['base']}\n")
    figures: dict[str, Any] = {}
    if "worker" in results:
        this_w, base_w = results["worker"]["this"], results["worker"]["base"]
        print(
            f"[worker] CPU of everything but the logging thread per record, "
            f"{args.worker_steps} steps x 4 log_metric, backend {args.backend}, "
            f"median [min, max] of {args.alt_rounds} rounds, us per record"
        )
        steps = [w["step_us_measured"] for w in this_w + base_w]
        print(f"  step measured: {_spread(steps)} us")
        keys = list(dict.fromkeys([*base_w[0]["stages_us_per_record"],
                                   *this_w[0]["stages_us_per_record"]]))  # fmt: skip
        print(f"  {'':<14}{'this':>30}{'baseline':>30}{'ratio':>8}")
        rows = [
            ("total", "worker_us_per_record", None),
            ("during loop", "worker_us_per_record_in_loop", None),
            ("in close()", "close_us_per_record", None),
            ("gc (within)", "gc_us_per_record", None),
            ("idle ms/s", "idle_ms_per_s", None),
            ("records/s", "records_per_s", None),
        ] + [(k, None, k) for k in keys]
        for label, top, stage in rows:

            def pick(w: dict[str, Any], top: str | None = top, stage: str | None = stage) -> float:
                if top is not None:
                    return float(w[top])
                return float(w["stages_us_per_record"].get(stage, 0.0))

            a, b = [pick(w) for w in this_w], [pick(w) for w in base_w]
            ratio = median(a) / median(b) if median(b) else float("nan")
            print(f"  {label:<14}{_spread(a):>30}{_spread(b):>30}{ratio:7.2f}x")
            figures[f"worker.{label}"] = {"this": a, "base": b, "ratio": ratio}
        print(f"  every record delivered: {all(w['delivered_all'] for w in this_w + base_w)}")
        print()
    if "loop" in results:
        this_l, base_l = results["loop"]["this"], results["loop"]["base"]
        print(
            f"[loop] slowdown of a loop of ~{args.step_us:.0f} us steps logging 4 metrics per "
            f"step (each subprocess: the median of its rounds), median [min, max] over "
            f"{args.alt_rounds} subprocess rounds, %"
        )
        steps = [lo["step_us_measured"] for lo in this_l + base_l]
        print(f"  step measured: {_spread(steps)} us")
        for key, what in (
            ("slowdown_pct", "wall clock"),
            ("slowdown_pct_cpu", "process CPU time"),
            ("slowdown_pct_vs_bare_append", "wall clock, against the bare deque appends"),
        ):
            print(f"  {what}:")
            for name in this_l[0]["variants"]:
                if key not in this_l[0]["variants"][name]:
                    continue
                a = [lo["variants"][name][key] for lo in this_l]
                b = [lo["variants"][name][key] for lo in base_l]
                print(f"    {name:<34}this {_spread(a):>26}   baseline {_spread(b):>26}")
                figures[f"loop.{key}.{name}"] = {"this": a, "base": b}
        print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "figures": figures, "raw": results}, f, indent=2)
    return 0


def print_worker(w: dict[str, Any]) -> None:
    print(
        f"[worker] {w['steps']} steps of ~{w['step_us_measured']:.0f} us x 4 log_metric, "
        f"backend {w['backend']}, then close(): CPU of every thread but the logging one"
    )
    print(
        f"  per record: {w['worker_us_per_record']:.3f} us (during the loop "
        f"{w['worker_us_per_record_in_loop']:.3f}, in close() {w['close_us_per_record']:.3f}; "
        f"garbage collections of the worker's threads, in the stages: "
        f"{w['gc_us_per_record']:.3f}); by stage (thread CPU):"
    )
    for stage, us in w["stages_us_per_record"].items():
        print(f"    {stage:<10}{us:8.3f} us")
    print(
        f"  idle (a run open, nothing logged): {w['idle_ms_per_s']:.2f} ms of CPU per second; "
        f"the loop logged {w['records_per_s']:.0f} records per second"
    )
    print(f"  every record delivered: {w['delivered_all']}")
    print()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_core",
        description="async_tracker core benchmarks, as ratios to same-process baselines.",
    )
    p.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    p.add_argument(
        "--only",
        choices=["blocking", "calls", "loop", "worker"],
        action="append",
        help="run only these benchmarks (repeatable)",
    )
    p.add_argument(
        "--backend",
        choices=["memory", "fsspec"],
        default="memory",
        help="backend of the calls and loop benchmarks (fsspec: a temp directory)",
    )
    p.add_argument("--call-rounds", type=int, default=300, help="alternated rounds (calls)")
    p.add_argument("--calls", type=int, default=1000, help="log_metric calls per round")
    p.add_argument("--loop-steps", type=int, default=50000, help="training steps per loop variant")
    p.add_argument("--round-steps", type=int, default=2500, help="training steps per round")
    p.add_argument("--step-us", type=float, default=200.0, help="work per step, microseconds")
    p.add_argument("--writes", type=int, default=100, help="writes over the blocking backend")
    p.add_argument("--delay-ms", type=float, default=50.0, help="blocking backend delay")
    p.add_argument(
        "--close-timeout",
        type=float,
        default=30.0,
        help="close() timeout of the blocking benchmark, seconds",
    )
    p.add_argument(
        "--worker-steps", type=int, default=100_000, help="steps of the worker benchmark"
    )
    p.add_argument(
        "--baseline",
        metavar="PATH",
        help="also measure the loop and worker benchmarks on the package at PATH (another "
        "checkout), in subprocesses alternated with this tree's, and print both",
    )
    p.add_argument(
        "--alt-rounds", type=int, default=3, help="alternated subprocess rounds (--baseline)"
    )
    p.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    args = p.parse_args(argv)
    if args.quick:
        args.call_rounds, args.calls = 40, 500
        args.loop_steps, args.round_steps = 2000, 500
        args.worker_steps, args.alt_rounds = 5000, 1
    only = set(args.only or ["blocking", "calls", "loop", "worker"])
    if args.baseline:
        return compare_with_baseline(args, sorted(only & {"loop", "worker"}), argv)

    res: dict[str, Any] = {
        "machine": machine(),
        "command": " ".join(
            ["python -m benchmarks.bench_core", *(sys.argv[1:] if argv is None else argv)]
        ),
        "args": vars(args),
    }
    factory = BackendFactory(args.backend)
    try:
        if "blocking" in only:
            # First in the process, so that the first write also starts the tracker loop.
            blocking = (args.writes, args.delay_ms / 1e3, args.close_timeout)
            res["blocking_cold"] = bench_blocking("bench-blocking-cold", *blocking)
            res["blocking_warm"] = bench_blocking("bench-blocking-warm", *blocking)
        if "calls" in only:
            sizes = (args.call_rounds, args.calls)
            res["calls"] = bench_calls(factory, *sizes, drain=True)
            res["calls_concurrent"] = bench_calls(factory, *sizes, drain=False)
        if "loop" in only:
            res["loop"] = bench_loop(factory, args.loop_steps, args.round_steps, args.step_us)
        if "worker" in only:
            res["worker"] = bench_worker(factory, args.worker_steps, args.step_us, stages=True)
    finally:
        factory.cleanup()
    print_report(res)
    if "worker" in res:
        print_worker(res["worker"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
