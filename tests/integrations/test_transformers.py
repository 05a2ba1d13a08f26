"""AsyncTrackerCallback with transformers itself: a tiny BERT (built from a local config, no
download) trained for a few steps on CPU, and what it logged read back from the store (and
with the CLI)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from async_tracker import AppRun  # noqa: E402
from async_tracker import Store as TrackStore  # noqa: E402
from async_tracker.backend.memory import InMemoryTracker  # noqa: E402
from async_tracker.init_run import open_store  # noqa: E402
from async_tracker.integrations.transformers import AsyncTrackerCallback  # noqa: E402
from async_tracker.runtime.process import runtime  # noqa: E402
from tests.core.helpers import Child  # noqa: E402
from tests.integrations.helpers import Recorder, Store, as_torchx_job  # noqa: E402

pytestmark = pytest.mark.server  # needs the transformers extra (CI runs it on 3.11 only)

STEPS = 4


class Sentences(torch.utils.data.Dataset):  # type: ignore[misc]
    """Random token ids and labels: enough for a Trainer to take steps."""

    def __init__(self, n: int = 32, length: int = 8) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, 50, (n, length), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "input_ids": self.ids[i],
            "attention_mask": torch.ones_like(self.ids[i]),
            "labels": self.labels[i],
        }


def tiny_model() -> Any:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16, num_labels=2,
    )  # fmt: skip
    return BertForSequenceClassification(config)


def make_trainer(tmp_path: Path, *callbacks: TrainerCallback, **args: Any) -> Any:
    """A Trainer of the tiny model, with ``callbacks`` in this order after transformers' own
    (output in ``tmp_path/out``)."""
    options: dict[str, Any] = {
        "output_dir": str(tmp_path / "out"),
        "max_steps": STEPS,
        "logging_steps": 1,
        "save_steps": 2,
        "per_device_train_batch_size": 8,
        "learning_rate": 0.01,
        "report_to": [],  # no other integration
        "use_cpu": True,
        "disable_tqdm": True,
        **args,
    }
    return Trainer(
        model=tiny_model(),
        args=TrainingArguments(**options),
        train_dataset=Sentences(),
        eval_dataset=Sentences(8),
        callbacks=list(callbacks),
    )


def test_a_trainer_logs_args_config_metrics_and_checkpoints(
    tmp_path: Path, store: Store
) -> None:
    recorder = Recorder()
    callback = AsyncTrackerCallback(project="bert", dir=store.root, backends=[recorder])
    make_trainer(tmp_path, callback).train()

    assert callback.run is not None
    run_id = callback.run.id
    assert run_id.startswith("bert/")
    assert store.run_ids() == [run_id]
    assert recorder.ended == [(run_id, "finished")]  # on_train_end closed it
    assert callback.run.closed

    metrics = store.metrics(run_id)
    assert store.steps(run_id, "loss") == list(range(1, STEPS + 1))  # state.global_step
    assert all(p.value > 0 for p in metrics["loss"])
    assert [p.step for p in metrics["learning_rate"]] == list(range(1, STEPS + 1))
    assert metrics["learning_rate"][0].value == pytest.approx(0.01)
    assert [p.step for p in metrics["train_loss"]] == [STEPS]  # the summary at the end
    assert "grad_norm" in metrics and "train_runtime" in metrics

    metadata = store.metadata(run_id)
    assert metadata["learning_rate"] == 0.01  # TrainingArguments
    assert metadata["max_steps"] == STEPS
    assert metadata["report_to"] == []
    assert metadata["hidden_size"] == 16  # the model's config
    assert metadata["model_type"] == "bert"
    assert metadata["id2label/0"] == "LABEL_0"  # nested, flattened

    artifacts = store.artifacts(run_id)
    assert set(artifacts) == {"checkpoint/last"}
    last = artifacts["checkpoint/last"]
    assert last.path == str((tmp_path / "out" / f"checkpoint-{STEPS}").resolve())
    assert Path(last.path).is_dir()
    assert last.metadata == {"step": STEPS}

    listing = store.cli("list", "metrics", run_id)
    row = next(line for line in listing.splitlines() if line.startswith("loss "))
    assert row.split()[-2:] == [str(STEPS), str(STEPS)]  # COUNT, LAST STEP
    assert "hidden_size" in store.cli("list", "metadata", run_id)


def test_the_best_checkpoint_is_an_artifact(tmp_path: Path, store: Store) -> None:
    callback = AsyncTrackerCallback(dir=store.root)
    trainer = make_trainer(
        tmp_path, callback, eval_strategy="steps", eval_steps=2, metric_for_best_model="eval_loss"
    )
    trainer.train()
    assert callback.run is not None
    run_id = callback.run.id
    assert run_id.startswith("transformers/")
    state = trainer.state
    assert state.best_model_checkpoint is not None
    best = store.artifacts(run_id)["checkpoint/best"]
    assert best.path == str(Path(state.best_model_checkpoint).resolve())
    assert best.metadata == {
        "metric": "eval_loss",
        "score": state.best_metric,
        "step": state.best_global_step,
    }
    assert store.steps(run_id, "eval_loss") == [2, 4]


def test_evaluate_after_train_reopens_the_same_run(tmp_path: Path, store: Store) -> None:
    recorder = Recorder()
    callback = AsyncTrackerCallback(dir=store.root, backends=[recorder])
    trainer = make_trainer(tmp_path, callback)
    trainer.train()
    assert callback.run is not None
    run_id = callback.run.id
    trainer.evaluate()
    assert callback.run.id == run_id and not callback.run.closed
    callback.run.close()
    assert [r for _, r in recorder.ended] == ["finished", "finished"]
    assert store.run_ids() == [run_id]
    assert store.steps(run_id, "eval_loss") == [STEPS]
    assert len(store.metrics(run_id)["loss"]) == STEPS


def test_logs_that_are_not_numbers_are_skipped_and_named_once(
    tmp_path: Path, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    callback = AsyncTrackerCallback(dir=store.root)
    trainer = make_trainer(tmp_path, callback)
    trainer.train()
    with caplog.at_level(logging.WARNING, logger="async_tracker.integrations"):
        trainer.log({"note": "halfway", "extra": 2.5, "tensor": torch.tensor(0.25)})
        trainer.log({"note": "again", "extra": 3.5, "matrix": torch.ones(2, 2)})
    assert caplog.text.count("'note'") == 1
    assert "'matrix'" in caplog.text
    assert callback.run is not None
    callback.run.close()
    metrics = store.metrics(callback.run.id)
    assert [(p.step, p.value) for p in metrics["extra"]] == [(STEPS, 2.5), (STEPS, 3.5)]
    assert [p.value for p in metrics["tensor"]] == [0.25]
    assert "note" not in metrics and "matrix" not in metrics


def test_only_the_main_process_logs_unless_all_ranks(tmp_path: Path) -> None:
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True)
    control = TrainerControl()
    other = TrainerState(is_world_process_zero=False, global_step=3)
    backend = InMemoryTracker()
    with AppRun("local://tests/shared", [backend]) as run:
        quiet = AsyncTrackerCallback(run=run)
        loud = AsyncTrackerCallback(run=run, all_ranks=True)
        for callback in (quiet, loud):
            callback.on_train_begin(args, other, control, model=tiny_model())
            callback.on_log(args, other, control, logs={"loss": 1.0 if callback is quiet else 2.0})
            callback.on_save(args, other, control)
            callback.on_train_end(args, other, control)
        assert not run.closed  # a given run is left to its owner
    assert [p.value for p in backend.points("local://tests/shared", "loss")] == [2.0]
    stored = backend.runs["local://tests/shared"]
    assert stored.metadata["hidden_size"] == 16
    assert set(stored.artifacts) == {"checkpoint/last"}


def test_without_arguments_in_a_torchx_job_it_logs_to_the_job_run(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_torchx_job("local://session/hf-1", store, tmp_path, monkeypatch)
    callback = AsyncTrackerCallback()
    make_trainer(tmp_path, callback).train()
    assert callback.run is AppRun.run_from_env()
    assert not callback.run.closed  # the job's: closed when it exits
    assert store.steps("local://session/hf-1", "loss") == list(range(1, STEPS + 1))


def test_in_a_torchx_job_each_named_trial_is_a_child_run_of_the_job(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The usual sweep, inside one job: a Trainer and a callback per trial, each naming its
    # trial. Each is a run of its own, a child of the job's run, closed finished at its
    # training's end; the job's run holds none of their points.
    as_torchx_job("local://session/hf-sweep", store, tmp_path, monkeypatch)
    runs = []
    for trial in ("a", "b"):
        callback = AsyncTrackerCallback(project="hf", name=f"trial-{trial}", dir=store.root)
        make_trainer(tmp_path / trial, callback).train()
        assert callback.run is not None and callback.run.closed
        runs.append(callback.run)
    job = AppRun.run_from_env()
    assert len({r.id for r in runs}) == 2 and job.id not in {r.id for r in runs}
    for run in runs:
        assert store.steps(run.id, "loss") == list(range(1, STEPS + 1))
        assert TrackStore(str(store.root)).run(run.id).status == "finished"
        assert store.parents(run.id) == [job.id]
    assert job.metrics() == {}


# A training that raises at its third step: the exception is caught (argv[2] is "catch")
# or ends the process. The run the callback opened lives in the store argv[1].
FAILING_TRAINING = """
import sys
from pathlib import Path
from transformers import TrainerCallback
from async_tracker.integrations.transformers import AsyncTrackerCallback
from tests.integrations.test_transformers import make_trainer

class Breaks(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            raise RuntimeError("the training step failed")

store, mode = Path(sys.argv[1]), sys.argv[2]
trainer = make_trainer(store.parent, AsyncTrackerCallback(project="bert", dir=str(store)))
trainer.add_callback(Breaks())
if mode == "catch":
    try:
        trainer.train()
    except RuntimeError:
        print("caught", flush=True)
else:
    trainer.train()
"""


@pytest.mark.parametrize("mode", ["catch", "raise"])
def test_a_training_that_raised_ends_failed(tmp_path: Path, store: Store, mode: str) -> None:
    job = Child(FAILING_TRAINING, str(store.root), mode)
    try:
        if mode == "catch":
            while job.readline(120) != "caught":  # the Trainer prints its logs too
                pass
        assert job.wait(120) == (0 if mode == "catch" else 1)
    finally:
        job.close()
    (run_id,) = store.run_ids()
    assert _status(store, run_id)[0] == "failed"
    assert store.steps(run_id, "loss") == [1]  # what was logged before the failure


def _status(store: Store, run_id: str) -> tuple[str, float | None]:
    return runtime().loop.call(open_store(store.root).run_status, run_id)
