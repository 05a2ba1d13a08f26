"""A write is atomic with respect to signals: an exception raised between any two bytecodes
of a write (as a signal handler raises KeyboardInterrupt) leaves the record wholly accepted
or not at all, and the ingress consistent.

The exception is injected by a tracer at each opcode of the write in turn (``sys.settrace``
with ``f_trace_opcodes``), so every point of every write path is tried, deterministically.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

from async_tracker import AppRun
from async_tracker.backend.memory import InMemoryTracker
from tests.interrupts import interrupted_at

MakeRun = Callable[..., AppRun]


WRITES: dict[str, Callable[[AppRun, int], None]] = {
    "log_metric": lambda run, i: run.log_metric("m", float(i), step=i),
    "log_metric_slow_path": lambda run, i: run.log_metric("m", i, step=i),  # an int value
    "log_metric_no_step": lambda run, i: run.log_metric("auto", float(i)),
    "log_metrics": lambda run, i: run.log_metrics({"a": float(i), "b": float(i)}, step=i),
    "add_metadata": lambda run, i: run.add_metadata(k=i, nested={"x": [i]}),
    "add_artifact": lambda run, i: run.add_artifact(f"a{i}", f"/p/{i}", {"i": i}),
    "add_source": lambda run, i: run.add_source(f"parent-{i}", None),
}
SIZE = {"log_metrics": 2}


@pytest.mark.parametrize("write", list(WRITES))
def test_an_interrupt_at_any_bytecode_keeps_the_write_whole_or_absent(
    make_run: MakeRun, write: str
) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    run.add_metadata(start=True)  # the run is started: the hot path is the plain append
    ingress = run._ingress
    size = SIZE.get(write, 1)
    # One traced call first: Python 3.12.1 starts reporting opcode events for a code object
    # only from its next call after tracing begins.
    assert not interrupted_at(10**9, functools.partial(WRITES[write], run, 10**6))
    accepted = 1 + size
    k = 0
    while True:
        k += 1
        before = len(ingress)
        hit = interrupted_at(k, functools.partial(WRITES[write], run, k))
        added = len(ingress) - before
        # A whole write, or nothing of it: never a part of a log_metrics call.
        assert added in (0, size), (write, k, added)
        accepted += added
        if not hit:
            break
    assert k > 5  # the tracer did see the write's bytecodes
    report = run.flush()
    assert report.ok and report.delivered == accepted, (report, accepted)
