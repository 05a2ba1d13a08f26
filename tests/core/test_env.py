"""torchx's environment wiring: TORCHX_* variables, factories by name, run_from_env()."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import async_tracker
from async_tracker import (
    ENV_TORCHX_JOB_ID,
    ENV_TORCHX_PARENT_RUN_ID,
    ENV_TORCHX_TRACKERS,
    AppRun,
    TrackerConfigError,
    app_run_from_env,
    build_trackers,
    tracker_config_env_var_name,
    trackers_from_environ,
)
from async_tracker.backend.memory import InMemoryTracker
from tests.core import factories
from tests.faulty import DictTracker, FaultyTracker

ENTRY_POINTS = """\
[async_tracker.tracker]
memtest = tests.core.factories:make_memory
shadowed = tests.core.factories:make_memory
faultytest = tests.core.factories:make_faulty
unloadable = tests.core.no_such_module:make

[torchx.tracker]
torchxonly = tests.core.factories:make_dict
shadowed = tests.core.factories:make_not_a_tracker
"""


@pytest.fixture(autouse=True)
def fake_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A distribution on sys.path that registers test factories as entry points, the way an
    installed plug-in would (importlib.metadata scans sys.path when asked)."""
    dist = tmp_path / "site" / "fake_trackers-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-trackers\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    factories.reset()
    yield
    factories.reset()


def test_env_variable_names() -> None:
    assert ENV_TORCHX_TRACKERS == "TORCHX_TRACKERS"
    assert ENV_TORCHX_PARENT_RUN_ID == "TORCHX_PARENT_RUN_ID"
    assert ENV_TORCHX_JOB_ID == "TORCHX_JOB_ID"
    assert tracker_config_env_var_name("fsspec") == "TORCHX_TRACKER_FSSPEC_CONFIG"
    assert tracker_config_env_var_name("my_Tracker") == "TORCHX_TRACKER_MY_TRACKER_CONFIG"


def test_trackers_from_environ_passes_each_config_string(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHX_TRACKERS", "memtest, torchxonly,tests.core.factories:Nested.make")
    monkeypatch.setenv("TORCHX_TRACKER_MEMTEST_CONFIG", "s3://bucket/cfg.txt")
    monkeypatch.setenv("TORCHX_TRACKER_TESTS.CORE.FACTORIES:NESTED.MAKE_CONFIG", "nested=1")
    trackers = trackers_from_environ()
    assert factories.CALLS == [
        ("make_memory", "s3://bucket/cfg.txt"),
        ("make_dict", None),  # no TORCHX_TRACKER_TORCHXONLY_CONFIG: the factory gets None
        ("Nested.make", "nested=1"),
    ]
    assert trackers == factories.BUILT
    assert [type(t) for t in trackers] == [InMemoryTracker, DictTracker, InMemoryTracker]


def test_no_trackers_variable_builds_nothing() -> None:
    assert trackers_from_environ() == []
    assert factories.CALLS == []


def test_build_trackers_with_module_attr_path() -> None:
    trackers = build_trackers({"tests.core.factories:make_dict": "a=b", "memtest": None})
    assert factories.CALLS == [("make_dict", "a=b"), ("make_memory", None)]
    assert isinstance(trackers[0], DictTracker) and isinstance(trackers[1], InMemoryTracker)


def test_entry_points_of_our_group_shadow_torchx_ones() -> None:
    (tracker,) = build_trackers({"shadowed": "x"})
    assert isinstance(tracker, InMemoryTracker)
    assert factories.CALLS == [("make_memory", "x")]


def test_unknown_name_raises_naming_it_and_what_was_tried() -> None:
    with pytest.raises(TrackerConfigError) as info:
        build_trackers({"no_such_tracker": None})
    message = str(info.value)
    assert "no_such_tracker" in message
    assert "async_tracker.tracker" in message and "torchx.tracker" in message
    assert "module path" in message
    assert isinstance(info.value, ValueError)  # torchx-era callers catching ValueError


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("tests.core.factories:no_such_attr", "no_such_attr"),
        ("tests.core.no_such_module:make", "no_such_module"),
        ("tests.core.factories:NOT_CALLABLE", "not callable"),
        ("unloadable", "failed to load"),
        ("tests.core.factories:make_broken", "cannot build from 'cfg'"),
        ("tests.core.factories:make_not_a_tracker", "not a TrackerBase"),
    ],
)
def test_factories_that_cannot_be_used_raise_a_config_error(name: str, expected: str) -> None:
    with pytest.raises(TrackerConfigError) as info:
        build_trackers({name: "cfg"})
    assert name in str(info.value)
    assert expected in str(info.value)


def test_run_from_env_wires_job_id_trackers_and_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHX_JOB_ID", "local://session/app-1")
    monkeypatch.setenv("TORCHX_TRACKERS", "memtest,torchxonly")
    monkeypatch.setenv("TORCHX_TRACKER_MEMTEST_CONFIG", "root=/tmp/x")
    run = AppRun.run_from_env()
    assert run.id == run.job_id() == "local://session/app-1"
    assert factories.CALLS == [("make_memory", "root=/tmp/x"), ("make_dict", None)]
    mem, plain = factories.BUILT
    assert isinstance(mem, InMemoryTracker) and isinstance(plain, DictTracker)
    # Backends built from TORCHX_TRACKERS are known by their factory names (the spool key).
    run.add_metadata(lr=0.1)
    run.log_metric("loss", 0.5, step=1)
    assert run.flush().ok
    assert set(run.status().backends) == {"memtest", "torchxonly"}
    assert mem.runs["local://session/app-1"].metadata == {"lr": 0.1}
    assert mem.points("local://session/app-1", "loss")[0].value == 0.5
    assert plain.metadata("local://session/app-1") == {"lr": 0.1}


