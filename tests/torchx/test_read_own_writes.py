"""A torchx user's code reads what it wrote: the flows of torchx's own AppRun tests, in
torchx's venv, with ``torchx.tracker`` replaced by ``async_tracker`` in the imports (see
async_tracker/own_writes.py). Every run flushes only when told to
(``ASYNC_TRACKER_FLUSH_INTERVAL=3600``): a read that did not wait would find nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.torchx.conftest import TorchxChild

pytestmark = pytest.mark.timeout(600)  # the first run builds torchx's venv

READS = """
import json, sys
from collections import defaultdict
from async_tracker import app_run_from_env, as_sync
from async_tracker.api import AppRun, Lineage, TrackerArtifact, TrackerBase, TrackerSource
from tests.torchx.torchx_plugins import TorchxRecordingTracker


class Backend(TrackerBase):
    # The shape of torchx's test backend: defaultdicts, returned as they are.
    def __init__(self):
        self.md = defaultdict(dict)
        self.arts = defaultdict(dict)
        self.srcs = defaultdict(dict)

    def add_artifact(self, run_id, name, path, metadata=None):
        self.arts[run_id][name] = (path, metadata)

    def artifacts(self, run_id):
        return {k: TrackerArtifact(k, p, m) for k, (p, m) in self.arts[run_id].items()}

    def add_metadata(self, run_id, **kwargs):
        self.md[run_id].update(kwargs)

    def metadata(self, run_id):
        return self.md[run_id]

    def add_source(self, run_id, source_id, artifact_name=None):
        self.srcs[run_id][artifact_name or "__parent__"] = source_id

    def sources(self, run_id, artifact_name=None):
        return [TrackerSource(s, None if a == "__parent__" else a)
                for a, s in self.srcs[run_id].items()]

    def lineage(self, run_id):
        return Lineage()

    def run_ids(self, **kwargs):
        return []


out = {}
backend = Backend()
run = AppRun("run_id", [backend])
run.add_metadata(lr=0.01, bs=25)
run.add_metadata(bs=10)
run.add_artifact("output", "/directory", {"date": "2020/01/01"})
out["metadata"] = dict(backend.metadata("run_id"))
out["artifact"] = [backend.artifacts("run_id")["output"].path,
                   backend.artifacts("run_id")["output"].metadata]

# The job's run from torchx's environment, on our fsspec store: its backend, read at once.
env_run = app_run_from_env()
env_run.add_metadata(epoch=1)
env_run.add_artifact("model", "/ckpt/m.pt")
(store,) = env_run.backends
out["env_metadata"] = dict(store.metadata(env_run.id))
out["env_artifacts"] = sorted(store.artifacts(env_run.id))
out["env_run_ids"] = sorted(store.run_ids())

# A plug-in of torchx's own class keeps its methods (not ours to wrap): read it through the
# AppRun, through as_sync(plugin), or after run.flush().
plugin = TorchxRecordingTracker()
torchx_class_run = AppRun("plugin-run", [plugin])
torchx_class_run.add_metadata(lr=0.5)
out["plugin_through_run"] = dict(torchx_class_run.metadata())
torchx_class_run.add_metadata(lr=0.55)
out["plugin_through_as_sync"] = dict(as_sync(plugin).metadata("plugin-run"))
torchx_class_run.add_metadata(lr=0.6)
torchx_class_run.flush()
out["plugin_after_flush"] = dict(plugin.metadata("plugin-run"))
for r in (run, env_run, torchx_class_run):
    r.close()
print(json.dumps(out))
"""


def test_a_torchx_users_code_reads_what_it_wrote(
    torchx_child: TorchxChild, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    config = tmp_path / "fsspec.cfg"
    config.write_text(f"protocol=file\nroot_path={store}\n")
    factory = "async_tracker.backend.fsspec:create"
    env = {
        "TORCHX_JOB_ID": "local://job/trainer",
        "TORCHX_TRACKERS": factory,
        f"TORCHX_TRACKER_{factory.upper()}_CONFIG": str(config),
        "ASYNC_TRACKER_FLUSH_INTERVAL": "3600",
    }
    seen = torchx_child(READS, env=env)
    assert seen == {
        "metadata": {"lr": 0.01, "bs": 10},
        "artifact": ["/directory", {"date": "2020/01/01"}],
        "env_metadata": {"epoch": 1},
        "env_artifacts": ["model"],
        "env_run_ids": ["local://job/trainer"],
        "plugin_through_run": {"lr": 0.5},
        "plugin_through_as_sync": {"lr": 0.55},
        "plugin_after_flush": {"lr": 0.6},
    }
