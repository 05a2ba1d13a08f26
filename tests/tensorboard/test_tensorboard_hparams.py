"""What TensorBoard's HParams plugin shows of runs, read with the plugin's own code (its
session-group handler over TensorBoard's multiplexer, as the HParams tab asks for them):
each run a session with every hyperparameter (lists, ``None``, dicts and numbers beyond
what it holds included, as text), started when the run started (an exported or replayed run
included) and ended with the run's status (a status spooled and delivered later included).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.data_provider import MultiplexerDataProvider
from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
from tensorboard.context import RequestContext
from tensorboard.plugins import base_plugin
from tensorboard.plugins.hparams import api_pb2, backend_context, list_session_groups

from async_tracker import AppRun, RetryPolicy, TrackerMetric
from async_tracker.adapters import as_sync
from async_tracker.backend.tensorboard import SIDE_DIR, AsyncTensorBoardTracker, run_path
from async_tracker.cli.main import main as cli_main
from async_tracker.init_run import open_store
from async_tracker.store.open import open_reader
from tests.cli.conftest import child_env

pytestmark = pytest.mark.server  # needs the tensorboard extra

ALL_STATUSES = [
    api_pb2.STATUS_UNKNOWN,
    api_pb2.STATUS_SUCCESS,
    api_pb2.STATUS_FAILURE,
    api_pb2.STATUS_RUNNING,
]
# Retries without waiting; a parked lane waits for the next flush() or close().
NO_WAIT = RetryPolicy(max_attempts=3, initial_backoff_s=0, max_backoff_s=0, jitter_s=0,
                      cooldown_s=3600)  # fmt: skip


class HParamsTab:
    """The HParams plugin's view of a log directory, through its own request handlers."""

    def __init__(self, root: Path) -> None:
        multiplexer = EventMultiplexer()
        multiplexer.AddRunsFromDirectory(str(root))
        multiplexer.Reload()
        provider = MultiplexerDataProvider(multiplexer, str(root))
        tb = base_plugin.TBContext(
            logdir=str(root), multiplexer=multiplexer, data_provider=provider
        )
        self.context = backend_context.Context(tb)

    def sessions(self) -> dict[str, tuple[api_pb2.Session, api_pb2.SessionGroup]]:
        """Each session (a run folder, "/"-separated) and its group, whatever its status."""
        request = api_pb2.ListSessionGroupsRequest(
            allowed_statuses=ALL_STATUSES, start_index=0, slice_size=1000
        )
        handler = list_session_groups.Handler(RequestContext(), self.context, "", request)
        response = handler.run()
        return {s.name: (s, g) for g in response.session_groups for s in g.sessions}

    def columns(self) -> dict[str, int]:
        """The hyperparameter columns of the table and their types."""
        metadata = self.context.hparams_metadata(RequestContext(), "")
        experiment = self.context.experiment_from_metadata(
            RequestContext(), "", False, metadata, _no_data_provider_hparams()
        )
        return {h.name: h.type for h in experiment.hparam_infos}


def _no_data_provider_hparams() -> object:
    from tensorboard.data import provider

    return provider.ListHyperparametersResult(hyperparameters=[], session_groups=[])


def session(tab: HParamsTab, run_id: str) -> tuple[api_pb2.Session, api_pb2.SessionGroup]:
    # The plugin names a session by its folder relative to the log directory.
    return tab.sessions()[os.path.join(*run_path(run_id).split("/"))]


CONFIG = {
    "lr": 0.1,
    "epochs": 3,
    "amp": True,
    "model": "mlp",
    "layers": [64, 64],
    "scheduler": None,
    "optimizer": {"name": "adam", "betas": [0.9, 0.999]},
    "seed": 2**60,  # beyond the float64 integers: text, exact
    "clip": math.nan,  # the plugin drops a NaN number
}


def test_every_run_is_a_session_with_every_hyperparameter_and_its_status(
    tmp_path: Path,
) -> None:
    root = tmp_path / "tb"
    with AppRun("sweep/fine", [AsyncTensorBoardTracker(root)]) as run:
        run.add_metadata(**CONFIG)
        run.log_metric("loss", 0.5, step=1)
    broken = AppRun("sweep/broken", [AsyncTensorBoardTracker(root)])
    with pytest.raises(RuntimeError), broken as run:
        run.add_metadata(**CONFIG)
        raise RuntimeError("the training loop failed")
    run = AppRun("sweep/stopped", [AsyncTensorBoardTracker(root)])
    run.add_metadata(**{**CONFIG, "lr": 0.01})
    assert run.close(30, reason="killed").ok

    tab = HParamsTab(root)
    statuses = {r: session(tab, f"sweep/{r}")[0].status for r in ("fine", "broken", "stopped")}
    # TensorBoard has no "aborted": a killed run did not finish, a failure.
    assert statuses == {
        "fine": api_pb2.STATUS_SUCCESS,
        "broken": api_pb2.STATUS_FAILURE,
        "stopped": api_pb2.STATUS_FAILURE,
    }
    _, group = session(tab, "sweep/fine")
    shown = {k: v.WhichOneof("kind") for k, v in group.hparams.items()}
    assert shown == {
        "lr": "number_value", "epochs": "number_value", "amp": "bool_value",
        "model": "string_value", "layers": "string_value", "scheduler": "string_value",
        "optimizer": "string_value", "seed": "string_value", "clip": "string_value",
    }  # fmt: skip
    values = {k: getattr(v, v.WhichOneof("kind")) for k, v in group.hparams.items()}
    assert values == {
        "lr": 0.1, "epochs": 3, "amp": True, "model": "mlp", "layers": "[64, 64]",
        "scheduler": "null", "optimizer": '{"name": "adam", "betas": [0.9, 0.999]}',
        "seed": str(2**60), "clip": "NaN",
    }  # fmt: skip
    # Every one a column of the table.
    assert set(tab.columns()) == set(CONFIG)
    assert tab.columns()["layers"] == api_pb2.DATA_TYPE_STRING


