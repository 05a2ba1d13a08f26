"""AsyncTrackerLogger against Lightning's logger contract, the cases Lightning's own logger
tests exercise: fit then test in one named run, pickling at any point and ``ddp_spawn``,
real ``save_dir``/``log_dir`` (``LightningCLI``), ``prefix=``, options checked at
construction, hyperparameters of every kind, and ``log_model="all"``."""

from __future__ import annotations

import pickle
import warnings
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")
np = pytest.importorskip("numpy")

from lightning.pytorch.callbacks import Callback, ModelCheckpoint  # noqa: E402

from async_tracker import AppRun  # noqa: E402
from async_tracker.backend.memory import InMemoryTracker  # noqa: E402
from async_tracker.integrations.lightning import AsyncTrackerLogger  # noqa: E402
from async_tracker.tags import split_metadata  # noqa: E402
from tests.integrations.helpers import Recorder, Store  # noqa: E402
from tests.integrations.test_lightning import STEPS, Tiny, loader, trainer  # noqa: E402

pytestmark = [
    pytest.mark.server,  # needs the lightning extra (CI runs it on 3.11 only)
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)`:FutureWarning"),
    pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning"),
]


@pytest.mark.parametrize(
    "options",
    [{"id": "tiny/named-run"}, {"resume": "never"}, {"id": "tiny/fresh", "resume": "never"}],
    ids=["id", "resume-never", "id-resume-never"],
)
def test_fit_then_test_of_a_named_run_is_one_run(
    options: dict[str, Any], tmp_path: Path, store: Store
) -> None:
    recorder = Recorder()
    logger = AsyncTrackerLogger(project="tiny", dir=store.root, backends=[recorder], **options)
    model = Tiny()
    pl_trainer = trainer(tmp_path, logger)
    pl_trainer.fit(model, loader())
    run_id = logger.run_id
    assert run_id is not None
    if "id" in options:
        assert run_id == options["id"]
    pl_trainer.test(model, loader(), verbose=False)
    assert logger.run_id == run_id
    assert store.run_ids() == [run_id]
    assert recorder.ended == [(run_id, "finished"), (run_id, "finished")]
    metrics = store.metrics(run_id)
    assert store.steps(run_id, "train_loss") == list(range(STEPS))
    assert len(metrics["test_loss"]) == 1
    assert store.metadata(run_id)["lr"] == 0.1


def test_the_logger_pickles_at_any_point_and_a_copy_logs_to_the_same_run(
    tmp_path: Path, store: Store
) -> None:
    logger = AsyncTrackerLogger(project="tiny", dir=store.root)
    run_id = logger.run_id  # decided now, without opening the run
    assert run_id is not None and run_id.startswith("tiny/")
    assert not store.root.exists()
    pickle.dumps(logger)
    assert logger.version is not None and run_id.endswith("/" + logger.version)
    pickle.dumps(logger)
    assert not store.root.exists()  # still nothing opened

    logger.log_hyperparams({"lr": 0.1})  # opens the run, in this process
    assert isinstance(logger.experiment, AppRun)
    copy = pickle.loads(pickle.dumps(logger))
    assert (copy.run_id, copy.version, copy.name, copy.save_dir) == (
        run_id, logger.version, logger.name, logger.save_dir
    )  # fmt: skip
    copy.log_metrics({"loss": 0.5}, step=0)  # reopens the same run, resumed
    copy.finalize("success")
    # A Trainer holding the logger pickles too, and its copy logs to the same run.
    pl_trainer = pl.Trainer(logger=logger, max_epochs=1, default_root_dir=tmp_path)
    trainer_copy = pickle.loads(pickle.dumps(pl_trainer))
    trainer_copy.logger.log_metrics({"acc": 1.0}, step=0)
    trainer_copy.logger.finalize("success")
    logger.log_metrics({"loss": 0.25}, step=1)
    logger.finalize("success")
    pickle.loads(pickle.dumps(logger))  # closed: pickles too

    assert store.run_ids() == [run_id]
    assert store.metadata(run_id)["lr"] == 0.1
    metrics = store.metrics(run_id)
    assert [(p.step, p.value) for p in metrics["loss"]] == [(0, 0.5), (1, 0.25)]
    assert [(p.step, p.value) for p in metrics["acc"]] == [(0, 1.0)]


@pytest.mark.parametrize("resume", ["never", "allow"])
def test_a_copy_may_open_the_run_before_the_original(resume: str, store: Store) -> None:
    """As with ddp_spawn when nothing is logged before fit: the worker's copy creates the
    run, and the parent's logger, used afterwards, resumes it (even with resume="never",
    which the first open of the run honours)."""
    logger = AsyncTrackerLogger(dir=store.root, id="tiny/mine", resume=resume)
    copy = pickle.loads(pickle.dumps(logger))
    copy.log_metrics({"loss": 0.5}, step=0)
    copy.finalize("success")
    logger.log_metrics({"loss": 0.25}, step=1)
    logger.finalize("success")
    assert store.run_ids() == ["tiny/mine"]
    assert store.steps("tiny/mine", "loss") == [0, 1]


def test_a_copy_of_a_logger_given_a_run_says_what_to_do_instead(store: Store) -> None:
    with AppRun("local://tests/given", [InMemoryTracker()]) as run:
        logger = AsyncTrackerLogger(run=run)
        logger.log_metrics({"loss": 1.0}, step=0)
        copy = pickle.loads(pickle.dumps(logger))
        assert copy.run_id == "local://tests/given"
        assert copy.version == "given"
        with pytest.raises(RuntimeError, match="project="):
            copy.log_metrics({"loss": 1.0}, step=1)


def test_ddp_spawn_logs_from_the_worker_into_the_parents_run(
    tmp_path: Path, store: Store
) -> None:
    logger = AsyncTrackerLogger(project="spawned", dir=store.root)
    # Before fit, in the parent: the run opens here, and the logger must still pickle.
    logger.log_hyperparams({"lr": 0.1, "where": "parent"})
    assert logger.version is not None
    pl_trainer = trainer(
        tmp_path, logger, strategy="ddp_spawn", devices=2, callbacks=[RankZeroExperiment()]
    )
    pl_trainer.fit(Tiny(), loader())
    run_id = logger.run_id
    assert run_id is not None and run_id.startswith("spawned/")
    logger.finalize("success")  # the parent's part (its hyperparameters), closed here
    # One run: rank 1 opened none; rank 0 logged into the parent's run.
    assert store.run_ids() == [run_id]
    metadata = store.metadata(run_id)
    assert metadata["where"] == "parent"
    assert metadata["optimizer"] is None  # Tiny's own, logged by the worker
    # Each rank sees half of the 8 batches: rank 0 logs its steps.
    assert store.steps(run_id, "train_loss") == list(range(STEPS))


class RankZeroExperiment(Callback):  # type: ignore[misc]
    """Fails the fit (in the worker) unless rank zero alone holds the ``AppRun``."""

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        logger = trainer.logger
        assert isinstance(logger.experiment, AppRun) == trainer.is_global_zero
        assert (logger.version is not None) == trainer.is_global_zero


def test_save_dir_and_log_dir_are_real_paths(tmp_path: Path, store: Store) -> None:
    default = AsyncTrackerLogger(dir=store.root)
    assert default.save_dir == str(Path.cwd() / "lightning_logs")

    out = tmp_path / "out"
    logger = AsyncTrackerLogger(project="tiny", dir=store.root, save_dir=out, log_model=True)
    version = logger.version
    assert version is not None
    assert logger.save_dir == str(out)
    assert logger.root_dir == str(out / "tiny")
    assert logger.log_dir == str(out / "tiny" / version)
    pl_trainer = trainer(tmp_path, logger, callbacks=[ModelCheckpoint(save_last=True)])
    assert pl_trainer.log_dir == str(out)  # Lightning's rule for loggers of this kind
    pl_trainer.fit(Tiny(), loader())
    checkpoints = out / "tiny" / version / "checkpoints"
    assert (checkpoints / "last.ckpt").is_file()
    assert logger.run_id is not None
    assert store.artifacts(logger.run_id)["checkpoint/last"].path == str(
        checkpoints / "last.ckpt"
    )
    # Lightning's files stay out of the store: it holds the run alone.
    assert store.run_ids() == [logger.run_id]


def test_lightning_cli_saves_its_config_and_logs(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("jsonargparse")
    from lightning.pytorch.cli import LightningCLI

    # What Lightning's own calls of jsonargparse are warned about: not this test's concern.
    warnings.filterwarnings("ignore", category=DeprecationWarning)

    monkeypatch.setattr("sys.argv", ["train.py"])  # the arguments are args= alone

    out = tmp_path / "out"
    cli = LightningCLI(
        CliTiny,
        seed_everything_default=0,
        args=[
            "fit",
            "--trainer.logger=async_tracker.integrations.lightning.AsyncTrackerLogger",
            "--trainer.logger.project=cli",
            f"--trainer.logger.dir={store.root}",
            f"--trainer.logger.save_dir={out}",
            "--trainer.logger.prefix=cli",
            f"--trainer.max_steps={STEPS}",
            "--trainer.accelerator=cpu",
            "--trainer.log_every_n_steps=1",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={tmp_path / 'lightning'}",
            "--model.lr=0.2",
        ],
    )
    logger = cli.trainer.logger
    assert isinstance(logger, AsyncTrackerLogger)
    assert logger.run_id is not None and logger.run_id.startswith("cli/")
    config = out / "config.yaml"
    assert config.is_file() and "AsyncTrackerLogger" in config.read_text()
    assert store.steps(logger.run_id, "cli-train_loss") == list(range(STEPS))
    assert store.metadata(logger.run_id)["lr"] == 0.2


class CliTiny(Tiny):
    """Tiny with its own data, as LightningCLI builds a model alone."""

    def train_dataloader(self) -> Any:
        return loader()


def test_prefix_joins_metric_names_with_a_dash(tmp_path: Path, store: Store) -> None:
    logger = AsyncTrackerLogger(dir=store.root, prefix="fold1")
    trainer(tmp_path, logger).fit(Tiny(), loader())
    assert logger.run_id is not None
    metrics = store.metrics(logger.run_id)
    assert "train_loss" not in metrics
    assert [p.step for p in metrics["fold1-train_loss"]] == list(range(STEPS))
    assert store.metadata(logger.run_id)["lr"] == 0.1  # hyperparameters keep their names
    logger.log_metrics({"test": 1.0}, step=0)
    logger.finalize("success")
    assert [(p.step, p.value) for p in store.metrics(logger.run_id)["fold1-test"]] == [(0, 1.0)]


@pytest.mark.parametrize(
    ("options", "error", "named"),
    [
        ({"flush_intervall": 1.0}, TypeError, "'flush_intervall'"),
        ({"projet": "x"}, TypeError, "'projet'"),
        ({"flush_interval": 0}, ValueError, "flush_interval"),
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"overflow": "ignore"}, ValueError, "overflow"),
        ({"resume": "sometimes"}, ValueError, "resume"),
        ({"id": ""}, ValueError, "id"),
        ({"id": 3}, TypeError, "id"),
        ({"timeout": -1}, ValueError, "timeout"),
        ({"prefix": 3}, TypeError, "prefix"),
        ({"log_model": "best"}, ValueError, "log_model"),
        ({"tags": ["good", "bad tag"]}, ValueError, "'bad tag'"),
        ({"tags": "baseline"}, TypeError, "tags"),
        ({"note": 3}, TypeError, "note"),
    ],
)
def test_every_option_is_checked_at_construction(
    options: dict[str, Any], error: type[Exception], named: str, store: Store
) -> None:
    with pytest.raises(error, match=named):
        AsyncTrackerLogger(dir=store.root, **options)
    assert not store.root.exists()


def test_hyperparameters_of_every_kind_are_recorded(tmp_path: Path, store: Store) -> None:
    logger = AsyncTrackerLogger(dir=store.root)
    logger.log_hyperparams(
        Namespace(
            scale=np.float32(0.5),
            epochs=np.int64(3),
            shuffle=np.bool_(True),
            weights=np.arange(3),
            grid=np.array([[1.0, 2.0], [3.0, 4.0]]),
            layers=[64, 32],
            dims=(3, 4),
            scheduler=None,
            tags=["a", None],
            nested={"optimizer": {"name": "adam", "betas": (0.9, 0.999)}},
            ns=Namespace(seed=7),
        )
    )
    logger.log_hyperparams({"later": "dict", 3: "int key"})
    logger.log_hyperparams(None)  # nothing to record
    trainer(tmp_path, logger).fit(Tiny(optimizer={"name": "sgd"}), loader())
    assert logger.run_id is not None
    metadata = store.metadata(logger.run_id)
    expected = {
        "scale": 0.5,
        "epochs": 3,
        "shuffle": True,
        "weights": [0, 1, 2],
        "grid": [[1.0, 2.0], [3.0, 4.0]],
        "layers": [64, 32],
        "dims": [3, 4],
        "scheduler": None,
        "tags": ["a", None],
        "nested/optimizer/name": "adam",
        "nested/optimizer/betas": [0.9, 0.999],
        "ns/seed": 7,
        "later": "dict",
        "3": "int key",
        # The model's own, from save_hyperparameters(), logged by Lightning at fit.
        "optimizer/name": "sgd",
        "fail_at": -1,
    }
    assert {k: metadata.get(k, "<missing>") for k in expected} == expected
    assert metadata["lr"] == 0.1


def test_a_logger_made_on_rank_zero_logs_nothing_on_another_rank(store: Store) -> None:
    """Covered with real ranks by the ddp_spawn test; here the rank is read per call, so a
    logger made on rank zero and used on rank one logs nothing."""
    from lightning.pytorch.utilities import rank_zero_only

    logger = AsyncTrackerLogger(dir=store.root)
    run_id = logger.run_id
    previous = rank_zero_only.rank
    rank_zero_only.rank = 1
    try:
        logger.log_metrics({"loss": 1.0}, step=0)
        logger.log_hyperparams({"lr": 0.1})
        assert logger.run_id is None and logger.version is None and logger.log_dir is None
    finally:
        rank_zero_only.rank = previous
    assert logger.run_id == run_id
    assert not store.root.exists()


@pytest.mark.parametrize("log_model", [True, "all"])
def test_log_model_without_a_monitor(
    log_model: bool | str, tmp_path: Path, store: Store
) -> None:
    logger = AsyncTrackerLogger(dir=store.root, log_model=log_model)  # type: ignore[arg-type]
    checkpoints = ModelCheckpoint(every_n_epochs=1, save_top_k=-1)
    pl_trainer = pl.Trainer(
        logger=logger,
        max_epochs=3,
        limit_train_batches=2,
        accelerator="cpu",
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checkpoints],
    )
    pl_trainer.fit(Tiny(), loader())
    assert logger.run_id is not None
    artifacts = store.artifacts(logger.run_id)
    saved = sorted(p.name for p in Path(checkpoints.dirpath).iterdir())
    assert saved == ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt", "epoch=2-step=6.ckpt"]
    last = str(Path(checkpoints.dirpath) / "epoch=2-step=6.ckpt")
    assert artifacts["checkpoint/best"].path == last
    assert artifacts["checkpoint/last"].path == last
    every = {n: a.path for n, a in artifacts.items() if n not in ("checkpoint/best",
                                                                   "checkpoint/last")}  # fmt: skip
    if log_model == "all":
        assert every == {
            f"checkpoint/{Path(name).stem}": str(Path(checkpoints.dirpath) / name)
            for name in saved
        }
    else:
        assert every == {}


def test_tags_and_a_note_go_to_the_run(tmp_path: Path, store: Store) -> None:
    logger = AsyncTrackerLogger(dir=store.root, tags=["baseline", "lightning"], note="tiny")
    trainer(tmp_path, logger).fit(Tiny(), loader())
    assert logger.run_id is not None
    params, tags, note = split_metadata(store.metadata(logger.run_id))
    assert tags == {"baseline", "lightning"} and note == "tiny"
    assert params["lr"] == 0.1
