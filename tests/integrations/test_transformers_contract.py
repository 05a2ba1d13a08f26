"""AsyncTrackerCallback against transformers' callback contract, with the real Trainer: the
run reopened after ``train()`` whatever the caller's ``id=``/``resume=``, other callbacks seeing
the same events and values with it as without it, every ``on_log`` number at its step,
``train()`` resumed from a checkpoint into the same run, and how a training that raised or
was interrupted ends its run."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from transformers import TrainerCallback, TrainerControl, TrainerState  # noqa: E402

from async_tracker.integrations.transformers import RUN_FILE, AsyncTrackerCallback  # noqa: E402
from tests.core.helpers import Child  # noqa: E402
from tests.integrations.helpers import Recorder, Store  # noqa: E402
from tests.integrations.test_transformers import STEPS, _status, make_trainer  # noqa: E402

pytestmark = pytest.mark.server  # needs the transformers extra (CI runs it on 3.11 only)

# Every event a TrainerCallback can receive (on_init_end ... on_push_begin), from the class
# itself, so that an event a newer transformers adds is recorded too.
EVENTS = sorted(name for name in vars(TrainerCallback) if name.startswith("on_"))


class Events(TrainerCallback):
    """Records each event as the callback receives it: its name, the step, the control's
    flags and identity, and a copy of the logs or metrics passed with it."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    def record(
        self, event: str, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        logs = kwargs.get("logs")
        metrics = kwargs.get("metrics")
        self.seen.append((
            event,
            state.global_step,
            dataclasses.asdict(control),
            id(control),
            None if logs is None else dict(logs),
            None if metrics is None else dict(metrics),
        ))  # fmt: skip


def _recorder(event: str) -> Callable[..., None]:
    def method(
        self: Events, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.record(event, state, control, **kwargs)

    return method


for _event in EVENTS:
    setattr(Events, _event, _recorder(_event))


class Before(Events):
    """An Events placed before ours (a class of its own: the Trainer warns of duplicates)."""


class After(Events):
    """An Events placed after ours."""


def _shape(seen: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """What two trainings of the same model see alike: the event, the step, the control's
    flags, and which keys the logs and metrics hold (their timings differ)."""
    return [
        (event, step, flags, None if logs is None else sorted(logs),
         None if metrics is None else sorted(metrics))
        for event, step, flags, _, logs, metrics in seen
    ]  # fmt: skip


# -- 1. reopening the run ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "options", [{"id": "bert/named-run"}, {"resume": "never"}], ids=["id", "resume-never"]
)
def test_train_then_evaluate_is_one_run_whatever_id_or_resume_was_given(
    tmp_path: Path, store: Store, options: dict[str, Any]
) -> None:
    recorder = Recorder()
    callback = AsyncTrackerCallback(project="bert", dir=store.root, backends=[recorder], **options)
    trainer = make_trainer(tmp_path, callback)
    trainer.train()
    assert callback.run is not None and callback.run.closed
    run_id = callback.run.id
    if "id" in options:
        assert run_id == options["id"]
    trainer.evaluate()  # reopens the run on_train_end closed
    assert callback.run.id == run_id and not callback.run.closed
    trainer.evaluate()  # and logs into it while it is open
    callback.run.close()
    assert recorder.ended == [(run_id, "finished"), (run_id, "finished")]
    assert store.run_ids() == [run_id]
    assert store.steps(run_id, "loss") == list(range(1, STEPS + 1))
    assert store.steps(run_id, "eval_loss") == [STEPS, STEPS]


# -- 2. other callbacks see what they would see without it ------------------------------------


def test_other_callbacks_see_the_same_events_logs_and_control(tmp_path: Path, store: Store) -> None:
    args = {"eval_strategy": "steps", "eval_steps": 2, "save_steps": 3}

    alone = Events()
    trainer = make_trainer(tmp_path / "alone", alone, **args)
    trainer.train()
    trainer.evaluate()

    before, after = Before(), After()
    callback = AsyncTrackerCallback(dir=store.root)
    trainer = make_trainer(tmp_path / "with", before, callback, after, **args)
    trainer.train()
    trainer.evaluate()

    names = [event for event, *_ in alone.seen]
    assert {"on_log", "on_evaluate", "on_save", "on_prediction_step"} <= set(names)
    assert names[:2] == ["on_init_end", "on_train_begin"] and "on_train_end" in names
    assert _shape(before.seen) == _shape(alone.seen)
    # In one training, the callback after ours gets the very logs, metrics and control (the
    # same object, its flags as they were) that the one before it got: ours changed none.
    assert after.seen == before.seen
    assert callback.run is not None
    callback.run.close()  # the one evaluate() reopened
    assert store.steps(callback.run.id, "eval_loss") == [2, 4, STEPS]


def test_it_returns_nothing_and_leaves_logs_and_control_as_they_are(tmp_path: Path) -> None:
    # What a Trainer passes on_log, on_save and on_train_end, called directly: the handler
    # takes a callback's return value as the new control, so ours returns None.
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True)
    state = TrainerState(global_step=3, epoch=0.5)
    control = TrainerControl(should_log=True, should_save=True)
    flags = dataclasses.asdict(control)
    logs = {"loss": 0.5, "note": "text", "grad": torch.tensor(1.5)}
    callback = AsyncTrackerCallback(dir=tmp_path / "runs")
    assert callback.on_train_begin(args, state, control, model=None) is None
    assert callback.on_log(args, state, control, logs=logs) is None
    assert callback.on_save(args, state, control) is None
    assert callback.on_train_end(args, state, control) is None
    assert list(logs) == ["loss", "note", "grad"] and logs["loss"] == 0.5
    assert logs["note"] == "text" and float(logs["grad"]) == 1.5
    assert dataclasses.asdict(control) == flags
    assert state.global_step == 3 and state.epoch == 0.5


