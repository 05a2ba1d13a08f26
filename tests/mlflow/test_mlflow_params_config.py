"""``log_params_flat`` (torchx's flattening of nested configs into MLflow params) and
``create_tracker`` (the ``[tracker:mlflow]`` section of a ``.torchxconfig``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from async_tracker import AppRun, build_trackers
from async_tracker.backend.mlflow import (
    AsyncMLflowTracker,
    MLflowTracker,
    create_tracker,
    flatten_params,
)
from async_tracker.errors import TrackerConfigError

# Trackers built here without a tracking URI open the default local SQLite store, where MLflow
# uses SQLAlchemy APIs that SQLAlchemy 2.1 deprecates (our warnings are errors).
pytestmark = pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SADeprecationWarning")


# -- log_params_flat ---------------------------------------------------------------------------
@dataclass
class Optim:
    name: str = "adam"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])


@dataclass
class Block:
    width: int
    act: str = "relu"


class Mode(enum.Enum):
    TRAIN = "train"


@dataclass
class Config:
    i: int = 1
    f: float = 2.1
    s: str = "string"
    flag: bool = True
    nothing: None = None
    tags: list[str] = field(default_factory=lambda: ["a", "b", "c"])
    blocks: list[Block] = field(default_factory=lambda: [Block(8), Block(16, "gelu")])
    optim: Optim = field(default_factory=Optim)
    extra: dict[str, Any] = field(
        default_factory=lambda: {"warmup": {"steps": 100}, "empty": {}, "none": []}
    )
    mode: Mode = Mode.TRAIN


EXPECTED = {
    "i": "1",
    "f": "2.1",
    "s": "string",
    "flag": "True",
    "nothing": "None",
    "tags": "['a', 'b', 'c']",
    "blocks._0.width": "8",
    "blocks._0.act": "relu",
    "blocks._1.width": "16",
    "blocks._1.act": "gelu",
    "optim.name": "adam",
    "optim.betas": "[0.9, 0.999]",
    "extra.warmup.steps": "100",
    "extra.empty": "{}",
    "extra.none": "[]",
    "mode": "Mode.TRAIN",
}


def test_flatten_nested_dataclasses_lists_and_dicts() -> None:
    assert flatten_params(Config()) == EXPECTED
    assert flatten_params({"a": Config()}, key="cfg")["cfg.a.blocks._1.act"] == "gelu"
    assert flatten_params([{"x": 1}, {"x": 2}], key="runs") == {"runs._0.x": "1", "runs._1.x": "2"}
    assert flatten_params("bare", key="k") == {"k": "bare"}


def test_flatten_refuses_what_mlflow_would() -> None:
    with pytest.raises(ValueError, match="needs a key"):
        flatten_params(3)
    with pytest.raises(ValueError, match=r"param 'big'.*6001 characters"):
        flatten_params({"big": "x" * 6001})
    with pytest.raises(ValueError, match=r"param 'a b\?'"):
        flatten_params({"a b?": 1})
    with pytest.raises(ValueError, match="two values flatten to this key"):
        flatten_params({"a": {"b": 1}, "a.b": 2})


def test_log_params_flat_round_trip(tracking_uri: str, experiment_name: str) -> None:
    tracker = MLflowTracker(experiment_name, tracking_uri)
    tracker.log_params_flat("r", Config())
    tracker.log_params_flat("r", {"lr": 0.1}, key="sched")
    assert tracker.get_run("r").data.params == {**EXPECTED, "sched.lr": "0.1"}
    tracker.close()


async def test_async_log_params_flat_many_params(tracking_uri: str, experiment_name: str) -> None:
    backend = AsyncMLflowTracker(experiment_name, tracking_uri)
    cfg = {f"layer{i}": {"w": i, "b": [i, i + 1]} for i in range(120)}  # 240 params > 100
    await backend.log_params_flat("r", cfg)
    run = await backend.get_run("r")
    assert len(run.data.params) == 240 and run.data.params["layer119.b"] == "[119, 120]"
    await backend.aclose()


# -- metadata as params: the first write of a key ---------------------------------------------
def test_first_metadata_write_of_a_key_is_params_later_writes_are_tags(
    tracking_uri: str, experiment_name: str
) -> None:
    tracker = MLflowTracker(experiment_name, tracking_uri)
    with AppRun("r", [tracker], flush_interval=3600) as run:
        run.add_metadata(lr=0.1, model={"depth": 4, "opt": {"betas": [0.9, 0.99]}})
        assert run.flush(timeout=30).ok
        run.add_metadata(lr=0.05, epoch=1)  # lr again: a tag only (params are immutable)
        assert run.flush(timeout=30).ok
        run.add_metadata(epoch=2)
    mlrun = tracker.get_run("r")
    assert mlrun.data.params == {
        "lr": "0.1",
        "model.depth": "4",
        "model.opt.betas": "[0.9, 0.99]",
        "epoch": "1",
    }
    # metadata() reads the tags: every key's latest value, typed.
    assert tracker.metadata("r") == {
        "lr": 0.05,
        "model": {"depth": 4, "opt": {"betas": [0.9, 0.99]}},
        "epoch": 2,
    }


def test_another_process_first_write_keeps_the_param_and_sets_the_tag(
    tracking_uri: str, experiment_name: str, client: Any
) -> None:
    first = MLflowTracker(experiment_name, tracking_uri)
    first.add_metadata("r", lr=0.1)
    other = MLflowTracker(experiment_name, tracking_uri)  # another rank, or a resumed job
    other.add_metadata("r", lr=0.2, bs=64)  # no error: lr is a param already
    uuid = first.get_run_id("r")
    # A third process logs wd between `other` reading the run's params and sending its own:
    # MLflow refuses the changed value; `other` reads the params again and sends the rest.
    client.log_param(uuid, "wd", "0.01")
    other.add_metadata("r", wd=0.1, warmup=100)
    assert client.get_run(uuid).data.params == {
        "lr": "0.1", "bs": "64", "wd": "0.01", "warmup": "100"
    }
    assert other.metadata("r") == {"lr": 0.2, "bs": 64, "wd": 0.1, "warmup": 100}
    first.close()
    other.close()


# -- create_tracker ------------------------------------------------------------------------------
def write_config(directory: Path, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / ".torchxconfig"
    path.write_text(text)
    return path


def test_create_tracker_from_a_directory_or_the_file(tmp_path: Path) -> None:
    path = write_config(
        tmp_path / "proj",
        "[torchx:tracker]\nmlflow=async_tracker.backend.mlflow:create_tracker\n\n"
        "[tracker:mlflow]\nexperiment_name = my-exp\ntracking_uri = http://127.0.0.1:5055\n"
        "artifact_location = s3://bucket/%%prefix\nconfig = ignored\n",
    )
    for config in (str(path.parent), str(path)):
        tracker = create_tracker(config)
        assert isinstance(tracker, MLflowTracker)
        assert tracker.experiment_name == "my-exp"
        assert tracker.tracking_uri == "http://127.0.0.1:5055"
        assert tracker.mlflow.artifact_location_requested == "s3://bucket/%%prefix"


def test_experiment_name_from_the_environment_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_config(tmp_path, "[tracker:mlflow]\nexperiment_name = from-file\n")
    monkeypatch.setenv("TORCHX_TRACKING_EXPERIMENT_NAME", "from-env")
    assert create_tracker(str(path)).experiment_name == "from-env"


def test_no_config_means_defaults() -> None:
    for config in (None, ""):
        tracker = create_tracker(config)
        assert tracker.experiment_name.startswith("default-experiment/")
        assert tracker.tracking_uri.startswith("sqlite:///")


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (
            lambda d: str(d / "missing"),
            "neither a directory holding .torchxconfig nor a config file",
        ),
        (lambda d: str(d), "has no .torchxconfig file"),
        (
            lambda d: str(write_config(d, "[tracker:mlflow\nexperiment_name = x\n")),
            "cannot be read: MissingSectionHeaderError",
        ),
        (
            lambda d: str(write_config(d, "[tracker:fsspec]\nroot_path = /x\n")),
            r"has no \[tracker:mlflow\] section \(sections: tracker:fsspec\)",
        ),
        (
            lambda d: str(write_config(d, "[tracker:mlflow]\nexperiment = typo\n")),
            r"unknown keys \['experiment'\]",
        ),
        (
            lambda d: str(
                (d / ".torchxconfig").write_bytes(b"[tracker:mlflow]\n\xff\xfe") and d
            ),
            "cannot be read: UnicodeDecodeError",
        ),
    ],
    ids=["missing-path", "dir-without-file", "malformed", "no-section", "unknown-key", "binary"],
)
def test_unreadable_config_is_a_clear_error(setup: Any, message: str, tmp_path: Path) -> None:
    config = setup(tmp_path)
    pattern = message.replace(".torchxconfig", r"\.torchxconfig")
    with pytest.raises(TrackerConfigError, match=pattern):
        create_tracker(config)


def test_the_mlflow_entry_point_builds_it(tmp_path: Path) -> None:
    path = write_config(tmp_path, "[tracker:mlflow]\nexperiment_name = via-entry-point\n")
    (tracker,) = build_trackers({"mlflow": str(path)})
    assert isinstance(tracker, MLflowTracker)
    assert tracker.experiment_name == "via-entry-point"
    with pytest.raises(TrackerConfigError, match=r"mlflow tracker config .*nowhere' is neither"):
        build_trackers({"mlflow": str(tmp_path / "nowhere")})


def test_torchx_import_path() -> None:
    import async_tracker.mlflow as torchx_path

    assert torchx_path.MLflowTracker is MLflowTracker
    assert torchx_path.create_tracker is create_tracker
    assert set(torchx_path.__all__) <= set(dir(torchx_path))