def test_parent_run_id_becomes_a_source_through_the_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCHX_JOB_ID", "child-job")
    monkeypatch.setenv("TORCHX_TRACKERS", "memtest")
    monkeypatch.setenv("TORCHX_PARENT_RUN_ID", "parent-job")
    monkeypatch.setenv("ASYNC_TRACKER_FLUSH_INTERVAL", "3600")
    run = AppRun.run_from_env()
    (mem,) = factories.BUILT
    assert isinstance(mem, InMemoryTracker)
    # Queued like any write, not written while the run was being built.
    assert mem.runs == {}
    assert run.status().backends["memtest"].buffered == 1
    assert [(s.parent.id, s.artifact_name) for s in run.sources()] == [("parent-job", None)]
    assert [r.id for r in AppRun("parent-job", [mem]).children()] == ["child-job"]
    lineage = run.lineage()
    assert [(p.source_run_id, p.artifact_name) for p in lineage.parents] == [("parent-job", None)]


def test_undefined_job_id_writes_go_nowhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHX_TRACKERS", "memtest")
    monkeypatch.setenv("TORCHX_PARENT_RUN_ID", "parent-job")
    run = AppRun.run_from_env()
    assert run.id == "<UNDEFINED>"
    run.add_metadata(lr=0.1)
    run.add_artifact("model", "/m.pt", {"epoch": 1})
    run.add_source("data", "dataset")
    run.log_metric("loss", 0.5)
    run.log_metrics({"a": 1.0, "b": 2.0}, step=3)
    report = run.flush()
    assert report.delivered == 0 and report.pending == 0 and report.ok
    assert run.metadata() == {} and run.artifacts() == {} and run.metrics() == {}
    assert run.sources() == [] and run.children() == []
    for built in factories.BUILT:  # if the factory was called at all, nothing reached it
        assert isinstance(built, InMemoryTracker) and built.runs == {}
    # Programmer errors still raise at the call site.
    with pytest.raises(TypeError, match="loss"):
        run.log_metric("loss", "high")  # type: ignore[arg-type]
    assert run.close().ok


def test_run_from_env_is_a_per_process_singleton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHX_JOB_ID", "job-2")
    monkeypatch.setenv("TORCHX_TRACKERS", "memtest")
    first = AppRun.run_from_env()
    assert AppRun.run_from_env() is first
    assert app_run_from_env() is first
    assert async_tracker.app_run_from_env is app_run_from_env
    assert factories.CALLS == [("make_memory", None)]  # built once
    first.close()
    async_tracker.run._env_run = None
    assert AppRun.run_from_env() is not first


def test_run_from_env_reads_options_from_async_tracker_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCHX_JOB_ID", "job-3")
    monkeypatch.setenv("TORCHX_TRACKERS", "memtest")
    monkeypatch.setenv("ASYNC_TRACKER_FLUSH_INTERVAL", "12.5")
    monkeypatch.setenv("ASYNC_TRACKER_BATCH_SIZE", "7")
    monkeypatch.setenv("ASYNC_TRACKER_CLOSE_TIMEOUT", "3")
    monkeypatch.setenv("ASYNC_TRACKER_STRICT", "yes")
    options = AppRun.run_from_env().options
    assert (options.flush_interval, options.batch_size, options.close_timeout, options.strict) == (
        12.5,
        7,
        3.0,
        True,
    )


def test_bad_option_variable_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHX_JOB_ID", "job-4")
    monkeypatch.setenv("ASYNC_TRACKER_BATCH_SIZE", "many")
    with pytest.raises(ValueError, match="ASYNC_TRACKER_BATCH_SIZE"):
        AppRun.run_from_env()


def test_run_from_env_unknown_tracker_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHX_JOB_ID", "job-5")
    monkeypatch.setenv("TORCHX_TRACKERS", "memtest,typo_tracker")
    with pytest.raises(TrackerConfigError, match="typo_tracker"):
        AppRun.run_from_env()


def test_close_closes_the_backends_the_run_built_but_not_the_callers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCHX_JOB_ID", "job-6")
    monkeypatch.setenv("TORCHX_TRACKERS", "faultytest")
    run = AppRun.run_from_env()
    run.add_metadata(a=1)
    assert run.close().ok
    (built,) = factories.BUILT
    assert isinstance(built, FaultyTracker) and built.closed

    mine = FaultyTracker()
    with AppRun("job-7", [mine]) as other:
        other.add_metadata(a=1)
    assert not mine.closed
    assert mine.inner.runs["job-7"].metadata == {"a": 1}  # type: ignore[attr-defined]


def test_close_is_bounded_when_a_built_backend_hangs_in_aclose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCHX_JOB_ID", "job-8")
    monkeypatch.setenv("TORCHX_TRACKERS", "faultytest")
    monkeypatch.setenv("TORCHX_TRACKER_FAULTYTEST_CONFIG", "hang-on-close")
    run = AppRun.run_from_env()
    run.add_metadata(a=1)
    (built,) = factories.BUILT
    assert isinstance(built, FaultyTracker)
    # The record delivered before close() (its lane may start late on a loaded machine):
    # what the short timeout bounds is the hang in aclose.
    run.flush(timeout=0)
    assert built.wait_for("write_batch", 1, outcome="ok")
    report = run.close(timeout=0.5)
    assert report.delivered == 1 and report.pending == 0
    # aclose was reached, hung, and was abandoned at the deadline.
    assert built.wait_for("aclose", 1, outcome="cancelled")
    assert not built.closed