# -- 3. every on_log number at state.global_step ----------------------------------------------


def test_every_logged_number_is_a_point_at_its_global_step(tmp_path: Path, store: Store) -> None:
    callback = AsyncTrackerCallback(dir=store.root)
    trainer = make_trainer(tmp_path, callback, eval_strategy="steps", eval_steps=3)
    trainer.train()
    trainer.evaluate()
    assert callback.run is not None
    callback.run.close()
    # The Trainer keeps each on_log's logs in log_history, with the step it logged at.
    expected = sorted(
        (key, entry["step"], value)
        for entry in trainer.state.log_history
        for key, value in entry.items()
        if key != "step"
    )
    stored = sorted(
        (name, point.step, point.value)
        for name, points in store.metrics(callback.run.id).items()
        for point in points
    )
    assert stored == expected
    assert {"loss", "eval_loss", "train_loss", "epoch"} <= {key for key, _, _ in stored}


def test_a_text_log_entry_at_every_step_is_named_in_one_warning(
    tmp_path: Path, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    callback = AsyncTrackerCallback(dir=store.root)
    trainer = make_trainer(tmp_path, callback)
    log = trainer.log

    def log_with_a_phase(logs: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        log({**logs, "phase": "warmup"}, *args, **kwargs)

    trainer.log = log_with_a_phase  # as a Trainer subclass adding an entry would
    with caplog.at_level(logging.WARNING, logger="async_tracker.integrations"):
        trainer.train()
    assert sum("'phase'" in r.getMessage() for r in caplog.records) == 1
    assert callback.run is not None
    metrics = store.metrics(callback.run.id)
    assert "phase" not in metrics
    assert store.steps(callback.run.id, "loss") == list(range(1, STEPS + 1))


# -- 4. resuming from a checkpoint ------------------------------------------------------------

# A training that raises at the start of its third step, after the checkpoint of step 2 was
# saved: the process ends on it. The store is argv[1]; the outputs go to its parent's out/.
STOPS_AFTER_CHECKPOINT = """
import sys
from pathlib import Path
from transformers import TrainerCallback
from async_tracker.integrations.transformers import AsyncTrackerCallback
from tests.integrations.test_transformers import make_trainer

class Breaks(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 2:
            raise RuntimeError("the machine went away")

store = Path(sys.argv[1])
callback = AsyncTrackerCallback(project="bert", dir=str(store))
make_trainer(store.parent, callback, Breaks()).train()
"""


def test_a_training_resumed_from_a_checkpoint_logs_into_the_same_run(
    tmp_path: Path, store: Store
) -> None:
    job = Child(STOPS_AFTER_CHECKPOINT, str(store.root))
    try:
        assert job.wait(120) == 1
    finally:
        job.close()
    (run_id,) = store.run_ids()
    assert store.steps(run_id, "loss") == [1, 2]
    checkpoint = tmp_path / "out" / "checkpoint-2"
    assert (checkpoint / RUN_FILE).is_file()

    # Another process (this one), another callback: the checkpoint names the run.
    recorder = Recorder()
    callback = AsyncTrackerCallback(project="bert", dir=store.root, backends=[recorder])
    make_trainer(tmp_path, callback).train(resume_from_checkpoint=str(checkpoint))
    assert callback.run is not None and callback.run.id == run_id
    assert recorder.ended == [(run_id, "finished")]
    assert store.run_ids() == [run_id]
    assert store.steps(run_id, "loss") == list(range(1, STEPS + 1))  # continued, no repeat
    assert store.steps(run_id, "train_loss") == [STEPS]
    assert store.artifacts(run_id)["checkpoint/last"].metadata == {"step": STEPS}


def test_a_resumed_training_with_a_run_of_its_own_keeps_it(tmp_path: Path, store: Store) -> None:
    first = AsyncTrackerCallback(dir=store.root)
    make_trainer(tmp_path, first, max_steps=2).train()
    assert first.run is not None
    checkpoint = tmp_path / "out" / "checkpoint-2"
    assert (checkpoint / RUN_FILE).is_file()

    # The caller names the run: the checkpoint's is not looked for.
    named = AsyncTrackerCallback(dir=store.root, id="transformers/other")
    make_trainer(tmp_path, named).train(resume_from_checkpoint=str(checkpoint))
    assert named.run is not None and named.run.id == "transformers/other"
    assert store.steps("transformers/other", "loss") == [3, 4]
    assert store.steps(first.run.id, "loss") == [1, 2]


# -- 5. how a training that did not end ends its run ------------------------------------------

# argv[2]: "model" (the model's forward raises at the third step), "interrupt" (says "ready" at
# the second step's end and waits for the test's SIGINT, a Ctrl-C).
DOES_NOT_END = """
import signal, sys, time
# Ctrl-C as in a terminal, whatever this process inherited: a job started in the background
# by a shell without job control has SIGINT ignored, and Python then keeps it ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
from pathlib import Path
from transformers import TrainerCallback
from async_tracker.integrations.transformers import AsyncTrackerCallback
from tests.integrations.test_transformers import make_trainer

class WaitsForCtrlC(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            print("ready", flush=True)
            while True:  # sleeps (a SIGINT before a blocking read would never be handled): the
                time.sleep(0.05)  # SIGINT interrupts one: KeyboardInterrupt

store, mode = Path(sys.argv[1]), sys.argv[2]
callback = AsyncTrackerCallback(project="bert", dir=str(store))
trainer = make_trainer(store.parent, callback)
if mode == "model":
    calls = []
    def breaks(module, inputs):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("a bad batch")
    trainer.model.register_forward_pre_hook(breaks)
else:
    trainer.add_callback(WaitsForCtrlC())
trainer.train()
"""


# Past pytest's 120 s: the child's own bounded waits (120 s each, a child importing torch
# and transformers on a loaded machine) fail first, with the child's threads and stderr.
@pytest.mark.timeout(400)
def test_a_model_that_raises_in_a_step_ends_the_run_failed(tmp_path: Path, store: Store) -> None:
    job = Child(DOES_NOT_END, str(store.root), "model")
    try:
        assert job.wait(120) == 1
    finally:
        job.close()
    (run_id,) = store.run_ids()
    assert _status(store, run_id)[0] == "failed"
    assert store.steps(run_id, "loss") == [1, 2]


# Past pytest's 120 s: the child's own bounded waits (120 s each, a child importing torch
# and transformers on a loaded machine) fail first, with the child's threads and stderr.
@pytest.mark.timeout(400)
def test_a_ctrl_c_during_training_ends_the_run_killed(tmp_path: Path, store: Store) -> None:
    job = Child(DOES_NOT_END, str(store.root), "interrupt")
    try:
        while job.readline(120) != "ready":  # the Trainer prints its logs too
            pass
        os.kill(job.proc.pid, signal.SIGINT)
        # Python ends a process on an uncaught KeyboardInterrupt by SIGINT, after exit hooks.
        assert job.wait(120) == -signal.SIGINT
    finally:
        job.close()
    (run_id,) = store.run_ids()
    assert _status(store, run_id)[0] == "killed"
    assert store.steps(run_id, "loss") == [1]  # step 2's log comes after on_step_end
