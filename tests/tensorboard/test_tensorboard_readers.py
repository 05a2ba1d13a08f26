"""What TensorBoard's own readers show of a run: the classic ``EventAccumulator.Scalars``
(what most user scripts call) and the plugin reader behind the Scalars tab find every point,
as they find those of torch's ``SummaryWriter``; the HParams plugin's own session-group
code shows each run's hyperparameters (every kind), when it started and how it ended.
Our own reader still returns every point with its exact float64, from new files and from
files written before scalars were simple values."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing import event_accumulator as classic
from tensorboard.compat.proto import event_pb2, types_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.summary.writer.record_writer import RecordWriter

from async_tracker import AppRun, Batch, TrackerMetric
from async_tracker.backend.tensorboard import (
    BATCH_PLUGIN,
    BATCH_TAG,
    SIDE_DIR,
    AsyncTensorBoardTracker,
    TensorBoardTracker,
)
from tests.tensorboard.helpers import accumulate, f32, scalars

pytestmark = pytest.mark.server  # needs the tensorboard extra

# Values float32 cannot hold exactly, or at all, and values it keeps bit for bit.
ODD = [0.1, 1 / 3, 1e300, -1e-50, 2.0**-1074, math.nan, math.inf, -math.inf, -0.0, 0.5]


def classic_scalars(logdir: str | Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of each point, as the classic reader returns them (no sampling)."""
    acc = classic.EventAccumulator(str(logdir), size_guidance={classic.SCALARS: 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def same(a: Sequence[tuple[int, float]], b: Sequence[tuple[int, float]]) -> bool:
    """Equal lists of (step, value), NaN equal to NaN and -0.0 apart from 0.0."""
    return len(a) == len(b) and all(
        s == t and (x == y or (math.isnan(x) and math.isnan(y)))
        and math.copysign(1, x) == math.copysign(1, y)
        for (s, x), (t, y) in zip(a, b)
    )  # fmt: skip


def exact(tracker: TensorBoardTracker, run_id: str, tag: str) -> list[tuple[int, float]]:
    return [(p.step, p.value) for p in tracker.metrics(run_id)[tag]]


# -- scalars -----------------------------------------------------------------------------------


def test_both_tensorboard_readers_find_every_point_and_metrics_reads_them_exactly(
    tmp_path: Path,
) -> None:
    root = tmp_path / "tb"
    # Steps out of order, repeated steps, many flushes: every point is a point of both
    # readers (the classic one keeps repeats; the file's version stops it purging steps
    # that go back).
    logged = [(s % 7, v * (s + 1)) for s in range(60) for v in ODD]
    with AppRun("sweep/trial-1", [AsyncTensorBoardTracker(root)], flush_interval=3600) as run:
        for i, (step, value) in enumerate(logged):
            run.log_metric("loss", value, step=step)
            if i % 97 == 0:
                assert run.flush().ok
    logdir = AsyncTensorBoardTracker(root).logdir("sweep/trial-1")
    shown = [(s, f32(v)) for s, v in logged]
    assert same(classic_scalars(logdir, "loss"), shown)
    assert same(scalars(accumulate(logdir), "loss"), shown)  # the Scalars tab's reader
    # Our reader: the exact float64s, in step order (the order logged within a step).
    by_step = sorted(logged, key=lambda p: p[0])
    assert same(exact(TensorBoardTracker(root), "sweep/trial-1", "loss"), by_step)


def test_the_readers_see_our_scalars_as_they_see_torchs_summary_writer(tmp_path: Path) -> None:
    torch_tb = pytest.importorskip("torch.utils.tensorboard")
    points = [(step, value) for step, value in enumerate(ODD)]
    theirs = tmp_path / "torch"
    writer = torch_tb.SummaryWriter(str(theirs))
    for step, value in points:
        writer.add_scalar("acc", value, step, walltime=1.7e9 + step)
    writer.close()
    tracker = TensorBoardTracker(tmp_path / "ours")
    tracker.add_metrics("r", [TrackerMetric("acc", v, s, 1.7e9 + s) for s, v in points])
    ours = tracker.async_tracker.logdir("r")  # type: ignore[attr-defined]
    assert same(classic_scalars(ours, "acc"), classic_scalars(theirs, "acc"))
    assert same(scalars(accumulate(ours), "acc"), scalars(accumulate(theirs), "acc"))
    # A folder written by torch reads back through metrics() too (float32, all it holds).
    foreign = TensorBoardTracker(tmp_path)
    assert same(exact(foreign, "torch", "acc"), [(s, f32(v)) for s, v in points])


def old_batch_event(key: str, points: int) -> bytes:
    """A batch event as files written before the exact values travelled in it hold it."""
    event = event_pb2.Event(wall_time=1.7e9, step=0)
    value = event.summary.value.add(tag=BATCH_TAG)
    value.metadata.plugin_data.plugin_name = BATCH_PLUGIN
    value.tensor.dtype = types_pb2.DT_STRING
    value.tensor.string_val.append(f'{{"batch": "{key}", "points": {points}}}'.encode())
    return event.SerializeToString()


def old_scalar_event(tag: str, value: float, step: int, first: bool) -> bytes:
    """A point as older files hold it: a float tensor with the exact value beside it."""
    event = event_pb2.Event(wall_time=1.7e9 + step, step=step)
    summary_value = event.summary.value.add(tag=tag)
    summary_value.tensor.dtype = types_pb2.DT_FLOAT
    summary_value.tensor.float_val.append(value)
    summary_value.tensor.double_val.append(value)
    if first:
        summary_value.metadata.CopyFrom(scalar_metadata.create_summary_metadata("", ""))
    return event.SerializeToString()


def test_files_written_with_tensor_summaries_stay_readable(tmp_path: Path) -> None:
    tracker = TensorBoardTracker(tmp_path)
    logdir = Path(tracker.async_tracker.logdir("old"))  # type: ignore[attr-defined]
    (logdir / SIDE_DIR).mkdir(parents=True)
    (logdir / SIDE_DIR / "run.json").write_text('{"run_id": "old"}')
    # One batch, then its replay into a second file (a crash before the ack): read once.
    for n in (1, 2):
        with open(logdir / f"events.out.tfevents.1700000000.host.1.{n}", "wb") as f:
            writer = RecordWriter(f)
            header = event_pb2.Event(wall_time=1.7e9, file_version="brain.Event:2")
            writer.write(header.SerializeToString())
            writer.write(old_batch_event("k1", len(ODD)))
            for step, value in enumerate(ODD):
                writer.write(old_scalar_event("loss", value, step, step == 0))
    # New points appended to the same run by this version.
    tracker.add_metrics("old", [TrackerMetric("loss", 0.1, 100, 1.8e9)])
    assert same(exact(tracker, "old", "loss"), [*enumerate(ODD), (100, 0.1)])


async def test_a_batch_replayed_by_another_process_is_exact_and_read_once(
    tmp_path: Path,
) -> None:
    key = f"{time.time_ns():019d}-cafe-{3:012d}"
    batch = Batch(3, metrics=[TrackerMetric("x", v, s, 1.7e9 + s) for s, v in enumerate(ODD)],
                  key=key)  # fmt: skip
    # The first process, then the replay of its spool by another (its own event file).
    for _ in range(2):
        await AsyncTensorBoardTracker(tmp_path).write_batch("r", batch.for_lane())
    reader = AsyncTensorBoardTracker(tmp_path)
    got = [(p.step, p.value) for p in (await reader.metrics("r"))["x"]]
    assert same(got, list(enumerate(ODD)))
    assert len(classic_scalars(reader.logdir("r"), "x")) == 2 * len(ODD)  # as written
