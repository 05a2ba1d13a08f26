"""The end status as a record of the run's log: sealed at close after every record the run
accepted, delivered last through ``write_batch`` (``end_run``), spooled and replayed like
any record when the backend is down, counted apart from the user's records; and the
heartbeat of a live run, off the delivery path."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from async_tracker import AppRun, Batch, TrackerArtifact, TrackerMetric, TrackerSource
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.base import CloseReason
from async_tracker.pipeline.cutter import Cutter, split
from async_tracker.spool.codec import decode_batch, encode_batch
from tests.core.helpers import wait_until
from tests.faulty import FaultyTracker, backend_down

MakeRun = Callable[..., AppRun]


class Ordered(InMemoryTracker):
    """Keeps the order in which a run's parts and its end arrived."""

    def __init__(self, name: str = "ordered") -> None:
        super().__init__(name=name)
        self.arrivals: list[str] = []

    async def add_metadata(self, run_id: str, **kwargs: object) -> None:
        self.arrivals.extend(f"metadata:{k}" for k in kwargs)
        await super().add_metadata(run_id, **kwargs)

    async def add_metrics(self, run_id: str, metrics: object) -> None:
        self.arrivals.extend(f"metric:{m.step}" for m in metrics)  # type: ignore[attr-defined]
        await super().add_metrics(run_id, metrics)  # type: ignore[arg-type]

    async def write_batch(self, run_id: str, batch: Batch) -> None:
        # The default replay (not InMemoryTracker's bulk path), so every part is seen.
        await super(InMemoryTracker, self).write_batch(run_id, batch)
        self.batches_written += 1

    async def end_run(self, run_id: str, reason: CloseReason) -> None:
        self.arrivals.append(f"end:{reason}")
        await super().end_run(run_id, reason)


@pytest.mark.parametrize("reason", ["finished", "failed", "killed"])
def test_the_end_arrives_last_after_every_record(
    make_run: MakeRun, tmp_path: Path, reason: CloseReason
) -> None:
    backend = Ordered()
    run = make_run("r", [backend], spool_dir=str(tmp_path), batch_size=3)
    run.add_metadata(a=1)
    for step in range(7):
        run.log_metric("loss", float(step), step=step)
    report = run.close(timeout=30, reason=reason)
    assert report.ok and report.delivered == 8, report  # the end is no record of the user's
    assert backend.arrivals[-1] == f"end:{reason}"
    assert backend.arrivals.count(f"end:{reason}") == 1
    assert backend.ended("r") == reason


def test_a_with_block_left_by_an_exception_ends_failed(make_run: MakeRun, tmp_path: Path) -> None:
    backend = InMemoryTracker(name="m")
    with pytest.raises(RuntimeError), make_run("r", [backend], spool_dir=str(tmp_path)) as run:
        run.log_metric("loss", 1.0, step=0)
        raise RuntimeError("the job failed")
    assert backend.ended("r") == "failed"


def test_a_run_that_wrote_nothing_sends_nothing(make_run: MakeRun, tmp_path: Path) -> None:
    # Decided: its pipeline never started, no store holds the run; nothing to end.
    backend = InMemoryTracker(name="m")
    report = make_run("r", [backend], spool_dir=str(tmp_path)).close(timeout=5)
    assert report.ok and backend.runs == {}


def test_a_backend_that_cannot_take_the_end_keeps_it_spooled_then_gets_it(
    make_run: MakeRun, tmp_path: Path
) -> None:
    store = InMemoryTracker(name="s")
    down = FaultyTracker(store, name="s").always("end_run", backend_down())
    # durable: every batch, the end record included, is on disk before its delivery is
    # tried, so that the end is spooled whatever share of a loaded machine the close's last
    # moments get (the close writes leftovers only within its grace).
    run = make_run("r", [down], spool_dir=str(tmp_path), durable=True)
    for step in range(5):
        run.log_metric("loss", float(step), step=step)
    report = run.close(timeout=1, reason="killed")
    # The records are delivered and counted; the end waits on disk, said apart, and the
    # report is not ok: the summary says so and where it waits.
    assert report.delivered == 5 and report.spooled == 0 and report.pending == 0
    assert report.end_spooled == 1 and report.end_pending == 0 and not report.ok
    assert "end status spooled" in report.summary("r")
    assert report.spool_paths["s"].startswith(str(tmp_path))
    assert store.ended("r") is None
    # The next life of the job (or `async-tracker sync`) delivers it, in its place.
    down.heal()
    again = AppRun("r", [down], spool_dir=str(tmp_path), flush_interval=3600)
    assert again.flush(30).ok
    assert store.ended("r") == "killed" and down.count("end_run", "ok") == 1
    again.close(timeout=30)
    assert store.ended("r") == "finished" and down.count("end_run", "ok") == 2


