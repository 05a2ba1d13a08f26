"""One tool's side of ``benchmarks.bench_peers``: run in that tool's own virtual environment.

    python benchmarks/peer_worker.py TOOL PHASE OUT_DIR STEPS WORK [URL]

Standard library plus the tool only: async_tracker is not installed in the peers' venvs. It
prints ``start`` before it imports the tool and ``setup`` once the tool is ready (the harness
reads the process tree's memory at both), and a JSON line with its figures at the end.

Phases:

* ``calls``: STEPS steps of 4 scalars, each call timed on its own in the caller's thread;
  then whatever the tool needs for everything to be durable (``close()``, ``finish()`` ...).
* ``loop``: STEPS steps of WORK iterations of pure-Python work (about 200 us) and 4 scalars;
  the same loop without logging runs in the same process before the tool is imported and
  again once it has made everything durable.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable

NAMES = ("loss", "acc", "lr", "grad_norm")
perf_ns = time.perf_counter_ns

Log = Callable[[str, float, int], None]


def work(n: int) -> int:
    """The CPU-bound part of a training step."""
    acc = 0
    for i in range(n):
        acc += i * i
    return acc


# -- each tool: set up, give a log function and a "make it durable" function ------------------


def tool_deque(out: str, url: str) -> tuple[Log, Callable[[], None]]:
    q: deque[tuple[str, float, int]] = deque()
    append = q.append

    def log(name: str, value: float, step: int) -> None:
        append((name, value, step))

    return log, lambda: None


def tool_async_tracker_fsspec(out: str, url: str) -> tuple[Log, Callable[[], None]]:
    import fsspec

    from async_tracker import AppRun
    from async_tracker.backend.fsspec import FsspecTracker

    run = AppRun(f"bench-{time.time_ns()}", [FsspecTracker(fsspec.filesystem("file"), out)])
    return run.log_metric, lambda: _check(run.close(600))


def tool_async_tracker_mlflow(out: str, url: str) -> tuple[Log, Callable[[], None]]:
    from async_tracker import AppRun
    from async_tracker.backend.mlflow import AsyncMLflowTracker

    run_id = f"bench-{time.time_ns()}"
    run = AppRun(run_id, [AsyncMLflowTracker("bench-async-tracker", url)])
    return run.log_metric, lambda: _check(run.close(600))


def _check(report: object) -> None:
    if not getattr(report, "ok", False):
        raise SystemExit(f"async_tracker did not deliver everything: {report}")


def tool_torchx_fsspec(out: str, url: str) -> tuple[Log, Callable[[], None]]:
    import fsspec
    from torchx.tracker.api import AppRun
    from torchx.tracker.backend.fsspec import FsspecTracker

    run = AppRun(f"bench-{time.time_ns()}", [FsspecTracker(fsspec.filesystem("file"), out)])
    add = run.add_metadata

    # torchx's tracker has no metrics: a scalar is a metadata key, written at once.
    def log(name: str, value: float, step: int) -> None:
        add(**{f"{name}/{step}": value})

    return log, lambda: None


def tool_mlflow_async(out: str, url: str) -> tuple[Log, Callable[[], None]]:
    os.environ["MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS"] = "1"
    import mlflow

    mlflow.set_tracking_uri(url)
    mlflow.set_experiment("bench-mlflow-async")
    mlflow.start_run()
    log_metric = mlflow.log_metric

    def log(name: str, value: float, step: int) -> None:
        log_metric(name, value, step=step, synchronous=False)

    def durable() -> None:
        mlflow.flush_async_logging()
        mlflow.end_run()

    return log, durable


def tool_tensorboardx(out: str, url: str) -> tuple[Log, Callable[[], None]]:
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(out)
    return writer.add_scalar, writer.close


def tool_wandb_offline(out: str, url: str) -> tuple[Log, Callable[[], None]]:
    import wandb

    run = wandb.init(mode="offline", dir=out, project="bench", settings=wandb.Settings(
        silent=True, console="off", x_disable_stats=True))
    wlog = run.log

    def log(name: str, value: float, step: int) -> None:
        wlog({name: value}, step=step)

    return log, run.finish


TOOLS = {
    "deque": tool_deque,
    "async_tracker-fsspec": tool_async_tracker_fsspec,
    "async_tracker-mlflow": tool_async_tracker_mlflow,
    "torchx-fsspec": tool_torchx_fsspec,
    "mlflow-async": tool_mlflow_async,
    "tensorboardX": tool_tensorboardx,
    "wandb-offline": tool_wandb_offline,
}


def value(step: int, i: int) -> float:
    return (step % 97) / (i + 1.0)


def phase_calls(log: Log, durable: Callable[[], None], steps: int) -> dict[str, float]:
    costs: list[int] = []
    append = costs.append
    start = perf_ns()
    for step in range(steps):
        for i, name in enumerate(NAMES):
            v = value(step, i)
            t = perf_ns()
            log(name, v, step)
            append(perf_ns() - t)
    calls_end = perf_ns()
    durable()
    end = perf_ns()
    costs.sort()
    return {
        "median_call_us": statistics.median(costs) / 1e3,
        "p99_call_us": costs[int(len(costs) * 0.99)] / 1e3,
        "calls_s": (calls_end - start) / 1e9,
        "durable_s": (end - start) / 1e9,
    }


def timed_loop(log: Log | None, steps: int, n: int) -> float:
    start = perf_ns()
    for step in range(steps):
        work(n)
        if log is not None:
            for i, name in enumerate(NAMES):
                log(name, value(step, i), step)
    return (perf_ns() - start) / 1e9


def phase_loop(
    log: Log, durable: Callable[[], None], steps: int, n: int, before: float
) -> dict[str, float]:
    logged = timed_loop(log, steps, n)
    durable()
    after = timed_loop(None, steps, n)
    bare = (before + after) / 2
    return {
        "bare_loop_s": bare,
        "logged_loop_s": logged,
        "slowdown_pct": 100 * (logged / bare - 1),
        "step_us": bare / steps * 1e6,
    }


def main() -> None:
    tool, phase, out, steps, n = sys.argv[1:6]
    url = sys.argv[6] if len(sys.argv) > 6 else ""
    print("start", flush=True)
    if phase == "loop":
        before = timed_loop(None, int(steps), int(n))
    log, durable = TOOLS[tool](out, url)
    print("setup", flush=True)
    if phase == "calls":
        result = phase_calls(log, durable, int(steps))
    else:
        result = phase_loop(log, durable, int(steps), int(n), before)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
