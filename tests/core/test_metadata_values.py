"""Metadata values users have (numpy, dataclasses, Namespace, Path, Enum, datetime): converted
at the call site to their JSON form, stored as such by a real store and read back."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import enum
import json
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import fsspec
import pytest

from async_tracker import AppRun
from async_tracker.backend.fsspec import FsspecTracker
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.records import MAX_METADATA_ARRAY, check_metadata

np = pytest.importorskip("numpy")

MakeRun = Callable[..., AppRun]


class Mode(enum.Enum):
    TRAIN = "train"
    PAIR = (1, 2)


class Level(enum.IntEnum):
    HIGH = 3


@dataclasses.dataclass
class Optim:
    lr: float
    betas: tuple[float, float] = (0.9, 0.999)


@dataclasses.dataclass
class Config:
    name: str
    optim: Optim
    out: Path
    mode: Mode = Mode.TRAIN
    started: datetime.date = datetime.date(2026, 1, 2)


def test_values_with_an_obvious_json_form_round_trip_through_a_store(
    make_run: MakeRun, tmp_path: Path
) -> None:
    store = FsspecTracker(fsspec.filesystem("file"), str(tmp_path / "runs"))
    run = make_run("r", [store])
    args = argparse.Namespace(batch_size=np.int64(32), dropout=np.float32(0.5), tags=["a"])
    run.add_metadata(
        lr=np.float32(0.1),
        steps=np.int64(1000),
        flag=np.bool_(True),
        weights=np.array([[1, 2], [3, 4]], dtype=np.int32),
        config=Config("exp", Optim(3e-4), Path("/data/out")),
        args=args,
        where=PurePosixPath("a/b.txt"),
        mode=Mode.PAIR,
        level=Level.HIGH,
        when=datetime.datetime(2026, 3, 4, 5, 6, 7, tzinfo=datetime.timezone.utc),
        at=datetime.time(12, 30),
        np_text=np.str_("text"),
    )
    assert run.flush().ok
    expected = {
        "lr": float(np.float32(0.1)),
        "steps": 1000,
        "flag": True,
        "weights": [[1, 2], [3, 4]],
        "config": {
            "name": "exp",
            "optim": {"lr": 3e-4, "betas": [0.9, 0.999]},
            "out": "/data/out",
            "mode": "train",
            "started": "2026-01-02",
        },
        "args": {"batch_size": 32, "dropout": 0.5, "tags": ["a"]},
        "where": "a/b.txt",
        "mode": [1, 2],
        "level": 3,
        "when": "2026-03-04T05:06:07+00:00",
        "at": "12:30:00",
        "np_text": "text",
    }
    assert run.metadata() == expected
    # Plain JSON types, not subclasses (IntEnum, numpy.str_) that a backend might render
    # differently (an IntEnum's str() is its name in some Python versions).
    copied = check_metadata({"level": Level.HIGH, "text": np.str_("t"), "x": np.float64(1.5)})
    assert [type(v) for v in copied.values()] == [int, str, float]
    assert json.loads(json.dumps(copied)) == {"level": 3, "text": "t", "x": 1.5}


@pytest.mark.parametrize(
    "value, error, message",
    [
        (np.zeros(MAX_METADATA_ARRAY + 1), ValueError, "1001 values is too large"),
        (np.complex64(1 + 2j), TypeError, "complex is not JSON data"),
        ({1, 2}, TypeError, "set is not JSON data"),
        (datetime.timedelta(seconds=3), TypeError, "timedelta is not JSON data"),
        (object(), TypeError, "object is not JSON data"),
        (Optim, TypeError, "type is not JSON data"),  # a dataclass class, not an instance
    ],
    ids=["big-array", "complex", "set", "timedelta", "object", "class"],
)
def test_values_without_a_json_form_are_refused_naming_the_key(
    make_run: MakeRun, value: object, error: type[Exception], message: str
) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    with pytest.raises(error, match=message) as info:
        run.add_metadata(good=1, cfg={"inner": value})
    assert "'cfg.inner'" in str(info.value)
    assert run.flush().ok
    assert run.metadata() == {}  # nothing of the refused call was kept


def test_small_tensors_are_lists_and_others_are_refused_naming_the_key(
    make_run: MakeRun,
) -> None:
    torch = pytest.importorskip("torch")
    run = make_run("r", [InMemoryTracker()])
    run.add_metadata(scale=torch.tensor([0.5, 0.25]), lr=torch.tensor(0.125))
    assert run.flush().ok
    assert run.metadata() == {"scale": [0.5, 0.25], "lr": 0.125}
    with pytest.raises(ValueError, match="'w': a tensor of 2000 values is too large"):
        run.add_metadata(w=torch.zeros(2000))
    with pytest.raises(TypeError, match="'m': a tensor on the meta device"):
        run.add_metadata(m=torch.tensor(1.0, device="meta"))


def test_a_dataclass_that_contains_itself_is_refused_as_a_cycle() -> None:
    @dataclasses.dataclass
    class Node:
        name: str
        parent: object = None

    node = Node("a")
    node.parent = node
    with pytest.raises(ValueError, match=r"'tree\.parent'.*cycle"):
        check_metadata({"tree": node})
    ns = argparse.Namespace()
    ns.me = ns
    with pytest.raises(ValueError, match="cycle"):
        check_metadata({"args": ns})


@dataclasses.dataclass
class Derived:
    base: int = 1
    scaled: int = dataclasses.field(init=False)


class RaisingRepr:
    """A value whose repr raises, as some proxies and half-built objects do."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    def __index__(self) -> int:
        raise TypeError("not an index")


