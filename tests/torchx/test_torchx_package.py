"""torchx's plug-in pattern end to end, with the real ``torchx`` package (from PyPI, in its own
venv: it pins an old urllib3). Each test runs a child script there that imports this checkout
of async_tracker, and prints one JSON line of what it saw."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest

from async_tracker.backend.fsspec import FsspecTracker
from tests.torchx.conftest import TorchxChild

pytestmark = pytest.mark.timeout(600)  # the first run builds torchx's venv

SUBCLASS_AS_BACKEND = """
import json
from async_tracker import AppRun, TrackerArtifact
from torchx.tracker.api import TrackerBase as TorchxTrackerBase
from tests.torchx.torchx_plugins import TorchxRecordingTracker

plugin = TorchxRecordingTracker()
assert isinstance(plugin, TorchxTrackerBase)
with AppRun("local://job/child", [plugin]) as run:
    run.add_metadata(lr=0.1, layers=[64, 64])
    run.add_artifact("model", "s3://b/model.pt", {"epoch": 7})
    run.add_source("local://job/parent", "checkpoint")
    run.log_metric("loss", 0.5, step=1)   # a torchx plug-in has no metric method: skipped
    # Reads go through the plug-in too, and come back as our classes.
    artifacts = run.artifacts()
    assert all(type(a) is TrackerArtifact for a in artifacts.values())
    read = {
        "metadata": run.metadata(),
        "artifacts": {k: [a.path, a.metadata] for k, a in artifacts.items()},
        "sources": [[s.parent.id, s.artifact_name] for s in run.sources()],
    }
report = run.close()
stored = plugin.runs["local://job/child"]
print(json.dumps({
    "ok": report.ok,
    "delivered": report.delivered,
    "stored": {
        "metadata": stored["metadata"],
        "artifacts": {k: [a.path, a.metadata] for k, a in stored["artifacts"].items()},
        "sources": [[s.source_run_id, s.artifact_name] for s in stored["sources"]],
    },
    "read": read,
    "writes_on_main_thread": [m for m, _, main in plugin.calls if m.startswith("add_") and main],
    "writes": sorted({m for m, _, _ in plugin.calls if m.startswith("add_")}),
}))
"""


def test_a_torchx_trackerbase_subclass_is_a_backend(torchx_child: TorchxChild) -> None:
    seen = torchx_child(SUBCLASS_AS_BACKEND)
    assert seen["ok"] and seen["delivered"] == 3  # metadata, artifact, source; the metric
    stored = {  # is skipped for a backend with no metric method, not counted as delivered
        "metadata": {"lr": 0.1, "layers": [64, 64]},
        "artifacts": {"model": ["s3://b/model.pt", {"epoch": 7}]},
        "sources": [["local://job/parent", "checkpoint"]],
    }
    assert seen["stored"] == stored
    assert seen["read"] == stored
    assert seen["writes"] == ["add_artifact", "add_metadata", "add_source"]
    assert seen["writes_on_main_thread"] == []  # run in worker threads by the sync adapter


RUN_FROM_ENV = """
import json, sys, fsspec
from async_tracker import AppRun
from torchx.tracker.api import TrackerBase as TorchxTrackerBase
from torchx.tracker.backend.fsspec import FsspecTracker as TorchxFsspecTracker

run = AppRun.run_from_env()
backend = run.backends[0]
for epoch in range(3):
    run.add_metadata(epoch=epoch)
run.add_metadata(config={"layers": [64, 64]})
run.add_artifact("model", "/ckpt/m.pt", {"epoch": 2})
run.add_source("local://job/data", "dataset")
assert AppRun.run_from_env() is run
report = AppRun.reset_from_env()   # closes it: pending records delivered
assert run.closed and AppRun.run_from_env() is not run

