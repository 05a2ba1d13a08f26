"""Plug-ins with torchx's ``TrackerBase`` methods but not our class, as backends (duck-typed
here; torchx's own classes in test_torchx_package.py), ``AppRun`` equality like torchx's
dataclass, and ``AppRun.reset_from_env()``. In this venv: no torchx needed."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import fsspec
import pytest

from async_tracker import (
    AppRun,
    AppRunTrackableSource,
    AsyncTrackerBase,
    Lineage,
    TrackerArtifact,
    TrackerClosedError,
    TrackerConfigError,
    TrackerSource,
    as_async,
    as_sync,
)
from async_tracker.adapters import ForeignTracker
from async_tracker.backend.fsspec import FsspecTracker
from async_tracker.backend.memory import InMemoryTracker
from tests.core.helpers import REPO, python_env
from tests.torchx import plugins
from tests.torchx.plugins import DuckMetricTracker, DuckTracker

WRITES = ("add_metadata", "add_artifact", "add_source")


@pytest.fixture
def runs() -> Iterator[list[AppRun]]:
    """Runs a test opens, closed after it whatever happened."""
    opened: list[AppRun] = []
    yield opened
    for run in opened:
        run.close(timeout=1.0)


def test_a_duck_typed_plugin_gets_every_record_in_worker_threads(runs: list[AppRun]) -> None:
    duck = DuckTracker()
    run = AppRun("job-1", [duck])
    runs.append(run)
    run.add_metadata(lr=0.1, layers=[64, 64])
    run.add_metadata(lr=0.2)
    run.add_artifact("model", "/ckpt/m.pt", {"epoch": 3})
    run.add_source("job-0", "checkpoint")
    report = run.close()
    assert report.ok and report.delivered == 4, report
    assert duck.runs["job-1"]["metadata"] == {"lr": 0.2, "layers": [64, 64]}
    assert duck.runs["job-1"]["artifacts"] == {
        "model": plugins.Artifact("model", "/ckpt/m.pt", {"epoch": 3})
    }
    assert duck.runs["job-1"]["sources"] == [plugins.Source("job-0", "checkpoint")]
    writes = [(m, main) for m, _, main in duck.calls if m in WRITES]
    # The sync adapter: every write ran, and none on the caller's (main) thread.
    assert sorted(m for m, _ in writes) == sorted(WRITES)
    assert not any(main for _, main in writes)
    # A plug-in the user built is the user's to close.
    assert duck.closed == 0


def test_reads_through_a_duck_typed_plugin_come_back_as_our_types(runs: list[AppRun]) -> None:
    duck = DuckTracker()
    run = AppRun("job-1", [duck], flush_interval=3600)
    runs.append(run)
    run.add_artifact("model", "/ckpt/m.pt", {"epoch": 3})
    run.add_source("job-0", "checkpoint")
    run.add_source("data-v2")
    # Reads flush first: they see this process's writes.
    artifacts = run.artifacts()
    assert artifacts == {"model": TrackerArtifact("model", "/ckpt/m.pt", {"epoch": 3})}
    assert type(artifacts["model"]) is TrackerArtifact
    sources = run.sources()
    assert sources == [
        AppRunTrackableSource(AppRun("job-0", [duck]), "checkpoint"),
        AppRunTrackableSource(AppRun("data-v2", [duck]), None),
    ]
    assert [s.parent.id for s in run.children()] == []
    assert [c.id for c in AppRun("job-0", [duck]).children()] == ["job-1"]
    # The plug-in's lineage() gives a class without fields (as torchx's): ours is built
    # from its sources() and run_ids(parent_run_id=...).
    assert run.lineage() == Lineage(
        "job-1", [TrackerSource("job-0", "checkpoint"), TrackerSource("data-v2", None)], []
    )
    assert AppRun("job-0", [duck]).lineage() == Lineage(
        "job-0", [], [TrackerSource("job-1", "checkpoint")]
    )


def test_sync_and_async_faces_of_a_duck_typed_plugin() -> None:
    duck = DuckTracker()
    sync = as_sync(duck)
    sync.add_metadata("r", a=1)
    sync.add_artifact("r", "log", "/logs/r.txt")
    sync.add_source("r", "p")
    assert sync.metadata("r") == {"a": 1}
    assert sync.artifacts("r") == {"log": TrackerArtifact("log", "/logs/r.txt", None)}
    assert list(sync.sources("r")) == [TrackerSource("p", None)]
    assert list(sync.run_ids(parent_run_id="p")) == ["r"]
    backend = as_async(duck)
    assert isinstance(backend, AsyncTrackerBase) and not backend.supports_metrics
    assert backend.name == "DuckTracker"  # the plug-in's class names it (reports, spool)
    again = as_sync(backend)
    assert isinstance(again, ForeignTracker) and again.tracker is duck


def test_a_plugin_without_metric_methods_skips_metrics_and_says_so(
    runs: list[AppRun], caplog: pytest.LogCaptureFixture
) -> None:
    duck, with_metrics = DuckTracker(), DuckMetricTracker()
    run = AppRun("job-1", [duck, with_metrics])
    runs.append(run)
    run.log_metric("loss", 0.5, step=1)
    run.log_metric("loss", 0.25, step=2)
    run.add_metadata(a=1)
    assert run.close().ok
    assert [(p.step, p.value) for p in with_metrics.runs["job-1"]["metrics"]] == [
        (1, 0.5),
        (2, 0.25),
    ]
    assert "metrics" not in duck.runs["job-1"] and duck.runs["job-1"]["metadata"] == {"a": 1}
    messages = [r.getMessage() for r in caplog.records]
    skipped = [m for m in messages if "without a metric method" in m]
    assert len(skipped) == 1 and "DuckTracker" in skipped[0]
    assert "DuckMetricTracker" not in skipped[0]


class HalfTracker:
    """Has two of the eight methods."""

    def add_metadata(self, run_id: str, **kwargs: object) -> None: ...

    def metadata(self, run_id: str) -> Mapping[str, object]:
        return {}


class AsyncDuck(DuckTracker):
    """Async methods without subclassing AsyncTrackerBase."""

    async def add_metadata(self, run_id: str, **kwargs: object) -> None:  # type: ignore[override]
        ...


@pytest.mark.parametrize(
    ("backend", "expected"),
    [
        ({"not": "a tracker"}, "dict, not a TrackerBase or AsyncTrackerBase"),
        (
            HalfTracker(),
            "HalfTracker, not a TrackerBase or AsyncTrackerBase: it lacks TrackerBase's "
            "add_artifact, artifacts, add_source, sources, lineage, run_ids",
        ),
        (DuckTracker, "the class DuckTracker, not an instance of it"),
        (AsyncDuck(), "add_metadata are coroutine functions: an async backend must subclass"),
    ],
)
def test_what_is_not_a_tracker_is_refused_at_the_call_site(backend: object, expected: str) -> None:
    with pytest.raises(TypeError, match="a backend must be") as info:
        AppRun("job-1", [backend])  # type: ignore[list-item]
    assert expected in str(info.value)
    with pytest.raises(TypeError) as info:
        as_sync(backend)  # type: ignore[arg-type]
    assert expected in str(info.value)


def test_torchx_trackers_names_a_duck_typed_factory_by_module_attr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = "tests.torchx.plugins:create_duck_with_metrics"
    monkeypatch.setenv("TORCHX_JOB_ID", "local://session/job-7")
    monkeypatch.setenv("TORCHX_TRACKERS", name)
    # torchx's variable for that name, exactly as torchx derives it (dots and colon kept).
    monkeypatch.setenv("TORCHX_TRACKER_TESTS.TORCHX.PLUGINS:CREATE_DUCK_WITH_METRICS_CONFIG", "k=v")
    monkeypatch.setenv("TORCHX_PARENT_RUN_ID", "local://session/job-6")
    run = AppRun.run_from_env()
    run.add_metadata(lr=0.1)
    run.log_metric("loss", 0.5, step=3)
    (duck,) = plugins.BUILT
    assert duck.config == "k=v"  # the config string, as torchx passes it
    assert run.status().backends.keys() == {name}  # the spool key is the name it was built under
    report = AppRun.reset_from_env()
    assert report is not None and report.ok and report.delivered == 3, report
    job = duck.runs["local://session/job-7"]
    assert job["metadata"] == {"lr": 0.1}
    assert job["sources"] == [plugins.Source("local://session/job-6", None)]
    assert [(p.name, p.step) for p in job["metrics"]] == [("loss", 3)]
    assert duck.closed == 1  # built by the run, so closed by it


def test_a_factory_returning_a_partial_tracker_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCHX_JOB_ID", "job")
    monkeypatch.setenv("TORCHX_TRACKERS", "tests.torchx.test_plugins:make_half")
    with pytest.raises(TrackerConfigError) as info:
        AppRun.run_from_env()
    message = str(info.value)
    assert "tracker 'tests.torchx.test_plugins:make_half'" in message
    assert "it lacks TrackerBase's add_artifact" in message


def make_half(config: str | None) -> HalfTracker:
    return HalfTracker()


# -- AppRun equality, as torchx's dataclass AppRun(id, backends) ---------------------------------


def test_runs_are_equal_when_id_and_backends_are() -> None:
    a, b = InMemoryTracker(), DuckTracker()
    assert AppRun("r", [a, b]) == AppRun("r", (a, b))
    assert AppRun("r", [a, b]) != AppRun("r", [b, a])  # order counts, as in torchx
    assert AppRun("r", [a]) != AppRun("r", [InMemoryTracker()])
    assert AppRun("r", [a]) != AppRun("s", [a])
    assert AppRun("r", []) == AppRun("r", [])
    assert AppRun("r", [a]) != "r"
    assert hash(AppRun("r", [a, b])) == hash(AppRun("r", [a, b]))
    assert {AppRun("r", [a]), AppRun("r", [a]), AppRun("s", [a])} == {
        AppRun("r", [a]),
        AppRun("s", [a]),
    }


def test_equal_runs_left_open_are_each_closed_at_exit(tmp_path: Path) -> None:
    """Two equal runs, neither closed: the exit hook must deliver both runs' records (the hook
    tells runs apart by identity, not equality)."""
    script = """
