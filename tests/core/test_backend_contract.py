"""The backend contract as AppRun uses it (issue 14): ``validate`` at the call site,
``end_run`` with how the run ended (finished, failed, killed), ``aclose(reason)`` for the
backends a run built itself."""

from __future__ import annotations

import itertools
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from async_tracker import AppRun, TrackerArtifact, TrackerMetric, TrackerSource
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.base import Checked, CloseReason
from tests.core.helpers import Child

MakeRun = Callable[..., AppRun]


class Picky(InMemoryTracker):
    """Refuses keys longer than 8 characters and records what it was told at the end."""

    def __init__(self, ended: list[tuple[str, str]] | None = None) -> None:
        super().__init__()
        self.validated: list[Checked] = []
        self.ended = [] if ended is None else ended

    def validate(self, record: Checked) -> None:
        self.validated.append(record)
        if isinstance(record, (TrackerMetric, TrackerArtifact)):
            keys = [record.name]
        elif isinstance(record, TrackerSource):
            keys = [record.source_run_id]
        else:
            keys = list(record)
        for key in keys:
            if len(key) > 8:
                raise ValueError(f"key {key!r} is longer than 8 characters")

    async def end_run(self, run_id: str, reason: CloseReason) -> None:
        self.ended.append(("end_run", f"{run_id}:{reason}"))

    async def aclose(self, reason: CloseReason = "finished") -> None:
        self.ended.append(("aclose", reason))


def test_validate_refuses_at_the_call_site_and_keeps_the_rest(make_run: MakeRun) -> None:
    backend = Picky()
    run = make_run("r", [backend])
    run.log_metric("loss", 1.0, step=0)
    with pytest.raises(ValueError, match="much_too_long"):
        run.log_metric("much_too_long", 1.0, step=0)
    with pytest.raises(ValueError, match="also_too_long"):
        run.log_metrics({"acc": 0.5, "also_too_long": 1.0}, step=1)  # nothing of the call kept
    with pytest.raises(ValueError, match="long_key_here"):
        run.add_metadata(lr=0.1, long_key_here=1)
    with pytest.raises(ValueError, match="checkpoint_7"):
        run.add_artifact("checkpoint_7", "/tmp/x")
    run.add_metadata(lr=0.1)
    run.log_metric("loss", 0.5, step=1)
    assert run.close(30).ok
    assert [p.value for p in backend.points("r", "loss")] == [1.0, 0.5]
    assert not backend.points("r", "acc")
    stored = backend.runs["r"]
    assert stored.metadata == {"lr": 0.1}
    assert stored.artifacts == {}


def test_validate_sees_each_metric_name_once_then_the_hot_path_skips_it(
    make_run: MakeRun,
) -> None:
    backend = Picky()
    run = make_run("r", [backend])
    for step in range(100):
        run.log_metric("loss", float(step), step=step)
        run.log_metrics({"loss": 1.0, "acc": 2.0}, step=step)
    assert run.close(30).ok
    names = [r.name for r in backend.validated if isinstance(r, TrackerMetric)]
    assert names == ["loss", "acc"]


def test_a_value_whose_conversion_raises_names_its_key(make_run: MakeRun) -> None:
    class Bad:
        def __float__(self) -> float:
            raise RuntimeError("device lost")

    run = make_run("r", [InMemoryTracker()])
    with pytest.raises(TypeError, match=r"'loss'.*device lost"):
        run.log_metric("loss", Bad())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'acc'"):
        run.log_metrics({"ok": 1.0, "acc": Bad()})  # type: ignore[dict-item]
    assert run.close(30).ok
    assert run.status().backends["InMemoryTracker"].delivered == 0