reader = TorchxFsspecTracker(fsspec.filesystem("file"), sys.argv[1])
job = run.id
print(json.dumps({
    "backend": f"{type(backend).__module__}.{type(backend).__name__}",
    "torchx_base": isinstance(backend, TorchxTrackerBase),
    "names": list(run.status().backends),
    "ok": report.ok,
    "pending": report.pending,
    "run_ids": sorted(reader.run_ids()),
    "children": sorted(reader.run_ids(parent_run_id="local://job/parent")),
    "metadata": reader.metadata(job),
    "artifacts": {k: [a.path, a.metadata] for k, a in reader.artifacts(job).items()},
    "sources": sorted([s.source_run_id, s.artifact_name] for s in reader.sources(job)),
}))
"""


@pytest.mark.parametrize(
    "factory",
    [
        "torchx.tracker.backend.fsspec:create",  # torchx's own factory, by module:attr
        "tests.torchx.torchx_plugins:create_fsspec",  # a user's module:attr factory of one
    ],
)
def test_torchx_fsspec_factory_from_torchx_trackers(
    factory: str, torchx_child: TorchxChild, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    store.mkdir()  # torchx's FsspecTracker asserts its root exists
    config = tmp_path / "fsspec.cfg"
    config.write_text(f"# torchx's key=value file\nprotocol=file\nroot_path={store}\n")
    env = {
        "TORCHX_JOB_ID": "local://job/child",
        "TORCHX_PARENT_RUN_ID": "local://job/parent",
        "TORCHX_TRACKERS": factory,
        # torchx's name for the config variable, also for a module:attr name.
        f"TORCHX_TRACKER_{factory.upper()}_CONFIG": str(config),
        "ASYNC_TRACKER_FLUSH_INTERVAL": "3600",  # everything waits for reset_from_env()
    }
    seen = torchx_child(RUN_FROM_ENV, str(store), env=env)
    assert seen["backend"] == "torchx.tracker.backend.fsspec.FsspecTracker"
    assert seen["torchx_base"] is True
    assert seen["names"] == [factory]  # the spool key: the name it was built under
    assert seen["ok"] and seen["pending"] == 0
    # torchx's reader sees every record (one metadata file per flush: the merged view).
    assert seen["run_ids"] == ["local://job/child"]
    assert seen["children"] == ["local://job/child"]  # TORCHX_PARENT_RUN_ID became a source
    assert seen["metadata"] == {"epoch": 2, "config": {"layers": [64, 64]}}
    assert seen["artifacts"] == {"model": ["/ckpt/m.pt", {"epoch": 2}]}
    assert seen["sources"] == [["local://job/data", "dataset"], ["local://job/parent", None]]
    # And our own fsspec backend reads what torchx's wrote through our AppRun.
    ours = FsspecTracker(fsspec.filesystem("file"), str(store))
    assert ours.metadata("local://job/child") == seen["metadata"]
    assert sorted(
        (s.source_run_id, s.artifact_name) for s in ours.sources("local://job/child")
    ) == [("local://job/data", "dataset"), ("local://job/parent", None)]


CLI = """
import contextlib, io, json, sys
from async_tracker.cli.main import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main([*sys.argv[1:], "--tracker", "torchx.tracker.backend.fsspec:create"])
print(json.dumps({"code": code, "out": json.loads(out.getvalue())}))
"""


def test_the_cli_reads_through_torchx_fsspec_factory(
    torchx_child: TorchxChild, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    config = tmp_path / "fsspec.cfg"
    config.write_text(f"protocol=file\nroot_path={store}\n")
    factory = "torchx.tracker.backend.fsspec:create"
    env = {"TORCHX_TRACKERS": factory, f"TORCHX_TRACKER_{factory.upper()}_CONFIG": str(config)}
    torchx_child(RUN_FROM_ENV, str(store), env={**env, "TORCHX_JOB_ID": "local://job/parent"})
    child = {"TORCHX_JOB_ID": "local://job/child", "TORCHX_PARENT_RUN_ID": "local://job/parent"}
    torchx_child(RUN_FROM_ENV, str(store), env={**env, **child})

    def cli(*args: str) -> object:
        seen = torchx_child(CLI, *args, "--config", str(config), "--json")
        assert seen["code"] == 0
        return seen["out"]

    assert cli("list", "metadata", "local://job/child") == {
        "epoch": 2,
        "config": {"layers": [64, 64]},
    }
    # torchx's FsspecTracker leaves lineage() unimplemented: built from sources and run_ids.
    assert cli("lineage", "local://job/parent") == {
        "run_id": "local://job/parent",
        "parents": [{"run_id": "local://job/data", "artifact": "dataset", "parents": []}],
        "descendants": [{"run_id": "local://job/child", "artifact": None, "descendants": []}],
    }


MODULE_ATTR_PLUGIN = """
import json
from async_tracker import AppRun
from tests.torchx import torchx_plugins

