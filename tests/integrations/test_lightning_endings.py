"""How AsyncTrackerLogger's runs end in each of Lightning's paths: an exception in a step
(failed, with its type and message), Ctrl-C (Lightning catches it, finalizes the loggers as
"failed" and exits 1: killed), SIGTERM (killed, whichever handler sees it first), for a run
of the logger's own and for a torchx job's run; and the arguments Lightning's own loggers
accept (an empty name). Exits run in real child processes, signalled with ``os.kill``."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("lightning.pytorch")

from async_tracker import Store
from async_tracker.integrations.lightning import AsyncTrackerLogger
from tests.core.helpers import Child
from tests.integrations.helpers import Recorder
from tests.integrations.helpers import Store as StoreDir
from tests.integrations.test_lightning import Tiny, loader, trainer

pytestmark = [
    pytest.mark.server,  # needs the lightning extra (CI runs it on 3.11 only)
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)`:FutureWarning"),
    pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning"),
]


def test_an_empty_project_or_name_is_taken_as_not_given(tmp_path: Path, store: StoreDir) -> None:
    # As Lightning's own loggers take name="" (TensorBoardLogger: no sub-directory).
    logger = AsyncTrackerLogger(project="", name="", dir=store.root)
    assert logger.name == "lightning"
    assert logger.run_id is not None and logger.run_id.startswith("lightning/run-")
    trainer(tmp_path, logger).fit(Tiny(), loader())
    assert store.run_ids() == [logger.run_id]


def test_an_exception_in_a_step_ends_the_run_failed_with_its_type_and_message(
    tmp_path: Path, store: StoreDir
) -> None:
    recorder = Recorder()
    logger = AsyncTrackerLogger(dir=store.root, backends=[recorder])
    with pytest.raises(RuntimeError):
        trainer(tmp_path, logger).fit(Tiny(fail_at=3), loader())
    assert logger.run_id is not None
    assert recorder.ended == [(logger.run_id, "failed")]
    run = Store(str(store.root)).run(logger.run_id)
    assert (run.status, run.cause) == ("failed", "RuntimeError: the training step failed")


# argv: the store, then "ctrl-c" (says "ready" at the second step's end and waits for the
# test's SIGINT) or "sigterm" (says "ready", then idles until Lightning has seen the test's
# SIGTERM). With TORCHX_JOB_ID set, the logger logs to the job's run.
FIT = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as in a terminal
import lightning.pytorch as pl
from async_tracker.integrations.lightning import AsyncTrackerLogger
from tests.integrations.test_lightning import Tiny, loader, trainer
from pathlib import Path

store, mode = sys.argv[1], sys.argv[2]

class Waits(pl.Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if batch_idx == 1:
            print("ready", flush=True)
            if mode == "ctrl-c":
                while True:  # sleeps (a SIGINT before a blocking read would never be handled): the
                    time.sleep(0.05)  # SIGINT interrupts one: KeyboardInterrupt
            else:
                while not trainer.received_sigterm:  # Lightning's handler sets it
                    time.sleep(0.01)

logger = AsyncTrackerLogger(dir=store) if store != "-" else AsyncTrackerLogger()
trainer(Path(store).parent if store != "-" else Path("."), logger,
        callbacks=[Waits()]).fit(Tiny(), loader())
"""


def run_fit(store: StoreDir, mode: str, sig: int, **env: str) -> int:
    """Runs FIT until it says it is ready, signals it, and returns its exit code."""
    job = Child(FIT, str(store.root) if "TORCHX_JOB_ID" not in env else "-", mode, **env)
    try:
        while job.readline(240) != "ready":  # Lightning prints its own lines too
            pass
        os.kill(job.proc.pid, sig)
        return job.wait(240)
    finally:
        job.close()


@pytest.mark.timeout(600)  # a child importing torch and Lightning on a loaded machine
def test_ctrl_c_during_fit_ends_the_run_killed(store: StoreDir) -> None:
    # Lightning catches the KeyboardInterrupt, finalizes its loggers, then sys.exit(1).
    assert run_fit(store, "ctrl-c", signal.SIGINT) == 1
    (run,) = Store(str(store.root)).runs()
    assert (run.status, run.cause) == ("killed", "KeyboardInterrupt")


@pytest.mark.timeout(600)
def test_ctrl_c_during_fit_in_a_torchx_job_ends_the_jobs_run_killed(
    tmp_path: Path, store: StoreDir
) -> None:
    # The job's run is not the logger's: finalize reports how the training ended, and the
    # exit hook's close (after sys.exit(1), which Python does not record) ends the run so.
    config = tmp_path / "fsspec.cfg"
    config.write_text(f"protocol=file\nroot_path={store.root}\n")
    env = {
        "TORCHX_JOB_ID": "local://session/fit-1",
        "TORCHX_TRACKERS": "fsspec",
        "TORCHX_TRACKER_FSSPEC_CONFIG": str(config),
    }
    assert run_fit(store, "ctrl-c", signal.SIGINT, **env) == 1
    run = Store(str(store.root)).run("local://session/fit-1")
    assert (run.status, run.cause) == ("killed", "KeyboardInterrupt")


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("ours", "code"), [("1", -signal.SIGTERM), ("0", 0)])
def test_sigterm_during_fit_ends_the_run_killed(store: StoreDir, ours: str, code: int) -> None:
    # "1": the tracker's handler ends the runs and lets SIGTERM kill the process. "0": only
    # Lightning's handler runs; it raises its SIGTERMException (a SystemExit whose code says
    # nothing) at the next step, and finalizes its loggers as "failed".
    assert run_fit(store, "sigterm", signal.SIGTERM, ASYNC_TRACKER_HANDLE_SIGTERM=ours) == code
    (run,) = Store(str(store.root)).runs()
    assert (run.status, run.cause) == ("killed", "SIGTERM")
