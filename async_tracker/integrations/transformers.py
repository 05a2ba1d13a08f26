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

import json
import logging
import os
import threading
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from async_tracker.integrations._default import (
    RunHandle,
    add_metadata_leniently,
    flatten_params,
    in_torchx_job,
    numeric_logs,
)
from async_tracker.run import AppRun
from async_tracker.runtime.ending import Ending, decide, exception_now

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
    - A training that raised: ``Trainer.train()`` calls no callback then, so a training that
      began and never reached ``on_train_end`` did not end well. ``on_train_begin`` reports
      so on the run (``AppRun.report_ending``) and ``on_train_end`` reports the training's
      end: a run closed in between by anyone (the caller's ``with`` block, the exit hook)
      ends failed, or killed on SIGTERM or Ctrl-C, with the exception's type and message
      when it is at hand (the one the process exits on). A run of the callback's own is
      also closed when the next training begins in the same thread (the usual sweep: a new
      ``Trainer`` and callback per trial, ``try``/``except`` around ``train()``), with the
      exception being handled then if any (a retry in an ``except`` clause), or when the
      next one begins anywhere once its thread has ended. None of this waits for garbage
      collection: the callback is held until its training ends. An exception the caller
      caught and dropped is gone by then: the run says that ``train()`` raised before the
      training's end. A later ``trainer.train()`` of the same callback continues the same
      run instead (a retry), and ending well makes it finished.
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
        _begin(self)
        # Until on_train_end says otherwise, this training has not ended well: a close
        # meanwhile (Trainer.train() raised, the caller caught it) ends the run so.
        self._handle.get().report_ending(NOT_ENDED)
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
            with _lock():
                _under_way.pop(id(self), None)
            self._handle.finish(decide())

    def _abandoned(self, ending: Ending) -> None:
        """The training under way never reached its end: it ends as ``ending`` says."""
        self._handle.finish(ending)


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


# How a training that began and never reached on_train_end ended, when no exception is at
# hand to say more (see runtime.ending.decide: SIGTERM and the exception at hand come first).
NOT_ENDED = Ending(
    "failed", None, "Trainer.train() raised before the training's end; the exception was caught"
)

# The trainings under way: callback id -> (callback, the thread it trains in, its pid), from
# on_train_begin to on_train_end. Held strongly: a training that raised ends (below) whether
# or not its Trainer and callback are still referenced, never when the garbage collector
# happens to free them. A forked child inherits the parent's entries: they are the parent's
# trainings, which the child never ends (the pid says whose they are).
_under_way: dict[int, tuple[AsyncTrackerCallback, threading.Thread, int]] = {}
# One lock per process (dict.setdefault is atomic under the GIL): a child forked while
# another thread of the parent held the lock would otherwise find it held forever.
_locks: dict[int, threading.Lock] = {}


def _lock() -> threading.Lock:
    return _locks.setdefault(os.getpid(), threading.Lock())


def _begin(callback: AsyncTrackerCallback) -> None:
    """A training begins in this thread: every other training that began in this thread
    (a thread trains once at a time) or in a thread that has ended, and has not ended, has
    raised: it ends now, killed on SIGTERM or a ``KeyboardInterrupt``, else failed, with the
    exception being handled now, if any, as what ended it. (The trainings still under way
    when the process exits end with their runs, as their reports say.)"""
    here, pid = threading.current_thread(), os.getpid()
    stopped = []
    with _lock():
        for key, (other, thread, owner) in list(_under_way.items()):
            if owner != pid:
                del _under_way[key]  # the parent's (this is a forked child): not ours to end
            elif key != id(callback) and (thread is here or not thread.is_alive()):
                del _under_way[key]
                stopped.append(other)
        _under_way[id(callback)] = (callback, here, pid)
    if not stopped:
        return
    ending = decide(None, exception_now(), NOT_ENDED)
    for other in stopped:
        try:
            other._abandoned(ending)
        except Exception:  # one run's close must not stop the others (nor this training)
            logger.exception("async_tracker: ending the run of a training that raised")


__all__ = ["AsyncTrackerCallback"]