run = AppRun.run_from_env()
run.add_metadata(lr=0.5)
run.add_artifact("log", "/logs/x.txt")
AppRun.reset_from_env()
(plugin,) = torchx_plugins.BUILT
stored = plugin.runs[run.id]
print(json.dumps({
    "config": plugin.config,
    "metadata": stored["metadata"],
    "artifacts": sorted(stored["artifacts"]),
    "sources": [[s.source_run_id, s.artifact_name] for s in stored["sources"]],
}))
"""


def test_a_module_attr_factory_of_a_torchx_plugin(torchx_child: TorchxChild) -> None:
    name = "tests.torchx.torchx_plugins:create_recording"
    env = {
        "TORCHX_JOB_ID": "job-9",
        "TORCHX_PARENT_RUN_ID": "job-8",
        "TORCHX_TRACKERS": name,
        f"TORCHX_TRACKER_{name.upper()}_CONFIG": "endpoint=http://tracking:8080",
    }
    seen = torchx_child(MODULE_ATTR_PLUGIN, env=env)
    assert seen == {
        "config": "endpoint=http://tracking:8080",  # the config string, as torchx passes it
        "metadata": {"lr": 0.5},
        "artifacts": ["log"],
        "sources": [["job-8", None]],
    }


EQUALITY = """
import json
from async_tracker import AppRun, AppRunTrackableSource
from torchx.tracker.api import AppRun as TorchxAppRun
from torchx.tracker.api import AppRunTrackableSource as TorchxSource
from tests.torchx.torchx_plugins import TorchxRecordingTracker

a, b = TorchxRecordingTracker(), TorchxRecordingTracker()
cases = {
    "same id, same backends": (("r", [a, b]), ("r", [a, b])),
    "same id, equal lists": (("r", [a]), ("r", [a])),
    "same id, backends in another order": (("r", [a, b]), ("r", [b, a])),
    "same id, other backend": (("r", [a]), ("r", [b])),
    "other id": (("r", [a]), ("s", [a])),
    "no backends": (("r", []), ("r", [])),
}
out = {}
for case, (x, y) in cases.items():
    ours = AppRun(*x) == AppRun(*y)
    out[case] = {
        "torchx": TorchxAppRun(*x) == TorchxAppRun(*y),
        "ours": ours,
        "hash_agrees": (not ours) or hash(AppRun(*x)) == hash(AppRun(*y)),
    }
# torchx's sources() gives AppRun(source_id, backends): the same holds for ours.
run = AppRun("r", [a])
run.add_source("p", "ckpt")
torchx_run = TorchxAppRun("t", [a])
torchx_run.add_source("p", "ckpt")
out["sources"] = {
    "torchx": torchx_run.sources() == [TorchxSource(TorchxAppRun("p", [a]), "ckpt")],
    "ours": run.sources() == [AppRunTrackableSource(AppRun("p", [a]), "ckpt")],
}
run.close()
print(json.dumps(out))
"""


def test_apprun_equality_agrees_with_torchx_dataclass(torchx_child: TorchxChild) -> None:
    seen = torchx_child(EQUALITY)
    for case, result in seen.items():
        assert result["ours"] == result["torchx"], case
        assert result.get("hash_agrees", True), case
    assert seen["same id, same backends"]["ours"] is True
    assert seen["other id"]["ours"] is False
    assert seen["sources"] == {"torchx": True, "ours": True}
