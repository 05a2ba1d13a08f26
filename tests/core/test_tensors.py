"""Metric values that are tensors and numpy values (async_tracker/tensors.py).

The CUDA path (a copy to pinned memory, an event after it, the value read on the tracker loop
once the event completes) runs here on the CPU with a stand-in for the one thing that needs
a GPU, the event: the copy, the ingress, the wait in order, the drop at close are the real
ones. The test on a real GPU is skipped where there is none.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from async_tracker import AppRun, tensors
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.ingress import Packed
from async_tracker.runtime.loop import THREAD_NAME
from async_tracker.runtime.process import runtime
from async_tracker.tensors import DeferredValue
from tests.core.helpers import python_env
from tests.faulty import FaultyTracker, transient

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

MakeRun = Callable[..., AppRun]


class StandInEvent:
    """What a ``torch.cuda.Event`` does for the tracker: ``record`` on the caller's thread,
    ``query`` (never blocking) later. Completes when the test says so; waiting for it on
    any thread (``synchronize``) is the defect these tests exist to rule out."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.recorded_on: str | None = None
        self.queried_on: set[str] = set()
        self.fail: BaseException | None = None

    def record(self, stream: object = None) -> None:
        self.recorded_on = threading.current_thread().name

    def query(self) -> bool:
        self.queried_on.add(threading.current_thread().name)
        if self.fail is not None:
            raise self.fail
        return self.done.is_set()

    def synchronize(self) -> None:
        raise AssertionError("synchronize() was called")


@pytest.fixture
def device_events(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[StandInEvent]]:
    """CPU tensors take the CUDA path, each with a new StandInEvent (listed in call order)."""
    events: list[StandInEvent] = []

    def defer(tensor: Any) -> DeferredValue:
        events.append(StandInEvent())
        return tensors.copy_after(tensor, events[-1], pin=False)

    monkeypatch.setitem(tensors.DEFERRED_DEVICES, "cpu", defer)
    yield events
    for event in events:  # nothing left waiting for a test that failed half-way
        event.done.set()


def backend_metadata(mem: InMemoryTracker, run_id: str) -> dict[str, object]:
    return dict(runtime().loop.call(mem.metadata, run_id))


def values(mem: InMemoryTracker, run_id: str, name: str) -> list[tuple[int, float]]:
    return [(p.step, p.value) for p in mem.points(run_id, name)]


# -- read at once: CPU tensors and numpy values -------------------------------------------------
@pytest.mark.parametrize(
    "value, expected",
    [
        (torch.tensor(1.5), 1.5),
        (torch.tensor([2.5]), 2.5),
        (torch.tensor([[3.0]], dtype=torch.bfloat16), 3.0),
        (torch.tensor(7), 7.0),
        (torch.tensor(True), 1.0),
        (torch.tensor(0.25, requires_grad=True) * 2, 0.5),
        (torch.nn.Parameter(torch.tensor([4.0])), 4.0),
        (np.float32(0.5), 0.5),
        (np.int64(9), 9.0),
        (np.array(1.25), 1.25),
        (np.array([[6.0]]), 6.0),  # no DeprecationWarning (warnings are errors here)
    ],
    ids=[
        "0-d", "one-element", "bf16-2d", "int", "bool", "grad", "parameter",
        "np.float32", "np.int64", "np-0d", "np-2d",
    ],
)
def test_cpu_tensors_and_numpy_values_are_read_at_once(
    make_run: MakeRun, value: object, expected: float
) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    run.log_metric("m", value, step=3)  # type: ignore[arg-type]
    run.log_metrics({"n": value}, step=4)  # type: ignore[dict-item]
    assert run.flush().ok
    assert values(mem, "r", "m") == [(3, expected)]
    assert values(mem, "r", "n") == [(4, expected)]
    assert all(type(p.value) is float for p in mem.points("r", "m"))


