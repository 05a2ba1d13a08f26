"""Many threads logging at once: every point delivered exactly once, each thread's order kept."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

from async_tracker import AppRun
from async_tracker.backend.memory import InMemoryTracker
from tests.faulty import FaultyTracker

MakeRun = Callable[..., AppRun]
THREADS = 8
POINTS = 2_000


def test_eight_threads_logging_at_once(make_run: MakeRun) -> None:
    mem = InMemoryTracker(name="mem")
    counted = FaultyTracker(name="counted")  # no faults: a second backend that counts calls
    # Small batches, so that the flusher cuts many of them while the threads write.
    run = make_run("r", [mem, counted], batch_size=97)
    start = threading.Barrier(THREADS + 1)
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            start.wait()
            for i in range(POINTS):
                run.log_metric(f"thread{t}", float(i))  # default step: previous + 1
                run.log_metric("shared", float(t * POINTS + i))
                if i % 500 == 0:
                    run.add_metadata(**{f"progress{t}": i})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    start.wait()
    # Flush while they write: a flush must never lose or repeat what is being appended.
    for _ in range(5):
        run.flush()
    for th in threads:
        th.join()
    assert errors == []

    report = run.flush()
    assert report.ok, report
    total = THREADS * POINTS * 2 + THREADS * (POINTS // 500)
    assert report.delivered == 2 * total  # counted once per backend

    for backend in (mem, counted.inner):
        assert isinstance(backend, InMemoryTracker)
        for t in range(THREADS):
            points = backend.points("r", f"thread{t}")
            # Exactly once, in call order: the k-th call got step k and value k.
            assert [(p.step, p.value) for p in points] == [(i, float(i)) for i in range(POINTS)]
        shared = backend.points("r", "shared")
        values = Counter(p.value for p in shared)
        assert len(shared) == THREADS * POINTS
        assert set(values.values()) == {1}
        assert set(values) == {float(v) for v in range(THREADS * POINTS)}
        # Steps follow the shared buffer's order; within a thread, they follow its calls.
        assert [p.step for p in shared] == list(range(THREADS * POINTS))
        for t in range(THREADS):
            mine = [p.value for p in shared if t * POINTS <= p.value < (t + 1) * POINTS]
            assert mine == [float(t * POINTS + i) for i in range(POINTS)]
        last = max(range(0, POINTS, 500))  # the last add_metadata of each key wins
        assert backend.runs["r"].metadata == {f"progress{t}": last for t in range(THREADS)}


def test_first_writes_from_many_threads_start_one_flusher(make_run: MakeRun) -> None:
    # Every thread's first write races to start the run's flusher: exactly one must win,
    # and no record may go to a flusher that is then thrown away.
    for attempt in range(20):
        mem = InMemoryTracker()
        run = make_run(f"r{attempt}", [mem])
        start = threading.Barrier(THREADS)

        def worker(t: int, run: AppRun = run, start: threading.Barrier = start) -> None:
            start.wait()
            run.log_metric(f"m{t}", 1.0, step=0)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        report = run.close()
        assert report.ok and report.delivered == THREADS
        assert sorted(mem.runs[f"r{attempt}"].by_name()) == sorted(f"m{t}" for t in range(THREADS))
