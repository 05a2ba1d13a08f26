"""How AsyncTrackerCallback's runs end when ``Trainer.train()`` raises, which calls no
callback: the usual sweep (a new Trainer and callback per trial, ``try``/``except`` around
``train()``), a retry, a training in a thread, a run of the caller's, and the process's exit.
A training that began and never reached ``on_train_end`` did not end well: it ends when the
next training begins in its thread, when its thread has ended, or at exit; never when the
garbage collector frees its callback."""

from __future__ import annotations

import gc
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from async_tracker import AppRun, Store
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.integrations.transformers import AsyncTrackerCallback
from async_tracker.tags import ENDING_KEY
from tests.core.helpers import Child
from tests.integrations.helpers import Recorder
from tests.integrations.helpers import Store as StoreDir
from tests.integrations.test_transformers import make_trainer

pytestmark = pytest.mark.server  # needs the transformers extra (CI runs it on 3.11 only)

CAUGHT = "Trainer.train() raised before the training's end; the exception was caught"


class Breaks(TrainerCallback):  # type: ignore[misc]
    """Raises at the end of the second step, as a failing training step would."""

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if state.global_step == 2:
            raise RuntimeError("the training step failed")


def trial(tmp_path: Path, store: StoreDir, name: str, breaks: bool, **options: Any) -> str:
    """One trial of a sweep: its own Trainer and callback, ``train()`` in try/except; both
    dropped and collected when it returns. Its run id."""
    callback = AsyncTrackerCallback(project="sweep", dir=store.root, **options)
    trainer = make_trainer(tmp_path / name, callback)
    if breaks:
        trainer.add_callback(Breaks())
    try:
        trainer.train()
    except RuntimeError:
        pass
    assert callback.run is not None
    run_id = callback.run.id
    del trainer, callback
    gc.collect()  # whatever the collector does, the ending does not depend on it
    return run_id


def status(store: StoreDir, run_id: str) -> tuple[str, str]:
    run = Store(str(store.root)).run(run_id)
    return run.status, run.cause


def test_a_sweep_trial_that_raised_ends_failed_when_the_next_trial_begins(
    tmp_path: Path, store: StoreDir
) -> None:
    recorder = Recorder()
    first = trial(tmp_path, store, "t0", breaks=True, backends=[recorder])
    assert recorder.ended == []  # nothing has said how it ended yet
    second = trial(tmp_path, store, "t1", breaks=False, backends=[recorder])
    assert recorder.ended == [(first, "failed"), (second, "finished")]
    assert status(store, first) == ("failed", CAUGHT)
    assert status(store, second) == ("finished", "")
    assert store.steps(first, "loss") == [1]  # what was logged before it raised


def test_a_retry_in_the_except_clause_records_the_exception(
    tmp_path: Path, store: StoreDir
) -> None:
    first = AsyncTrackerCallback(dir=store.root)
    trainer = make_trainer(tmp_path / "t0", first)
    trainer.add_callback(Breaks())
    try:
        trainer.train()
    except RuntimeError:
        # The exception is still being handled when the next training begins.
        make_trainer(tmp_path / "t1", AsyncTrackerCallback(dir=store.root)).train()
    assert first.run is not None
    assert status(store, first.run.id) == ("failed", "RuntimeError: the training step failed")


def test_the_same_trainer_trained_again_continues_its_run(
    tmp_path: Path, store: StoreDir
) -> None:
    recorder = Recorder()
    callback = AsyncTrackerCallback(dir=store.root, backends=[recorder])
    trainer = make_trainer(tmp_path, callback)
    breaks = Breaks()
    trainer.add_callback(breaks)
    with pytest.raises(RuntimeError):
        trainer.train()
    trainer.remove_callback(breaks)
    trainer.train()  # a retry: the same run, which ends well this time
    assert callback.run is not None
    assert recorder.ended == [(callback.run.id, "finished")]


def test_a_training_whose_thread_ended_ends_failed_at_the_next_training(
    tmp_path: Path, store: StoreDir
) -> None:
    ids: list[str] = []

    def train_in_a_thread() -> None:
        ids.append(trial(tmp_path, store, "t0", breaks=True))

    worker = threading.Thread(target=train_in_a_thread)
    worker.start()
    worker.join()
    (first,) = ids
    # Another thread training meanwhile would not end it; its thread's end does.
    second = trial(tmp_path, store, "t1", breaks=False)
    assert status(store, first) == ("failed", CAUGHT)
    assert status(store, second) == ("finished", "")


def test_a_run_of_the_callers_learns_how_its_last_training_ended(tmp_path: Path) -> None:
    backend = InMemoryTracker()
    with AppRun("local://tests/sweep", [backend]) as run:
        for name, breaks in (("t0", False), ("t1", True)):
            trainer = make_trainer(tmp_path / name, AsyncTrackerCallback(run=run))
            if breaks:
                trainer.add_callback(Breaks())
            try:
                trainer.train()
            except RuntimeError:
                pass
        # The sweep goes on (no more trainings): the run ends when the block does.
    assert backend.ended("local://tests/sweep") == "failed"
    stored = backend.runs["local://tests/sweep"].metadata[ENDING_KEY]
    assert stored == {"reason": "failed", "message": CAUGHT}


# The sweep as a script: trials of their own Trainer and callback, try/except around train();
# the last one (argv[2] says which breaks: "first" or "last") is ended by the exit.
SWEEP = """
import gc, sys
from pathlib import Path
from async_tracker.integrations.transformers import AsyncTrackerCallback
from tests.integrations.test_transformers import make_trainer
from tests.integrations.test_transformers_endings import Breaks

store, breaks = Path(sys.argv[1]), sys.argv[2]
for n in range(2):
    callback = AsyncTrackerCallback(project="sweep", name=f"t{n}", dir=str(store))
    trainer = make_trainer(store.parent / f"t{n}", callback)
    if (n == 0) == (breaks == "first"):
        trainer.add_callback(Breaks())
    try:
        trainer.train()
    except RuntimeError as exc:
        print("caught", exc, flush=True)
    del trainer, callback
    gc.collect()
"""


@pytest.mark.timeout(400)  # a child importing torch and transformers on a loaded machine
@pytest.mark.parametrize("breaks", ["first", "last"])
def test_a_sweep_script_ends_each_trial_as_it_ended(
    tmp_path: Path, store: StoreDir, breaks: str
) -> None:
    job = Child(SWEEP, str(store.root), breaks)
    try:
        assert job.wait(300) == 0, job.stderr()
    finally:
        job.close()
    runs = {r.run_id.split("/")[1][:2]: r for r in Store(str(store.root)).runs()}
    failed, finished = ("t0", "t1") if breaks == "first" else ("t1", "t0")
    assert (runs[failed].status, runs[failed].cause) == ("failed", CAUGHT)
    assert (runs[finished].status, runs[finished].cause) == ("finished", "")