@pytest.mark.parametrize(
    "value, message",
    [
        (torch.tensor([1.0, 2.0]), r"shape \(2,\) has 2 values"),
        (torch.zeros(0), r"shape \(0,\) has 0 values"),
        (torch.tensor(1.0, device="meta"), "meta device has no value"),
        (torch.tensor(1 + 2j), "complex"),
        (np.array([1.0, 2.0, 3.0]), r"shape \(3,\) has 3 values"),
        (np.array(["a"]), "not a number"),
    ],
    ids=["two-values", "empty", "meta", "complex", "np-three", "np-str"],
)
def test_tensors_without_one_real_value_are_refused_naming_the_metric(
    make_run: MakeRun, value: object, message: str
) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    with pytest.raises(TypeError, match=message) as info:
        run.log_metric("loss", value)  # type: ignore[arg-type]
    assert "'loss'" in str(info.value)
    with pytest.raises(TypeError, match="'bad'"):
        run.log_metrics({"good": torch.tensor(1.0), "bad": value})  # type: ignore[dict-item]
    run.log_metric("after", 1.0)
    assert run.flush().ok
    assert set(runtime().loop.call(mem.metrics, "r")) == {"after"}  # nothing of those calls


def test_importing_async_tracker_imports_neither_torch_nor_numpy() -> None:
    # Writes of every kind too: the type checks look in sys.modules, never import. Nor is
    # pyarrow loaded (the fsspec store's Parquet codec imports it at its first metric write).
    script = (
        "import sys, async_tracker\n"
        "from async_tracker.backend.memory import InMemoryTracker\n"
        "run = async_tracker.AppRun('r', [InMemoryTracker()])\n"
        "run.log_metric('m', 1.0); run.log_metric('m', 2); run.add_metadata(a={'b': [1]})\n"
        "assert run.close(10).ok\n"
        "print(sorted(m for m in ('torch', 'numpy', 'pyarrow') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env=python_env(), capture_output=True, text=True,
        timeout=60, check=True,
    )
    assert out.stdout.strip() == "[]", out.stderr


# -- the CUDA path, with a stand-in event ----------------------------------------------------------
def test_a_device_value_is_read_on_the_tracker_loop_once_its_event_completed(
    make_run: MakeRun, device_events: list[StandInEvent]
) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    loss = torch.tensor(1.5)
    run.log_metric("loss", loss)
    loss.add_(10.0)  # the value is the one at the call: the copy was queued before
    assert run.flush(timeout=0.2).pending == 1  # not read while the event is not done
    assert mem.points("r", "loss") == []
    device_events[0].done.set()
    assert run.flush(timeout=30).ok
    assert values(mem, "r", "loss") == [(0, 1.5)]
    event = device_events[0]
    assert event.recorded_on == threading.current_thread().name
    assert event.queried_on == {THREAD_NAME}  # never on the caller's thread


def test_device_values_keep_their_place_in_the_order_of_every_record(
    make_run: MakeRun, device_events: list[StandInEvent]
) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    run.add_metadata(phase="warmup")
    run.log_metric("loss", torch.tensor(1.0))  # step 0, waits for its device
    run.add_metadata(phase="train")
    run.log_metric("loss", 2.0)  # step 1: numbered after the one before, not before it
    run.log_metrics({"loss": torch.tensor(3.0), "lr": 0.1})  # step 2, a second device value
    report = run.flush(timeout=0.2)
    assert report.timed_out and report.pending == 5
    # Nothing from the first value still on its device on is delivered (what came before
    # it may be, or be on its way).
    assert backend_metadata(mem, "r") in ({}, {"phase": "warmup"})
    assert mem.points("r", "loss") == []
    device_events[1].done.set()  # the later value is ready first: still nothing moves
    assert run.flush(timeout=0.2).pending == 5
    device_events[0].done.set()
    assert run.flush(timeout=30).ok
    assert values(mem, "r", "loss") == [(0, 1.0), (1, 2.0), (2, 3.0)]
    assert values(mem, "r", "lr") == [(0, 0.1)]
    assert backend_metadata(mem, "r") == {"phase": "train"}


def test_close_drops_a_value_its_device_never_computed_and_keeps_the_rest(
    make_run: MakeRun, device_events: list[StandInEvent]
) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    run.log_metric("stuck", torch.tensor(1.0))
    run.log_metric("fine", torch.tensor(2.0))
    run.add_metadata(after="kept")
    run.log_metric("fine", 3.0)
    device_events[1].done.set()  # "fine" is ready, "stuck" never will be
    report = run.close(timeout=0.3)
    assert report.dropped == 1 and report.delivered == 3, report
    assert "metric 'stuck'" in report.refused["InMemoryTracker"][0]
    assert "close's deadline" in report.refused["InMemoryTracker"][0]
    assert values(mem, "r", "fine") == [(0, 2.0), (1, 3.0)]
    assert backend_metadata(mem, "r") == {"after": "kept"}
    assert mem.points("r", "stuck") == []


