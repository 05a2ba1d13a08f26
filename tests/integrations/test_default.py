"""What the integrations share, without any framework installed: which run they log to, and
turning hyperparameters and logs into what AppRun takes."""

from __future__ import annotations

import enum
import math
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from async_tracker import AppRun
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.integrations._default import (
    RunHandle,
    flatten_params,
    json_safe,
    numeric_logs,
)
from async_tracker.runtime.ending import FINISHED, Ending
from tests.integrations.helpers import Recorder, Store


class Color(enum.Enum):
    RED = "red"


def test_flatten_params_flattens_nested_mappings_and_namespaces() -> None:
    params = Namespace(
        lr=0.1,
        model={"depth": 2, "act": {"name": "gelu"}, "none": None},
        data=Namespace(path="/data", sizes=[1, 2]),
        empty={},
    )
    assert flatten_params(params) == {
        "lr": 0.1,
        "model/depth": 2,
        "model/act/name": "gelu",
        "model/none": None,
        "data/path": "/data",
        "data/sizes": [1, 2],
        "empty": {},
    }
    assert flatten_params({"a": {"b": 1}}, sep=".") == {"a.b": 1}
    assert flatten_params({3: "int keys become text"}) == {"3": "int keys become text"}
    assert flatten_params({}) == {}


def test_json_safe_keeps_json_data_and_gives_the_text_of_anything_else() -> None:
    assert json_safe("k", [1, "a", None, {"x": 1.5}]) == [1, "a", None, {"x": 1.5}]
    assert math.isnan(json_safe("k", math.nan))  # type: ignore[arg-type]
    assert json_safe("k", (1, 2)) == [1, 2]
    assert json_safe("k", 2**70) == str(2**70)  # beyond 64 bits: no backend stores it
    assert json_safe("k", "lone \ud800") == "lone \\ud800"
    assert json_safe("k", object) == "<class 'object'>"
    # What add_metadata converts itself keeps that form (numpy scalars, Path, Enum ...);
    # anything it refuses is at least text, never an error.
    assert json_safe("k", Path("/data")) in ("/data", str(Path("/data")))
    assert json_safe("k", Color.RED) in ("red", "Color.RED")
    assert float(json_safe("k", np.float32(0.5))) == 0.5  # type: ignore[arg-type]


def test_numeric_logs_keeps_numbers_and_names_the_rest() -> None:
    logs = {
        "loss": 0.5,
        "step_count": 3,
        "np": np.float64(1.5),
        "np_0d": np.array(2.5),
        "np_many": np.ones(3),
        "text": "1.0",
        "none": None,
        "nan": math.nan,
    }
    numbers, skipped = numeric_logs(logs)
    assert {k: float(v) for k, v in numbers.items() if k != "nan"} == {
        "loss": 0.5, "step_count": 3.0, "np": 1.5, "np_0d": 2.5,
    }  # fmt: skip
    assert math.isnan(float(numbers["nan"]))
    assert skipped == ["np_many", "text", "none"]


def test_a_run_of_our_own_is_closed_by_finish_and_reopened_by_the_next_use(
    store: Store,
) -> None:
    recorder = Recorder()
    handle = RunHandle(None, None, "first", store.root, {"backends": [recorder]}, "proj")
    assert handle.current is None  # opened at first use, not before
    run = handle.get()
    assert handle.get() is run
    assert run.id.startswith("proj/first-") and handle.owned
    run.log_metric("loss", 1.0)
    handle.finish(Ending("failed"))
    assert run.closed and recorder.ended == [(run.id, "failed")]
    handle.finish(FINISHED)  # nothing more to do
    again = handle.get()
    assert again is not run and again.id == run.id
    again.log_metric("loss", 0.5)  # no step: resumed after the last one
    handle.finish(FINISHED)
    assert [(p.step, p.value) for p in store.metrics(run.id)["loss"]] == [(0, 1.0), (1, 0.5)]
    assert recorder.ended == [(run.id, "failed"), (run.id, "finished")]


def test_a_given_run_is_flushed_not_closed() -> None:
    backend = InMemoryTracker()
    with AppRun("local://tests/given", [backend]) as run:
        handle = RunHandle(run, None, None, None, {}, "proj")
        assert handle.get() is run and not handle.owned
        run.log_metric("loss", 1.0, step=0)
        handle.finish(FINISHED)
        assert not run.closed
        assert len(backend.points("local://tests/given", "loss")) == 1
    assert handle.get() is run  # closed by its owner: not reopened by us


def test_a_given_run_excludes_init_arguments() -> None:
    with AppRun("local://tests/given", [InMemoryTracker()]) as run:
        with pytest.raises(ValueError, match="project, dir"):
            RunHandle(run, "p", None, "/tmp/x", {}, "proj")
        with pytest.raises(ValueError, match="backends"):
            RunHandle(run, None, None, None, {"backends": []}, "proj")
    with pytest.raises(TypeError, match="AppRun"):
        RunHandle("local://tests/given", None, None, None, {}, "proj")  # type: ignore[arg-type]


def test_in_a_torchx_job_the_job_run_is_used_and_init_arguments_are_named_unused(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    config = tmp_path / "fsspec.cfg"
    config.write_text(f"protocol=file\nroot_path={store.root}\n")
    monkeypatch.setenv("TORCHX_JOB_ID", "local://session/job")
    monkeypatch.setenv("TORCHX_TRACKERS", "fsspec")
    monkeypatch.setenv("TORCHX_TRACKER_FSSPEC_CONFIG", str(config))
    handle = RunHandle(None, None, None, tmp_path / "elsewhere", {}, "proj")
    assert handle.get() is AppRun.run_from_env()
    assert "dir" in caplog.text and "not used" in caplog.text
    assert not handle.owned
    handle.get().log_metric("loss", 1.0, step=0)
    handle.finish(FINISHED)
    assert not AppRun.run_from_env().closed
    assert store.steps("local://session/job", "loss") == [0]
    assert not (tmp_path / "elsewhere").exists()
