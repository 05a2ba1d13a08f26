"""A Hugging Face ``TrainerCallback`` that records into an ``AppRun`` (extra
``transformers``).

Example::

    from transformers import Trainer, TrainingArguments
    from async_tracker.integrations.transformers import AsyncTrackerCallback

    trainer = Trainer(
        model=model,
        args=TrainingArguments(output_dir="out", report_to=[]),
        train_dataset=train_set,
        callbacks=[AsyncTrackerCallback(project="my-model")],
    )
    trainer.train()

Without ``run=``, it logs where the Lightning logger would: the torchx job's run when
``TORCHX_JOB_ID`` is set, else a run of its own opened with ``async_tracker.init()``.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from async_tracker.integrations._default import (
    RunHandle,
    add_metadata_leniently,
    flatten_params,
    numeric_logs,
)
from async_tracker.run import AppRun

logger = logging.getLogger("async_tracker.integrations")


class AsyncTrackerCallback(TrainerCallback):
    """Records a ``Trainer``'s arguments, model config, logs and checkpoints in an ``AppRun``.

    - ``on_train_begin``: the model's config (``model.config.to_dict()``) and the
      ``TrainingArguments`` (``args.to_dict()``, which win on a shared key) as metadata,
      nested keys flattened with ``/``; values that are not JSON data as their text.
    - ``on_log``: the numeric entries of the logs (``loss``, ``learning_rate``,
      ``eval_loss`` ...) as metrics at ``state.global_step``; others are skipped, each named
      once in a warning.
    - ``on_save``: the checkpoint directory as artifact ``checkpoint/last`` (metadata: the
      step), and ``state.best_model_checkpoint`` as ``checkpoint/best`` once there is one.
    - ``on_train_end``: closes a run the callback opened, as finished (a run that is not its
      own gets what waits in it delivered). A later ``trainer.evaluate()`` reopens it, resumed.
    - A training that raised (``Trainer.train()`` never reached ``on_train_end``): the run the
      callback opened is closed as failed when the process exits, even when the caller
      caught the exception; a later ``trainer.train()`` that ends well makes it finished.

    Args:
        run, project, name, dir, init_options: as for the Lightning logger: a run of yours,
            else the torchx job's, else ``async_tracker.init(project or "transformers", ...)``.
        all_ranks: log from every process, not only the main one
            (``state.is_world_process_zero``). Give them one run to share: a torchx job's, or
            ``run=``; each process would otherwise open its own.
    """

    def __init__(
        self,
        run: AppRun | None = None,
        project: str | None = None,
        name: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        *,
        all_ranks: bool = False,
        **init_options: Any,
    ) -> None:
        self._handle = RunHandle(run, project, name, dir, init_options, "transformers")
        self._all_ranks = all_ranks
        self._warned: set[str] = set()
        # A training under way: on_train_begin came, on_train_end not yet. Transformers has no
        # hook for a train() that raises, so a training still under way at exit failed.
        self._training = False

    @property
    def run(self) -> AppRun | None:
        """The run, once training has begun on this process (or the one given)."""
        return self._handle.current

    def _logs_here(self, state: TrainerState) -> bool:
        return self._all_ranks or state.is_world_process_zero

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: Any = None,
        **kwargs: Any,
    ) -> None:
        if not self._logs_here(state):
            return
        self._training = True
        _watch(self)
        params: dict[str, Any] = {}
        config = getattr(model, "config", None)
        if config is not None and callable(getattr(config, "to_dict", None)):
            params.update(config.to_dict())
        params.update(args.to_dict())  # type: ignore[no-untyped-call]
        add_metadata_leniently(self._handle.get(), flatten_params(params))

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not logs or not self._logs_here(state):
            return
        metrics, skipped = numeric_logs(logs)
        for key in skipped:
            if key not in self._warned:
                self._warned.add(key)
                logger.warning(
                    "async_tracker: the Trainer logged %r = %r, which is not a number: not "
                    "recorded as a metric",
                    key,
                    logs[key],
                )
        if metrics:
            self._handle.get().log_metrics(metrics, step=state.global_step)

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not self._logs_here(state):
            return
        run = self._handle.get()
        # Where Trainer._save_checkpoint wrote it, before calling us.
        folder = os.path.join(args.output_dir or "", f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        run.add_artifact("checkpoint/last", os.path.abspath(folder), {"step": state.global_step})
        if state.best_model_checkpoint:
            run.add_artifact(
                "checkpoint/best",
                os.path.abspath(state.best_model_checkpoint),
                {
                    "metric": args.metric_for_best_model,
                    "score": state.best_metric,
                    "step": getattr(state, "best_global_step", None),  # absent before 4.5x
                },
            )

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._logs_here(state):
            self._training = False
            self._handle.finish("finished")

    def _finish_failed(self) -> None:
        """At exit: a training that never ended raised; a run of ours ends as failed."""
        if self._training:
            self._training = False
            self._handle.finish("failed")


# The callbacks whose training began, for the exit hook (weakly: a callback dropped with its
# Trainer needs no ending from us; its run's own exit hook closes it).
_watched: weakref.WeakSet[AsyncTrackerCallback] = weakref.WeakSet()
_watch_lock = threading.Lock()
_hook_registered = False


def _watch(callback: AsyncTrackerCallback) -> None:
    """Registers the exit hook once, at the first training: registered after the tracker's own
    (which imports ran first), it runs before it (atexit is last in, first out), and closes
    the runs of failed trainings with their reason before the tracker closes the rest."""
    global _hook_registered
    with _watch_lock:
        _watched.add(callback)
        if not _hook_registered:
            atexit.register(_finish_failed_trainings)
            _hook_registered = True


def _finish_failed_trainings() -> None:
    for callback in list(_watched):
        try:
            callback._finish_failed()
        except Exception:  # an exit hook must not stop the others
            logger.exception("async_tracker: ending a failed training's run")


__all__ = ["AsyncTrackerCallback"]
