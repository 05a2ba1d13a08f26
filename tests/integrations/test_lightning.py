"""AsyncTrackerLogger with Lightning itself: a tiny model trained for a few steps on CPU, and
what it logged read back from the store (and with the CLI)."""

from __future__ import annotations

import logging
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.utilities import rank_zero_only  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from async_tracker import AppRun  # noqa: E402
from async_tracker import Store as TrackStore  # noqa: E402
from async_tracker.backend.memory import InMemoryTracker  # noqa: E402
from async_tracker.integrations.lightning import AsyncTrackerLogger  # noqa: E402
from tests.integrations.helpers import Recorder, Store, as_torchx_job  # noqa: E402

pytestmark = [
    pytest.mark.server,  # needs the lightning extra (CI runs it on 3.11 only)
    # Lightning's own code calls torch APIs that torch has deprecated.
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)`:FutureWarning"),
    pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning"),
]

STEPS = 6


class Tiny(pl.LightningModule):  # type: ignore[misc]
    """A linear layer on random data; ``fail_at`` raises in that training step."""

    def __init__(self, lr: float = 0.1, optimizer: dict[str, Any] | None = None,
                 fail_at: int = -1) -> None:  # fmt: skip
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if batch_idx == self.hparams.fail_at:
            raise RuntimeError("the training step failed")
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def loader() -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
    return DataLoader(data, batch_size=8)


def trainer(tmp_path: Path, logger: AsyncTrackerLogger, **kwargs: Any) -> Any:
    return pl.Trainer(
        logger=logger,
        max_steps=STEPS,
        accelerator="cpu",
        log_every_n_steps=1,
        default_root_dir=tmp_path / "lightning",
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def test_a_trainer_logs_metrics_hyperparams_and_checkpoints(
    tmp_path: Path, store: Store
) -> None:
    recorder = Recorder()
    logger = AsyncTrackerLogger(
        project="tiny", dir=store.root, log_model=True, backends=[recorder]
    )
    checkpoints = ModelCheckpoint(every_n_train_steps=3, save_last=True)
    model = Tiny(lr=0.1, optimizer={"name": "sgd", "momentum": 0.9})
    trainer(tmp_path, logger, callbacks=[checkpoints]).fit(model, loader())

    run_id = logger.run_id
    assert run_id is not None and run_id.startswith("tiny/")
    assert store.run_ids() == [run_id]
    # finalize("success") closed the run it opened, as finished, after delivering all.
    assert recorder.ended == [(run_id, "finished")]
    assert store.steps(run_id, "train_loss") == list(range(STEPS))
    losses = [p.value for p in store.metrics(run_id)["train_loss"]]
    assert all(v > 0 for v in losses)
    assert "epoch" in store.metrics(run_id)

    metadata = store.metadata(run_id)
    assert metadata["project"] == "tiny"
    assert metadata["lr"] == 0.1
    assert metadata["optimizer/name"] == "sgd"  # nested hyperparameters, flattened
    assert metadata["optimizer/momentum"] == 0.9
    assert metadata["fail_at"] == -1

    artifacts = store.artifacts(run_id)
    assert set(artifacts) == {"checkpoint/best", "checkpoint/last"}
    last = Path(artifacts["checkpoint/last"].path)
    assert last.is_absolute() and last.name == "last.ckpt" and last.is_file()
    best = Path(artifacts["checkpoint/best"].path)
    assert best == Path(checkpoints.best_model_path).resolve() and best.is_file()
    assert f"step={STEPS}" in best.name
    # Lightning wrote them under <root>/<name>/<version>/: the project, then the run's name.
    assert best.parent.parent == Path(logger.save_dir) / "tiny" / logger.version
    assert run_id.endswith("/" + str(logger.version))

    listing = store.cli("list", "metrics", run_id)
    row = next(line for line in listing.splitlines() if line.startswith("train_loss"))
    assert row.split()[-2:] == [str(STEPS), str(STEPS - 1)]  # COUNT, LAST STEP
    assert run_id in store.cli("list", "jobs")


def test_no_checkpoint_artifacts_without_log_model(tmp_path: Path, store: Store) -> None:
    logger = AsyncTrackerLogger(dir=store.root)
    trainer(tmp_path, logger).fit(Tiny(), loader())
    assert logger.run_id is not None and logger.run_id.startswith("lightning/")
    assert store.artifacts(logger.run_id) == {}
    assert len(store.metrics(logger.run_id)["train_loss"]) == STEPS


def test_log_model_all_records_each_top_k_checkpoint(tmp_path: Path, store: Store) -> None:
    logger = AsyncTrackerLogger(dir=store.root, log_model="all")
    checkpoints = ModelCheckpoint(every_n_train_steps=2, save_top_k=2, monitor="train_loss")
    trainer(tmp_path, logger, callbacks=[checkpoints]).fit(Tiny(), loader())
    assert logger.run_id is not None
    artifacts = store.artifacts(logger.run_id)
    kept = {Path(p).resolve() for p in checkpoints.best_k_models}
    assert len(kept) == 2
    recorded = {Path(a.path) for name, a in artifacts.items() if name.startswith("checkpoint/e")}
    # Every checkpoint that was in the top k at some point; the kept ones among them.
    assert kept <= recorded
    best = artifacts["checkpoint/best"]
    assert best.metadata is not None and best.metadata["monitor"] == "train_loss"
    assert best.metadata["score"] == pytest.approx(float(checkpoints.best_model_score))


def test_a_failed_training_closes_the_run_as_failed(tmp_path: Path, store: Store) -> None:
    recorder = Recorder()
    logger = AsyncTrackerLogger(dir=store.root, backends=[recorder])
    with pytest.raises(RuntimeError, match="the training step failed"):
        trainer(tmp_path, logger).fit(Tiny(fail_at=3), loader())
    assert logger.run_id is not None
    assert recorder.ended == [(logger.run_id, "failed")]
    # What was logged before the failure is all there.
    assert store.steps(logger.run_id, "train_loss") == [0, 1, 2]


@pytest.mark.parametrize(
    ("status", "reason"),
    [("success", "finished"), ("finished", "finished"), ("failed", "failed"),
     ("aborted", "killed")],
)  # fmt: skip
def test_finalize_maps_lightning_status_to_the_close_reason(
    status: str, reason: str, store: Store
) -> None:
    recorder = Recorder()
    logger = AsyncTrackerLogger(dir=store.root, backends=[recorder])
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.finalize(status)
    assert recorder.ended == [(logger.run_id, reason)]
    logger.finalize(status)  # Lightning may call it again (teardown of fit, then test)
    assert len(recorder.ended) == 1


def test_testing_after_fit_reopens_the_same_run(tmp_path: Path, store: Store) -> None:
    recorder = Recorder()
    logger = AsyncTrackerLogger(dir=store.root, backends=[recorder])
    model = Tiny()
    pl_trainer = trainer(tmp_path, logger)
    pl_trainer.fit(model, loader())
    run_id = logger.run_id
    pl_trainer.test(model, loader(), verbose=False)
    assert logger.run_id == run_id
    assert store.run_ids() == [run_id]
    assert [r for _, r in recorder.ended] == ["finished", "finished"]
    metrics = store.metrics(run_id)
    assert len(metrics["train_loss"]) == STEPS
    assert len(metrics["test_loss"]) == 1


def test_a_given_run_is_flushed_and_left_open(tmp_path: Path) -> None:
    backend = InMemoryTracker()
    with AppRun("local://tests/given", [backend]) as run:
        logger = AsyncTrackerLogger(run=run)
        trainer(tmp_path, logger).fit(Tiny(lr=0.5), loader())
        assert not run.closed
        # Delivered by finalize(), before the run is closed: the backend holds it already.
        assert len(backend.points("local://tests/given", "train_loss")) == STEPS
        stored = backend.runs["local://tests/given"]
        assert stored.metadata["lr"] == 0.5
        assert logger.experiment is run
        assert logger.version == "given"
        run.add_metadata(note="the caller goes on logging")
    assert stored.metadata["note"] == "the caller goes on logging"


def test_in_a_torchx_job_it_logs_to_the_job_run(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_torchx_job("local://session/train-1", store, tmp_path, monkeypatch)
    logger = AsyncTrackerLogger()
    trainer(tmp_path, logger).fit(Tiny(), loader())
    assert logger.run_id == "local://session/train-1"
    assert logger.experiment is AppRun.run_from_env()
    assert not AppRun.run_from_env().closed  # the job's run: closed when the job exits
    assert logger.version == "train-1"
    assert len(store.metrics("local://session/train-1")["train_loss"]) == STEPS


def test_in_a_torchx_job_each_named_logger_opens_a_child_run_of_the_job(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A sweep inside one job: a logger per trial, each naming its trial. Each trial is a run
    # of its own (its points and lr kept apart), a child of the job's run, closed by
    # finalize() as finished; the job's run holds no trial's points.
    as_torchx_job("local://session/sweep-1", store, tmp_path, monkeypatch)
    loggers = []
    for lr in (0.1, 0.5):
        logger = AsyncTrackerLogger(project="sweep", name=f"lr-{lr}", dir=store.root)
        trainer(tmp_path / str(lr), logger).fit(Tiny(lr=lr), loader())
        loggers.append(logger)
    job = AppRun.run_from_env()
    ids = [logger.run_id for logger in loggers]
    assert len(set(ids)) == 2 and job.id not in ids
    for run_id, lr in zip(ids, (0.1, 0.5)):
        assert TrackStore(str(store.root)).run(run_id).status == "finished"  # finalize()
        assert store.steps(run_id, "train_loss") == list(range(STEPS))
        assert store.metadata(run_id)["lr"] == lr
        assert store.parents(run_id) == [job.id]
    assert job.metrics() == {}


def test_other_ranks_log_nothing_and_open_no_run(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rank_zero_only, "rank", 1)  # what the strategy sets on rank 1
    logger = AsyncTrackerLogger(dir=store.root, log_model=True)
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.finalize("success")
    assert not isinstance(logger.experiment, AppRun)  # Lightning's stand-in
    assert logger.version is None
    assert logger.run_id is None
    assert not store.root.exists()


def test_hyperparams_of_any_kind_are_recorded_without_stopping_training(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    class Picky(InMemoryTracker):
        def validate(self, record: object) -> None:
            if isinstance(record, dict) and "huge" in record:
                raise ValueError("metadata 'huge': too long for this backend")

    logger = AsyncTrackerLogger(dir=store.root, backends=[Picky()])
    params = Namespace(
        lr=0.1,
        path=Path("/data/set"),
        loss=torch.nn.MSELoss(),
        nested=Namespace(depth=2, empty={}),
        huge="x" * 10,
        layers=(64, 64),
    )
    with caplog.at_level(logging.WARNING, logger="async_tracker.integrations"):
        logger.log_hyperparams(params)
    assert "'huge'" in caplog.text
    logger.finalize("success")
    assert logger.run_id is not None
    metadata = store.metadata(logger.run_id)
    assert metadata["lr"] == 0.1
    assert metadata["path"] == "/data/set"
    assert metadata["loss"] == "MSELoss()"
    assert metadata["nested/depth"] == 2
    assert metadata["nested/empty"] == {}
    assert metadata["layers"] == [64, 64]
    assert "huge" not in metadata


def test_bad_arguments_are_refused_at_once(store: Store) -> None:
    with AppRun("local://tests/mine", [InMemoryTracker()]) as run:
        with pytest.raises(ValueError, match="dir"):
            AsyncTrackerLogger(run=run, dir=store.root)
        with pytest.raises(ValueError, match="flush_interval"):
            AsyncTrackerLogger(run=run, flush_interval=1.0)
    with pytest.raises(TypeError, match="AppRun"):
        AsyncTrackerLogger(run="local://tests/mine")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="log_model"):
        AsyncTrackerLogger(log_model="best")  # type: ignore[arg-type]
    logger = AsyncTrackerLogger(dir=store.root)
    with pytest.raises(TypeError, match="'loss'"):
        logger.log_metrics({"loss": "high"}, step=0)  # type: ignore[dict-item]
    logger.finalize("success")


def test_metrics_read_back_are_the_values_logged(store: Store) -> None:
    logger = AsyncTrackerLogger(dir=store.root)
    for step in range(3):
        logger.log_metrics({"loss": 1.0 / (step + 1), "acc": step / 3}, step=step)
    logger.log_metrics({"val_loss": 0.5})  # no step: the tracker numbers it
    logger.finalize("success")
    assert logger.run_id is not None
    metrics = store.metrics(logger.run_id)
    assert [(p.step, p.value) for p in metrics["loss"]] == [(0, 1.0), (1, 0.5), (2, 1 / 3)]
    assert [(p.step, p.value) for p in metrics["val_loss"]] == [(0, 0.5)]
    assert [p.step for p in metrics["acc"]] == [0, 1, 2]