@pytest.mark.parametrize(
    ("how", "reason"), [("close", "finished"), ("with-ok", "finished"), ("with-error", "failed")]
)
def test_every_backend_hears_how_the_run_ended(make_run: MakeRun, how: str, reason: str) -> None:
    backend = Picky()
    run = make_run("r", [backend])
    if how == "close":
        run.log_metric("loss", 1.0)
        run.close(30)
    elif how == "with-ok":
        with run:
            run.log_metric("loss", 1.0)
    else:
        with pytest.raises(KeyError), run:
            run.log_metric("loss", 1.0)
            raise KeyError("boom")
    # A backend the user built is told the run ended, and not closed: it may serve others.
    assert backend.ended == [("end_run", f"r:{reason}")]


def test_close_inside_an_except_clause_is_a_failed_run(make_run: MakeRun) -> None:
    backend = Picky()
    run = make_run("r", [backend])
    run.log_metric("loss", 1.0)
    try:
        raise RuntimeError("training diverged")
    except RuntimeError:
        run.close(30)
    assert backend.ended == [("end_run", "r:failed")]


EXIT_SCRIPT = """
import json, sys, time
from async_tracker import AppRun
from tests.core.test_backend_contract import Picky

out, mode = sys.argv[1], sys.argv[2]

class Ended(list):
    def append(self, item):  # written at once: a killed process runs no exit hook after ours
        super().append(item)
        with open(out, "w") as f:
            json.dump(self, f)

run = AppRun("job", [Picky(Ended())], _owns_backends=True)
run.log_metric("loss", 1.0)
if mode == "exception":
    raise RuntimeError("the job failed")
if mode == "sigterm":
    print("ready", flush=True)
    while True:  # sleeps, not signal.pause(): see tests/core/helpers.py
        time.sleep(0.01)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize(
    ("mode", "reason"), [("clean", "finished"), ("exception", "failed"), ("sigterm", "killed")]
)
def test_a_job_exit_ends_the_run_with_its_reason(
    tmp_path: Path, child: Callable[..., Child], mode: str, reason: str
) -> None:
    out = tmp_path / "ended.json"
    proc = child(EXIT_SCRIPT, str(out), mode)
    if mode == "sigterm":
        assert proc.readline() == "ready"
        proc.proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == -signal.SIGTERM, proc.stderr()
    else:
        assert proc.wait(60) == (1 if mode == "exception" else 0), proc.stderr()
    # The run built its backend (as from TORCHX_TRACKERS): ended, then closed, with the reason.
    assert json.loads(out.read_text()) == [["end_run", f"job:{reason}"], ["aclose", reason]]


class Throttled(Exception):
    """A library's own error that says nothing to classify() by its type."""


def test_map_error_decides_retry_or_drop(make_run: MakeRun) -> None:
    from async_tracker.errors import RecordError, TransientBackendError
    from async_tracker.records import Batch

    class Mapped(InMemoryTracker):
        def __init__(self) -> None:
            super().__init__()
            self.failures = 2

        async def write_batch(self, run_id: str, batch: Batch) -> None:
            if self.failures:
                self.failures -= 1
                raise Throttled("slow down")
            if any(p.value < 0 for p in batch.metrics):
                raise ValueError("negative")
            await super().write_batch(run_id, batch)

        def map_error(self, exc: BaseException) -> BaseException:
            if isinstance(exc, Throttled):
                return TransientBackendError(str(exc))
            if isinstance(exc, ValueError):
                return RecordError(str(exc))
            return exc

    backend = Mapped()
    run = make_run("r", [backend], batch_size=100)
    for step in range(10):
        run.log_metric("m", -1.0 if step == 3 else float(step), step=step)
    report = run.close(30)
    # Throttled twice: retried (mapped transient), not kept for a cooldown; the one negative
    # value was found by splitting (mapped to a record error) and dropped alone.
    assert report.delivered == 9 and report.dropped == 1 and not report.spooled, report
    assert run.status().backends["Mapped"].retries >= 2
    # In the order the backend stored them (its dict keeps insertion order).
    stored = map(TrackerMetric._make, itertools.chain(*backend.runs["r"].batches.values()))
    steps = [p.step for p in stored if p.name == "m"]
    assert steps == [0, 1, 2, 4, 5, 6, 7, 8, 9]