def test_a_device_error_loses_that_point_alone_counted_and_named(
    make_run: MakeRun, device_events: list[StandInEvent]
) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    run.log_metric("bad", torch.tensor(1.0))
    run.log_metric("good", torch.tensor(2.0))
    device_events[0].fail = RuntimeError("CUDA error: device-side assert triggered")
    device_events[1].done.set()
    report = run.flush(timeout=30)
    assert report.dropped == 1 and report.delivered == 1 and report.pending == 0, report
    assert "'bad'" in report.refused["InMemoryTracker"][0]
    assert "device-side assert" in report.refused["InMemoryTracker"][0]
    assert values(mem, "r", "good") == [(0, 2.0)]
    # The run goes on.
    run.log_metric("bad", 5.0)
    assert run.flush(timeout=30).delivered == 2
    assert values(mem, "r", "bad") == [(0, 5.0)]


def test_the_spool_stores_device_values_as_numbers(
    make_run: MakeRun, device_events: list[StandInEvent], tmp_path: Path
) -> None:
    # durable=True writes each batch to disk before delivery, and a backend that is down
    # makes the lane spool: both encode values, which must be known by then.
    down = FaultyTracker(name="down").when("write_batch", lambda n: n <= 3, transient("down"))
    run = make_run("r", [down], durable=True, spool_dir=str(tmp_path))
    for step in range(3):
        run.log_metric("loss", torch.tensor(step / 2), step=step)
        device_events[step].done.set()
        run.flush(timeout=30)
    report = run.close(timeout=30)
    assert report.ok and report.delivered == 3, report
    assert [(p.step, p.value) for p in down.inner.points("r", "loss")] == [  # type: ignore[attr-defined]
        (0, 0.0), (1, 0.5), (2, 1.0)
    ]


def test_the_packed_ingress_keeps_a_device_value_aside_as_a_record() -> None:
    # An overloaded run writes to the packed ingress, which packs values as doubles: a
    # DeferredValue must not be packed (nor read), but kept as it is, in its place.
    packed = Packed()
    deferred = DeferredValue(torch.tensor(1.0), StandInEvent())
    packed.append(("a", 1.0, 0, 1.0))
    packed.append(("a", deferred, None, 2.0))
    packed.extend([("a", 3.0, 2, 3.0)])
    assert packed.take_columns(10) is None  # not all plain points: not as columns
    taken = packed.take(10)
    assert taken == [("a", 1.0, 0, 1.0), ("a", deferred, None, 2.0), ("a", 3.0, 2, 3.0)]
    assert taken[1][1] is deferred


def test_settle_reads_values_in_order_and_stops_at_the_first_not_ready() -> None:
    ready, later = StandInEvent(), StandInEvent()
    ready.done.set()
    first = DeferredValue(torch.tensor(1.0), ready)
    second = DeferredValue(torch.tensor(2.0), later)
    records: list[tuple[Any, ...]] = [
        ("metadata", {"a": 1}), ("x", first, 0, 1.0), ("y", 5.0, None, 1.0),
        ("x", second, 1, 2.0), ("z", 6.0, None, 2.0),
    ]
    done, waiting, lost = tensors.settle(records)
    assert done == [("metadata", {"a": 1}), ("x", 1.0, 0, 1.0), ("y", 5.0, None, 1.0)]
    assert waiting == records[3:] and lost == []
    done, waiting, lost = tensors.settle(waiting, give_up="too late")
    assert done == [("z", 6.0, None, 2.0)] and waiting == []
    assert lost == ["metric 'x': too late"]
    plain: list[tuple[Any, ...]] = [("y", 5.0, None, 1.0)]
    assert tensors.settle(plain) == (plain, [], [])


# -- a real GPU ----------------------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_cuda_tensors_are_logged_without_a_device_sync(make_run: MakeRun) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    x = torch.randn(256, 256, device="cuda")
    squares = [torch.tensor(float(i**2), device="cuda") for i in range(20)]  # copies sync
    expected = []
    # "error": torch raises on any operation that synchronises the caller with the device.
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(20):
            x = torch.tanh(x @ x)
            loss = x.mean()
            run.log_metrics({"loss": loss, "step_sq": squares[step]})
            expected.append(loss)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert run.flush(timeout=60).ok
    assert values(mem, "r", "loss") == [(i, float(v)) for i, v in enumerate(expected)]
    assert values(mem, "r", "step_sq") == [(i, float(i**2)) for i in range(20)]