def test_a_session_starts_at_the_runs_first_record(tmp_path: Path) -> None:
    root = tmp_path / "tb"
    tracker = AsyncTensorBoardTracker(root)
    with AppRun("r", [tracker], flush_interval=3600) as run:
        run.log_metric("loss", 1.0, step=0)
        assert run.flush().ok
        run.log_metric("loss", 0.5, step=1)
        run.add_metadata(lr=0.1)  # a later flush holds the hparams
    first = as_sync(AsyncTensorBoardTracker(root)).metrics("r")["loss"][0].timestamp
    assert session(HParamsTab(root), "r")[0].start_time_secs == first


def test_an_exported_run_keeps_its_start_time_and_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store_dir, out = str(tmp_path / "runs"), tmp_path / "tb"
    with AppRun("proj/old", [open_store(store_dir)]) as run:
        run.add_metadata(lr=0.1, layers=[32])
    # Points the run logged long ago (their client times), stored beside.
    store = as_sync(open_store(store_dir))
    store.add_metrics("proj/old", [TrackerMetric("loss", 0.5, s, 1.7e9 + s) for s in range(5)])
    argv = ["--store", store_dir, "export", "tensorboard", "proj/old", "--out", str(out)]
    assert cli_main(argv) == 0
    capsys.readouterr()
    found, group = session(HParamsTab(out), "proj/old")
    assert found.start_time_secs == 1.7e9  # the run's, not the export's
    assert found.status == api_pb2.STATUS_SUCCESS
    ended = open_reader(store).status("proj/old")
    assert ended is not None and found.end_time_secs == pytest.approx(ended[1], abs=1e-6)
    assert group.hparams["layers"].string_value == "[32]"


def test_a_status_spooled_at_close_ends_the_session_when_delivered_later(
    tmp_path: Path,
) -> None:
    root, spool = tmp_path / "tb", tmp_path / "spool"
    tracker = AsyncTensorBoardTracker(root)
    run = AppRun("r", [tracker], spool_dir=str(spool), flush_interval=3600, retry=NO_WAIT)
    run.add_metadata(lr=0.1)
    run.log_metric("loss", 1.0, step=0)
    assert run.flush().ok
    # The run's side folder is a file at close: its end cannot be stored, and waits on disk.
    side = Path(tracker.logdir("r")) / SIDE_DIR
    side.rename(side.with_name("aside"))
    side.write_text("not a folder")
    report = run.close(2, reason="failed")
    assert report.end_spooled == 1, report
    ended = time.time()
    assert session(HParamsTab(root), "r")[0].status == api_pb2.STATUS_UNKNOWN  # not yet
    side.unlink()
    side.with_name("aside").rename(side)

    # The next life of the job delivers it: the session ends failed, when the run ended.
    again = AppRun("r", [AsyncTensorBoardTracker(root)], spool_dir=str(spool),
                   flush_interval=3600)  # fmt: skip
    try:
        assert again.flush(30).ok
        found, _ = session(HParamsTab(root), "r")
        assert found.status == api_pb2.STATUS_FAILURE
        status_files = [p for p in side.iterdir() if p.name.endswith("-status.json")]
        (status_file,) = status_files
        assert found.end_time_secs == json.loads(status_file.read_bytes())["time"] <= ended
    finally:
        again.close(30)


SPOOLING_JOB = """
import sys
from async_tracker import AppRun
from tests.faulty import FaultyTracker, Hang
# The TensorBoard store hangs: everything the job logs, and its ending, wait in the spool.
backend = FaultyTracker(name="tensorboard").always("write_batch", Hang())
run = AppRun("sweep/spooled", [backend], spool_dir=sys.argv[1], flush_interval=3600)
run.add_metadata(lr=0.1, layers=[64, 64], scheduler=None)
for step in range(20):
    run.log_metric("loss", float(step), step=step)
report = run.close(0.2, reason="killed")
assert report.spooled == 21 and report.end_spooled == 1, report
"""


def test_a_run_synced_from_a_spool_later_keeps_its_start_and_ending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root, spool = tmp_path / "tb", tmp_path / "spool"
    launched = time.time()
    subprocess.run([sys.executable, "-c", SPOOLING_JOB, str(spool)], check=True,
                   env=child_env(), timeout=120)  # fmt: skip
    ran = time.time()  # the job has exited: what it recorded happened before this
    monkeypatch.setenv("ASYNC_TRACKER_TENSORBOARD_DIR", str(root))
    assert cli_main(["sync", str(spool), "--to", "tensorboard", "--timeout", "60"]) == 0
    capsys.readouterr()
    first = as_sync(AsyncTensorBoardTracker(root)).metrics("sweep/spooled")["loss"][0]
    found, group = session(HParamsTab(root), "sweep/spooled")
    # The job's first record (its metadata, then its first point), not the sync.
    assert launched <= found.start_time_secs <= first.timestamp
    assert found.status == api_pb2.STATUS_FAILURE  # killed
    assert first.timestamp <= found.end_time_secs <= ran
    assert group.hparams["layers"].string_value == "[64, 64]"
    assert group.hparams["scheduler"].string_value == "null"