import sys, fsspec
from async_tracker import AppRun
from async_tracker.adapters import ForeignTracker
from async_tracker.backend.fsspec import FsspecTracker
tracker = FsspecTracker(fsspec.filesystem("file"), sys.argv[1])
first, second = AppRun("r", [tracker]), AppRun("r", [tracker])
assert first == second
first.add_metadata(a=1)
second.add_metadata(b=2)
print("written")
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "store")],
        cwd=REPO,
        env=python_env(ASYNC_TRACKER_FLUSH_INTERVAL="3600"),  # delivered only at exit
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and done.stdout.strip() == "written", done.stderr
    tracker = FsspecTracker(fsspec.filesystem("file"), str(tmp_path / "store"))
    assert tracker.metadata("r") == {"a": 1, "b": 2}


# -- AppRun.reset_from_env() ----------------------------------------------------------------------


def test_reset_from_env_closes_the_run_delivering_pending_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCHX_JOB_ID", "job-a")
    monkeypatch.setenv("TORCHX_TRACKERS", "tests.torchx.plugins:create_duck")
    monkeypatch.setenv("ASYNC_TRACKER_FLUSH_INTERVAL", "3600")  # nothing leaves before close
    first = AppRun.run_from_env()
    first.add_metadata(step=1)
    first.add_artifact("model", "/m.pt")
    (duck,) = plugins.BUILT
    assert "job-a" not in duck.runs  # still pending
    report = AppRun.reset_from_env()
    assert report is not None and report.ok and report.delivered == 2, report
    assert duck.runs["job-a"]["metadata"] == {"step": 1} and duck.closed == 1
    with pytest.raises(TrackerClosedError):
        first.add_metadata(step=2)
    # The next run is built from the environment as it is now.
    monkeypatch.setenv("TORCHX_JOB_ID", "job-b")
    second = AppRun.run_from_env()
    assert second is not first and second.id == "job-b"
    assert AppRun.run_from_env() is second
    assert len(plugins.BUILT) == 2 and plugins.BUILT[1] is not duck


def test_reset_from_env_without_a_run_returns_none() -> None:
    assert AppRun.reset_from_env() is None
    run = AppRun.run_from_env()  # TORCHX_JOB_ID unset: <UNDEFINED>, no backend
    report = AppRun.reset_from_env()
    assert report is not None and report.ok and run.closed
    assert AppRun.reset_from_env() is None


def test_reset_from_env_after_close_returns_the_close_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCHX_JOB_ID", "job-a")
    monkeypatch.setenv("TORCHX_TRACKERS", "tests.torchx.plugins:create_duck")
    run = AppRun.run_from_env()
    run.add_metadata(a=1)
    report = run.close()
    assert AppRun.reset_from_env() is report
    assert AppRun.run_from_env() is not run