def test_the_end_record_survives_the_spool_codec_and_splits() -> None:
    cutter = Cutter("1234567890123456789xabc")
    cutter.cut([("m", 1.0, 0, 1.0)])
    end = cutter.cut_end("killed", 1700000000.5, 1699999000.25)
    assert (end.first, end.seq, end.records) == (1, 1, 0) and not end.is_empty()
    back = decode_batch(encode_batch(end))
    assert (back.end, back.end_time, back.seq, back.records) == ("killed", 1700000000.5, 1, 0)
    assert back.life_start == 1699999000.25 and end.for_lane().life_start == 1699999000.25
    # A line written before the life's start was sealed with the end reads as a first life.
    old = encode_batch(end).replace(b',1699999000.25]', b']')
    old = b"%08x %s" % (zlib.crc32(old[9:].rstrip(b"\n")), old[9:])
    assert decode_batch(old).life_start == 0.0 and decode_batch(old).end == "killed"
    assert end.for_lane().end == "killed"
    # A batch holding records and the end: a split never drops the end with a refused
    # record, and records add up.
    mixed = Batch(
        5,
        metadata={"a": 1},
        artifacts={"x": TrackerArtifact("x", "/p", None)},
        sources=[TrackerSource("parent", None)],
        metrics=[TrackerMetric("m", 1.0, 0, 1.0)],
        records=4,
        end="failed",
        end_time=3.0,
    )
    halves = split(mixed)
    assert sum(h.records for h in halves) == 4
    assert [h.end for h in halves] == [None, "failed"]
    last = halves[-1]
    while (parts := split(last)):
        assert sum(p.records for p in parts) == last.records
        last = parts[-1]
    assert last.end == "failed" and last.records == 0 and last.end_time == 3.0
    # Done marks keep the store they were made in.
    mixed.done.add("metadata")
    mixed.done_for = "file:///old"
    assert decode_batch(encode_batch(mixed)).done_for == "file:///old"


class Beating(InMemoryTracker):
    """Counts heartbeats; the first ``hang`` of them never return."""

    def __init__(self, hang: int = 0) -> None:
        super().__init__(name="beating")
        self.beats: list[tuple[str, float]] = []
        self.hang = hang

    async def heartbeat(self, run_id: str, interval_s: float) -> None:
        self.beats.append((run_id, interval_s))
        if len(self.beats) <= self.hang:
            import anyio

            await anyio.sleep(3600)  # a store that never answers


def test_a_live_run_beats_its_heartbeat_and_a_hung_one_costs_delivery_nothing(
    make_run: MakeRun, tmp_path: Path
) -> None:
    backend = Beating(hang=1)
    run = make_run("r", [backend], spool_dir=str(tmp_path), heartbeat_s=0.05)
    run.log_metric("loss", 1.0, step=0)
    # The first heartbeat hangs: delivery goes on, and the next heartbeat comes once the
    # hung one's bound (the interval) has passed.
    assert run.flush(30).ok
    wait_until(lambda: len(backend.beats) >= 3, "heartbeats after a hung one")
    assert set(backend.beats) == {("r", 0.05)}
    assert run.close(30).ok and backend.ended("r") == "finished"


def test_heartbeats_off(make_run: MakeRun, tmp_path: Path) -> None:
    backend = Beating()
    run = make_run("r", [backend], spool_dir=str(tmp_path), heartbeat_s=0)
    run.log_metric("loss", 1.0, step=0)
    assert run.close(30).ok
    assert backend.beats == []


def test_heartbeat_s_option_and_variable() -> None:
    from async_tracker.settings import RunOptions

    assert RunOptions().heartbeat_s == 30.0
    assert RunOptions.from_env({"ASYNC_TRACKER_HEARTBEAT_S": "2.5"}).heartbeat_s == 2.5
    with pytest.raises(ValueError, match="ASYNC_TRACKER_HEARTBEAT_S"):
        RunOptions.from_env({"ASYNC_TRACKER_HEARTBEAT_S": "soon"})
    with pytest.raises(ValueError, match="heartbeat_s"):
        RunOptions(heartbeat_s=-1)