class RaisingReprName(str):
    """A str whose repr raises (a proxy, a lazy string of some config library)."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def _nested(depth: int) -> dict[str, object]:
    top: dict[str, object] = {}
    inner = top
    for _ in range(depth):
        inner["a"] = {}
        inner = inner["a"]  # type: ignore[assignment]
    return top


@pytest.mark.parametrize(
    "value, error, message",
    [
        (np.clongdouble(1 + 2j), TypeError, "clongdouble is not JSON data"),
        (_nested(3000), ValueError, "nests deeper than 100 levels"),
        (Derived(), ValueError, "field 'scaled' of Derived is not set"),
    ],
    ids=["clongdouble", "3000-deep", "unset-init-false-field"],
)
def test_odd_values_are_refused_naming_the_key_and_the_rest_is_kept(
    make_run: MakeRun, value: object, error: type[Exception], message: str
) -> None:
    # Each of these once escaped as RecursionError or AttributeError from inside the checks.
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    with pytest.raises(error, match=message) as info:
        run.add_metadata(cfg=value)
    assert "'cfg" in str(info.value)
    run.add_metadata(lr=0.5)
    assert run.flush().ok
    assert run.metadata() == {"lr": 0.5}  # the refused call kept nothing; later calls work


def test_a_longdouble_is_its_float_and_a_config_at_the_depth_bound_is_kept(
    make_run: MakeRun,
) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    run.add_metadata(eps=np.longdouble(0.5), deep=_nested(99))
    assert run.flush().ok
    assert run.metadata()["eps"] == 0.5
    assert run.metadata()["deep"] == _nested(99)


@pytest.mark.parametrize(
    "call, error, key",
    [
        (lambda r: r.log_metric(RaisingRepr(), 1.0, 1), TypeError, "metric name"),  # type: ignore[arg-type]
        (lambda r: r.log_metric("loss", 1.0, RaisingRepr()), TypeError, "'loss'"),  # type: ignore[arg-type]
        (lambda r: r.log_metrics({"loss": 1.0}, step=RaisingRepr()), TypeError, "'loss'"),  # type: ignore[arg-type]
        (lambda r: r.log_metric("loss", np.clongdouble(1 + 1j), 1), TypeError, "'loss'"),
        (lambda r: r.log_metric("loss", np.array([1 + 1j]), 1), TypeError, "'loss'"),
        # A str whose repr raises: the error names the key, as its str value.
        (lambda r: r.log_metric(RaisingReprName("loss"), "x", 1), TypeError, "'loss'"),
        (lambda r: r.log_metric(RaisingReprName("loss"), 1.0, "s"), TypeError, "'loss'"),  # type: ignore[arg-type]
        (lambda r: r.log_metrics({RaisingReprName("loss"): "x"}, 1), TypeError, "'loss'"),
        (lambda r: r.add_metadata(**{RaisingReprName("cfg"): object()}), TypeError, "'cfg'"),
        (lambda r: r.add_artifact(RaisingReprName("ckpt"), 5), TypeError, "'ckpt'"),  # type: ignore[arg-type]
    ],
    ids=["name-repr-raises", "step-repr-raises", "steps-repr-raises", "complex", "complex-array",
         "str-name-repr-raises-value", "str-name-repr-raises-step", "str-names-repr-raises",
         "str-metadata-key-repr-raises", "str-artifact-name-repr-raises"],
)
def test_metric_names_steps_and_values_that_fight_back_get_a_clear_error(
    make_run: MakeRun, call: Callable[[AppRun], None], error: type[Exception], key: str
) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    with pytest.raises(error) as info:
        call(run)
    assert key in str(info.value)
    run.log_metric("loss", np.longdouble(0.25), 0)
    assert run.flush().ok
    assert [(p.step, p.value) for p in mem.points("r", "loss")] == [(0, 0.25)]


def test_values_are_read_while_another_thread_imports_numpy(
    make_run: MakeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """numpy half imported, in sys.modules without its types yet: as the caller sees it while
    the fsspec store imports it on the tracker's thread, at its first metric write. The
    caller's values are read as ever (none can be numpy's yet)."""
    import sys
    import types

    mem = InMemoryTracker()
    run = make_run("r", [mem])
    monkeypatch.setitem(sys.modules, "numpy", types.ModuleType("numpy"))
    run.log_metric("loss", 0.5, 1)
    run.add_metadata(lr=0.01, path=PurePosixPath("/data"))
    with pytest.raises(TypeError, match="set is not JSON data"):
        run.add_metadata(tags={"a"})
    monkeypatch.undo()
    assert run.flush().ok
    assert [(p.step, p.value) for p in mem.points("r", "loss")] == [(1, 0.5)]
    assert mem.runs["r"].metadata == {"lr": 0.01, "path": "/data"}
