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
import json
import logging
import os
import sys
import threading
import weakref
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from async_tracker.base import CloseReason
from async_tracker.integrations._default import (
    RunHandle,
    add_metadata_leniently,
    flatten_params,
    in_torchx_job,
    numeric_logs,
)
from async_tracker.run import AppRun

logger = logging.getLogger("async_tracker.integrations")

# The file in each checkpoint folder naming the run that the training logs to, so that a
# training resumed from that checkpoint (in another process too) logs into the same run.
RUN_FILE = "async_tracker_run.json"


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
      In a run the callback opened, it also writes the run id in the checkpoint folder
      (``async_tracker_run.json``): ``trainer.train(resume_from_checkpoint=...)``, in this
      process or another, logs into that run again, its steps continuing from the
      checkpoint's.
    - ``on_train_end``: closes a run the callback opened, as finished (a run that is not its
      own gets what waits in it delivered). A later ``trainer.evaluate()`` reopens it, resumed.
    - A training that raised (``Trainer.train()`` never reached ``on_train_end``): the run the
      callback opened is closed when the process exits, as killed when the process ends on
      a ``KeyboardInterrupt`` (Ctrl-C), else as failed, even when the caller caught the
      exception; a later ``trainer.train()`` that ends well makes it finished.
    - It only reads what the Trainer passes: ``logs``, ``control`` and ``state`` are left as
      they are, and it returns nothing, so other callbacks see the same events and values.

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
        # Kept to reopen a checkpoint's run (a new handle naming its id), see _resume_from.
        self._open_args = (project, name, dir, dict(init_options))
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
        if state.global_step > 0 and self._handle.current is None:
            self._resume_from(args, state)
        self._training = True
        _watch(self)
        params: dict[str, Any] = {}
        config = getattr(model, "config", None)
        if config is not None and callable(getattr(config, "to_dict", None)):
            params.update(config.to_dict())
        params.update(args.to_dict())  # type: ignore[no-untyped-call]
        add_metadata_leniently(self._handle.get(), flatten_params(params))

    def _resume_from(self, args: TrainingArguments, state: TrainerState) -> None:
        """A training resumed from a checkpoint, before any run was opened here: when the
        checkpoint names the run that wrote it, and the callback would open a run of its
        own, it opens that one (resumed) instead of a new one."""
        project, name, dir, init_options = self._open_args
        if in_torchx_job() or "id" in init_options:
            return  # the job's run, or the run the caller named, is the same run already
        # Where Trainer._save_checkpoint wrote it: the state it resumed from is that
        # checkpoint's, global_step included. A checkpoint moved elsewhere is not found:
        # the training then gets a new run, as before.
        path = os.path.join(_checkpoint_folder(args, state), RUN_FILE)
        try:
            with open(path, encoding="utf-8") as f:
                run_id = json.load(f)["run_id"]
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("async_tracker: %s unreadable, logging to a new run: %s", path, exc)
            return
        if not isinstance(run_id, str):
            logger.warning("async_tracker: %s names no run, logging to a new run", path)
            return
        # resume="allow" whatever the first open asked (resume="never" included): the
        # checkpoint's run is the one this training made.
        options = {**init_options, "id": run_id, "resume": "allow"}
        self._handle = RunHandle(None, project, name, dir, options, "transformers")

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
        folder = _checkpoint_folder(args, state)
        run.add_artifact("checkpoint/last", os.path.abspath(folder), {"step": state.global_step})
        if self._handle.owned and os.path.isdir(folder):
            # Only a run of ours: a run= of the caller's or the job's is found again without it.
            _write_run_file(folder, run.id)
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

    def _finish_failed(self, reason: CloseReason) -> None:
        """At exit: a training that never ended raised; a run of ours ends with ``reason``."""
        if self._training:
            self._training = False
            self._handle.finish(reason)


def _checkpoint_folder(args: TrainingArguments, state: TrainerState) -> str:
    """Where Trainer._save_checkpoint writes the checkpoint of ``state.global_step``."""
    return os.path.join(args.output_dir or "", f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")


def _write_run_file(folder: str, run_id: str) -> None:
    """The run id in the checkpoint folder; a failure to write it is a warning, never a
    stopped training (a resume from that checkpoint then gets a new run)."""
    path = os.path.join(folder, RUN_FILE)
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"run_id": run_id}, f)
    except OSError as exc:
        logger.warning("async_tracker: run id not written in %s: %s", folder, exc)


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


def _exit_reason() -> CloseReason:
    """How a training still under way at exit ended: killed when the process ends on a
    ``KeyboardInterrupt`` (Ctrl-C), else failed. Python keeps the uncaught exception in
    ``sys.last_exc`` (``sys.last_value`` before 3.12) before it runs the atexit hooks; a
    notebook keeps an earlier one there too, so it is read only once the main thread ended,
    as the tracker's own exit hook does."""
    exc: object = None
    if not threading.main_thread().is_alive():
        exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    return "killed" if isinstance(exc, KeyboardInterrupt) else "failed"


def _finish_failed_trainings() -> None:
    reason = _exit_reason()
    for callback in list(_watched):
        try:
            callback._finish_failed(reason)
        except Exception:  # an exit hook must not stop the others
            logger.exception("async_tracker: ending a failed training's run")


__all__ = ["AsyncTrackerCallback"]
