"""Regression tests for the delivery defects of issue 12, one each, with what must hold.

(The simulator in tests/simulation checks the same invariants on random schedules.)
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from async_tracker import AppRun, TrackerClosedError
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.spool import run_dir_name
from tests.faulty import FaultyTracker, Raise, transient

MakeRun = Callable[..., AppRun]


def segments(spool: Path) -> list[Path]:
    return [p for p in spool.rglob("*.seg") if "quarantine" not in p.parts]


def test_a_backend_failing_30_percent_of_writes_gets_everything(
    make_run: MakeRun, tmp_path: Path
) -> None:
    # Defect 1: the retry budget counted attempts, not progress: the lane gave up.
    rng = random.Random(30)
    flaky = FaultyTracker(name="flaky").when(
        "write_batch", lambda _n: rng.random() < 0.3, transient("flaky")
    )
    run = make_run("r", [flaky], batch_size=500, spool_dir=str(tmp_path))
    for i in range(20_000):
        run.log_metric("m", float(i), step=i)
        if i % 2000 == 1999:
            run.flush(0)
    report = run.close(60)
    assert report.ok and report.delivered == 20_000, report
    assert [p.step for p in flaky.inner.points("r", "m")] == list(range(20_000))  # type: ignore[attr-defined]
    assert segments(tmp_path) == []
    assert flaky.count("write_batch", "raised ConnectionError") > 10


def test_the_spool_drains_once_the_backend_is_back(make_run: MakeRun, tmp_path: Path) -> None:
    # Defect 2: after an outage the spool stayed on disk, and close() returned at once.
    down = FaultyTracker(name="down").when("write_batch", lambda n: n <= 9, transient("down"))
    run = make_run("r", [down], batch_size=10, spool_dir=str(tmp_path))
    for i in range(100):
        run.log_metric("m", float(i), step=i)
        if i % 10 == 9:
            run.flush()  # rounds fail until the 10th call: what waits goes to disk
    assert run.status().backends["down"].spooled > 0 or run.status().backends["down"].delivered
    report = run.close(30)
    assert report.ok and report.delivered == 100 and report.spooled == 0, report
    assert [p.step for p in down.inner.points("r", "m")] == list(range(100))  # type: ignore[attr-defined]
    assert segments(tmp_path) == []


def test_writes_racing_close_in_other_threads_are_all_counted(make_run: MakeRun) -> None:
    # Defect 4: points accepted while close() ran were neither delivered nor counted.
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    accepted = [0] * 8
    started = threading.Barrier(9)
    busy = threading.Event()  # set once a writer is well under way

    def write(t: int) -> None:
        started.wait()
        try:
            for i in range(1_000_000):
                run.log_metric(f"t{t}", float(i), step=i)
                accepted[t] += 1
                if i == 2_500:
                    busy.set()
        except TrackerClosedError:
            pass

    threads = [threading.Thread(target=write, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    started.wait()
    assert busy.wait(30)
    report = run.close(30)
    for t in threads:
        t.join(30)
    assert report.ok and report.delivered == sum(accepted), (report, sum(accepted))
    for t in range(8):
        steps = [p.step for p in mem.points("r", f"t{t}")]
        assert steps == list(range(accepted[t]))


def test_a_stray_file_in_one_runs_spool_stops_nothing(make_run: MakeRun, tmp_path: Path) -> None:
    # Defect 5: one stray file stopped the process-wide flusher, every run with it.
    run_dir = tmp_path / run_dir_name("bad")
    (run_dir / "InMemoryTracker").mkdir(parents=True)
    (run_dir / "stray.txt").write_text("not a spool file")
    (run_dir / "InMemoryTracker" / "stray.seg").write_text("nor this")
    (run_dir / "InMemoryTracker" / "1-2-3.seg").write_text("nor this")
    bad_mem, good_mem = InMemoryTracker(), InMemoryTracker()
    bad = make_run("bad", [bad_mem], spool_dir=str(tmp_path))
    good = make_run("good", [good_mem], spool_dir=str(tmp_path))
    for i in range(10):
        bad.log_metric("m", float(i), step=i)
        good.log_metric("m", float(i), step=i)
    assert bad.flush(30).ok and good.flush(30).ok
    assert len(bad_mem.points("bad", "m")) == 10 and len(good_mem.points("good", "m")) == 10
    quarantined = list((run_dir / "InMemoryTracker" / "quarantine").iterdir())
    assert len(quarantined) == 2  # moved aside, with a warning, not deleted


@pytest.mark.parametrize(
    "value, message",
    [
        (10**5000, "does not fit in 64 bits"),
        ("\udc80abc", "lone surrogate"),
        ({"deep": [2**64]}, "does not fit in 64 bits"),
    ],
    ids=["huge-int", "lone-surrogate", "nested-int"],
)
def test_values_the_spool_cannot_store_are_refused_at_the_call_site(
    make_run: MakeRun, value: object, message: str, tmp_path: Path
) -> None:
    # Defect 5 (second half): a 5000-digit int with durable=True stopped every run.
    mem = InMemoryTracker()
    run = make_run("r", [mem], durable=True, spool_dir=str(tmp_path))
    with pytest.raises(ValueError, match=message) as info:
        run.add_metadata(good=1, bad=value)
    assert "'bad" in str(info.value)  # names the key
    run.add_metadata(after=2)
    assert run.flush(30).ok
    assert run.metadata() == {"after": 2}  # nothing of the refused call was kept


def test_a_cycle_is_refused_at_the_call_site(make_run: MakeRun) -> None:
    run = make_run("r", [InMemoryTracker()])
    loop: dict[str, object] = {}
    loop["self"] = loop
    with pytest.raises(ValueError, match="cycle"):
        run.add_metadata(config=loop)
    shared = [1, 2]
    run.add_metadata(twice={"a": shared, "b": shared})  # shared, not cyclic: fine
    assert run.flush().ok


def test_run_ids_that_cannot_be_stored_are_refused_naming_the_id() -> None:
    # Defect 9: a 300-character run id raised OSError from the spool path.
    with pytest.raises(ValueError, match="run id 'xxxx"):
        AppRun("x" * 300, [InMemoryTracker()])
    with pytest.raises(ValueError, match="NUL"):
        AppRun("a\x00b", [InMemoryTracker()])
    with pytest.raises(ValueError, match="empty"):
        AppRun("", [InMemoryTracker()])


def test_a_read_does_not_replay_another_runs_spool(make_run: MakeRun, tmp_path: Path) -> None:
    # Defect 9: reading sources built runs that replayed the parent's spool.
    hung = FaultyTracker(name="mem").always("write_batch", Raise(lambda: ConnectionError("x")))
    parent = make_run("parent", [hung], spool_dir=str(tmp_path))
    parent.log_metric("m", 1.0, step=0)
    parent.close(0.1)
    assert segments(tmp_path)  # the parent's record waits on disk
    store = InMemoryTracker(name="mem")
    child = make_run("child", [store], spool_dir=str(tmp_path))
    child.add_source("parent", None)
    assert child.flush().ok
    (source,) = child.sources()
    assert source.parent.id == "parent"
    assert source.parent.metrics() == {}  # read through the backend only
    assert segments(tmp_path)  # untouched by the read
    assert store.points("parent", "m") == []


def test_a_lane_that_dies_keeps_its_records_and_stops_nothing_else(
    make_run: MakeRun, tmp_path: Path
) -> None:
    # Supervision: a bug in one lane (here: its write step raises) stops that lane alone.
    broken, fine, other = InMemoryTracker(name="broken"), InMemoryTracker(name="fine"), (
        InMemoryTracker(name="other")
    )
    run = make_run("r", [broken, fine], spool_dir=str(tmp_path))
    neighbour = make_run("n", [other], spool_dir=str(tmp_path))
    run.add_metadata(start=True)
    assert run.flush().ok
    assert run._pipeline is not None
    lane = run._pipeline.lanes[0]

    async def bug(entry: object) -> bool:
        raise RuntimeError("a bug in the lane")

    lane._attempt = bug  # type: ignore[method-assign]
    for i in range(10):
        run.log_metric("m", float(i), step=i)
        neighbour.log_metric("m", float(i), step=i)
    report = run.flush(30)
    assert not report.ok and "lane stopped" in report.errors["broken"]
    assert report.pending == 10 and report.delivered == 2 + 10  # fine took everything
    assert neighbour.flush(30).ok and len(other.points("n", "m")) == 10
    closed = run.close(5)
    assert closed.spooled == 10 and closed.pending == 0  # kept: on disk for the next start
    with AppRun("r", [InMemoryTracker(name="broken")], spool_dir=str(tmp_path)) as again:
        assert again.flush(30).delivered == 10


def test_two_live_runs_of_one_id_in_a_process_never_take_each_others_spool(
    make_run: MakeRun, tmp_path: Path
) -> None:
    # A live pipeline's segments are not a dead one's, even in this same process (the
    # simulator's fork rule found a second pipeline adopting them: duplicates).
    import threading

    from tests.faulty import Hang

    release = threading.Event()
    stuck = FaultyTracker(InMemoryTracker(), name="b").on("write_batch", 1, action=Hang(release))
    first = make_run("same", [stuck], spool_dir=str(tmp_path), durable=True)
    for i in range(5):
        first.log_metric("m", float(i), step=i)
    first.flush(0)
    assert stuck.wait_for("write_batch", 1)
    assert segments(tmp_path)  # written ahead, and held by the live first run
    other = InMemoryTracker(name="b")
    second = make_run("same", [other], spool_dir=str(tmp_path))
    second.log_metric("n", 1.0, step=0)
    assert second.flush(30).ok
    assert other.points("same", "m") == []  # the first run's records stay the first run's
    release.set()
    assert first.close(30).ok
    assert [p.step for p in stuck.inner.points("same", "m")] == list(range(5))  # type: ignore[attr-defined]


def test_a_report_tells_the_records_taken_over_from_an_earlier_process(
    make_run: MakeRun, tmp_path: Path
) -> None:
    # A resumed run delivers what its earlier process spooled: counted as delivered, its
    # report must still add up to what this process accepted, the rest named as replayed.
    down = FaultyTracker(name="store").always("write_batch", transient("down"))
    first = make_run("r", [down], spool_dir=str(tmp_path))
    for i in range(30):
        first.log_metric("m", float(i), step=i)
    spooled = first.close(0.2)
    assert spooled.spooled == 30 and spooled.replayed == 0, spooled
    up = FaultyTracker(name="store")
    second = make_run("r", [up], spool_dir=str(tmp_path))
    for i in range(30, 50):
        second.log_metric("m", float(i), step=i)
    report = second.close(30)
    assert report.ok and report.delivered == 50 and report.replayed == 30, report
    assert report.delivered - report.replayed == 20  # what the second process accepted
    assert [p.step for p in up.inner.points("r", "m")] == list(range(50))  # type: ignore[attr-defined]
