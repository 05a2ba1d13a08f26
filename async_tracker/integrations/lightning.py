"""A Lightning ``Logger`` that records into an ``AppRun`` (extra ``lightning``).

Example::

    import lightning.pytorch as pl
    from async_tracker.integrations.lightning import AsyncTrackerLogger

    logger = AsyncTrackerLogger(project="mnist", log_model=True)
    pl.Trainer(logger=logger, max_epochs=3).fit(model, train_loader)
    print(logger.run_id)   # then: async-tracker list metrics <run id>

Without ``run=``, the logger logs to the torchx job's run when ``TORCHX_JOB_ID`` is set, else
opens a run with ``async_tracker.init(project or "lightning", name=name, dir=dir,
**init_options)`` at its first use and closes it in ``finalize()``. Only global rank zero logs,
as with Lightning's own loggers.
"""

from __future__ import annotations

import os
import re
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only

from async_tracker.integrations._default import (
    RunHandle,
    add_metadata_leniently,
    close_reason,
    flatten_params,
)
from async_tracker.run import AppRun

LogModel = bool | Literal["all"]


class AsyncTrackerLogger(Logger):
    """Records Lightning's metrics, hyperparameters and checkpoints in an ``AppRun``.

    Args:
        run: the run to log to; yours to close (``finalize`` delivers what waits in it).
            Without it: the torchx job's run (``AppRun.run_from_env()``) when
            ``TORCHX_JOB_ID`` is set, else a run opened with ``async_tracker.init()``, which
            ``finalize`` closes with the training's outcome (and a later ``trainer.test()``
            reopens, resumed).
        project, name, dir: ``async_tracker.init()``'s, for that run (project default
            ``"lightning"``; store default ``$ASYNC_TRACKER_DIR``, else ``./tracker_runs``).
        log_model: ``True`` records the best and the last checkpoint as artifacts
            ``checkpoint/best`` and ``checkpoint/last`` (paths, as saved), kept current as
            Lightning saves; ``"all"`` also records each top-k checkpoint under
            ``checkpoint/<file stem>``.
        init_options: more ``async_tracker.init()`` arguments (``backends``, ``config``,
            ``flush_interval`` ...).
    """

    def __init__(
        self,
        run: AppRun | None = None,
        project: str | None = None,
        name: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        log_model: LogModel = False,
        **init_options: Any,
    ) -> None:
        super().__init__()
        if log_model not in (True, False, "all"):
            raise ValueError(f"log_model must be True, False or 'all', got {log_model!r}")
        self._handle = RunHandle(run, project, name, dir, init_options, "lightning")
        self._log_model = log_model
        # Artifact name -> the path last recorded under it: a checkpoint is recorded once.
        self._recorded: dict[str, str] = {}

    @property
    @rank_zero_experiment
    def experiment(self) -> AppRun:
        """The ``AppRun`` (opened now if it was not yet); on other ranks, a stand-in that
        ignores every call."""
        return self._handle.get()

    @property
    def run_id(self) -> str | None:
        """The run's id once it is open (or given); opens nothing, also after ``finalize``."""
        run = self._handle.current
        return None if run is None else run.id

    @property
    def name(self) -> str:
        """The project: Lightning's checkpoints go to ``<root>/<name>/<version>/``."""
        return self._handle.project

    @property
    def version(self) -> str | None:
        """The run id's last part, safe as a directory name (the whole id is
        ``experiment.id``); None on ranks other than zero."""
        # Set by Lightning (from RANK and friends, then by the strategy) as the decorator's
        # attribute, which its type does not declare.
        if getattr(rank_zero_only, "rank", 0) > 0:
            return None
        run_id = self._handle.get().id
        tail = run_id.rstrip("/").rsplit("/", 1)[-1] or run_id
        return re.sub(r"[^\w.-]+", "_", tail)

    @rank_zero_only
    def log_hyperparams(
        self, params: dict[str, Any] | Namespace | None, *args: Any, **kwargs: Any
    ) -> None:
        """Records ``params`` as metadata, nested keys flattened with ``/``; a value that is
        not JSON data is recorded as its text, and a key a backend refuses is skipped with a
        warning: hyperparameters never stop the training."""
        if params:
            add_metadata_leniently(self._handle.get(), flatten_params(params))

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self._handle.get().log_metrics(metrics, step=step)

    def save(self) -> None:
        """Nothing to do: Lightning calls this after every ``log_metrics``, and the tracker
        already delivers in the background; waiting here would stall the training loop."""

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Training ended: ``success`` closes a run the logger opened as finished,
        ``failed`` as failed, anything else as killed. A run that is not the logger's gets
        what waits in it delivered instead."""
        self._handle.finish(close_reason(status))

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback: ModelCheckpoint) -> None:
        if not self._log_model:
            return
        cb = checkpoint_callback
        score = cb.best_model_score
        best = {"monitor": cb.monitor, "score": None if score is None else float(score)}
        # last_model_path is set with save_last=True; else the most recent save is the one
        # ModelCheckpoint remembers (a private name; absent, there is no "last").
        last = cb.last_model_path or getattr(cb, "_last_checkpoint_saved", "") or ""
        wanted: dict[str, tuple[str, Mapping[str, object]]] = {}
        if cb.best_model_path:
            wanted["checkpoint/best"] = (cb.best_model_path, best)
        if last:
            wanted["checkpoint/last"] = (last, {"monitor": cb.monitor})
        if self._log_model == "all":
            for path, value in cb.best_k_models.items():
                wanted[f"checkpoint/{Path(path).stem}"] = (
                    path,
                    {"monitor": cb.monitor, "score": float(value)},
                )
        run = self._handle.get()
        for artifact, (path, metadata) in wanted.items():
            path = os.path.abspath(path)
            if self._recorded.get(artifact) != path:
                run.add_artifact(artifact, path, metadata)
                self._recorded[artifact] = path


__all__ = ["AsyncTrackerLogger"]
