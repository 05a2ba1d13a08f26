"""A Lightning ``Logger`` that records into an ``AppRun`` (extra ``lightning``).

Example::

    import lightning.pytorch as pl
    from async_tracker.integrations.lightning import AsyncTrackerLogger

    logger = AsyncTrackerLogger(project="mnist", log_model=True)
    pl.Trainer(logger=logger, max_epochs=3).fit(model, train_loader)
    print(logger.run_id)   # then: async-tracker list metrics <run id>

Without ``run=``, the logger logs to the torchx job's run when ``TORCHX_JOB_ID`` is set, else
to a run of its own: its id is decided when the logger is made, and the run is opened with
``async_tracker.init(project or "lightning", dir=dir, id=<that id>, **init_options)`` at its
first use, in the process that logs, and closed in ``finalize()``. The logger pickles at any
point (``strategy="ddp_spawn"`` sends it to the worker processes): a copy reopens the same run
id, resumed, at its first use. Only global rank zero logs, as with Lightning's own loggers.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import uuid
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

from async_tracker.factory import ENV_TORCHX_JOB_ID
from async_tracker.init_run import init
from async_tracker.integrations._default import (
    RunHandle,
    add_metadata_leniently,
    flatten_params,
    in_torchx_job,
)
from async_tracker.records import check_name
from async_tracker.run import AppRun
from async_tracker.runtime.ending import SIGTERM, Ending, decide
from async_tracker.settings import RunOptions, init_timeout
from async_tracker.spool import check_run_id
from async_tracker.tags import check_note, tag_metadata

LogModel = bool | Literal["all"]

# Where Lightning's own files go (checkpoints, LightningCLI's config.yaml) when save_dir= is
# not given: Lightning's usual folder, beside the store rather than in it, since the store's
# readers take each directory at its root for a run.
DEFAULT_SAVE_DIR = "lightning_logs"


def _option_names() -> frozenset[str]:
    """What ``**init_options`` may hold: ``init()``'s keyword arguments (bar those the logger
    takes itself) and the ``AppRun`` options ``init()`` passes on."""
    own = {"project", "name", "dir"}
    names = {
        p.name
        for p in inspect.signature(init).parameters.values()
        if p.kind is not inspect.Parameter.VAR_KEYWORD and p.name not in own
    }
    names |= {
        p.name
        for p in inspect.signature(AppRun.__init__).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and not p.name.startswith("_")
    }
    return frozenset(names)


OPTION_NAMES = _option_names()


def check_init_options(init_options: Mapping[str, Any]) -> None:
    """TypeError naming an option ``init()`` does not take; ValueError (or TypeError) naming
    one whose value it would refuse: raised when the logger is made, not inside training."""
    unknown = sorted(set(init_options) - OPTION_NAMES)
    if unknown:
        raise TypeError(
            f"AsyncTrackerLogger got unknown option(s) {', '.join(map(repr, unknown))}; "
            f"it takes run, project, name, dir, log_model, prefix, save_dir and the options "
            f"of async_tracker.init(): {', '.join(sorted(OPTION_NAMES))}"
        )
    resume = init_options.get("resume", "allow")
    if resume not in ("allow", "never", "must"):
        raise ValueError(f"resume must be 'allow', 'never' or 'must', got {resume!r}")
    run_id = init_options.get("id")
    if run_id is not None:
        check_run_id(check_name(run_id, "id"))
    if "timeout" in init_options:
        init_timeout(init_options["timeout"])
    tags = init_options.get("tags") or ()
    if isinstance(tags, str):
        raise TypeError(f"tags must be a sequence of str, got the str {tags!r}")
    tag_metadata(add=tags)
    if init_options.get("note") is not None:
        check_note(init_options["note"])
    # The AppRun options as the run will merge them (environment, then these): their own
    # checks, now.
    base = init_options.get("options") or RunOptions.from_env()
    if not isinstance(base, RunOptions):
        raise TypeError(f"options must be a RunOptions, got {type(base).__name__}")
    given = {
        k: v for k, v in init_options.items() if k in base.__dict__ and v is not None
    }
    RunOptions(**{**base.__dict__, **given})


def new_run_id(project: str, name: str | None) -> str:
    """A run id in ``init()``'s form, ``<project>/<name>-<hex>``, made here so that every
    process the logger is pickled into logs to the same run. Eight hex digits: the run is
    opened with ``resume="allow"``, so an id must not meet an existing one by chance."""
    return f"{project}/{name or 'run'}-{uuid.uuid4().hex[:8]}"


class AsyncTrackerLogger(Logger):
    """Records Lightning's metrics, hyperparameters and checkpoints in an ``AppRun``.

    Args:
        run: the run to log to; yours to close (``finalize`` delivers what waits in it).
            Without it: the torchx job's run (``AppRun.run_from_env()``) when
            ``TORCHX_JOB_ID`` is set, else a run opened with ``async_tracker.init()`` at the
            first use, which ``finalize`` closes with the training's outcome (and a later
            ``trainer.test()`` reopens, resumed). Its id (``run_id``) is decided now:
            ``id=`` if given, else ``<project>/<name>-<8 hex digits>``.
        project, name, dir: ``async_tracker.init()``'s, for that run (project default
            ``"lightning"``; store default ``$ASYNC_TRACKER_DIR``, else ``./tracker_runs``).
            An empty ``project`` or ``name`` is taken as not given, as Lightning's own
            loggers take an empty name.
        log_model: ``True`` records the best and the last checkpoint as artifacts
            ``checkpoint/best`` and ``checkpoint/last`` (paths, as saved), kept current as
            Lightning saves; ``"all"`` also records every checkpoint saved under
            ``checkpoint/<file stem>``.
        prefix: put before each metric name, joined with ``-`` (``prefix="fold1"``:
            ``fold1-train_loss``), as Lightning's own loggers do.
        save_dir: where Lightning writes its files for this logger: checkpoints under
            ``<save_dir>/<name>/<version>/checkpoints``, and LightningCLI's ``config.yaml``
            (``trainer.log_dir`` is ``save_dir``); default ``./lightning_logs``.
        init_options: more ``async_tracker.init()`` arguments (``id``, ``resume``,
            ``backends``, ``config``, ``flush_interval`` ...), checked now: an unknown one
            raises ``TypeError``, a bad value ``ValueError``, naming it.
    """

    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        run: AppRun | None = None,
        project: str | None = None,
        name: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        log_model: LogModel = False,
        prefix: str = "",
        save_dir: str | os.PathLike[str] | None = None,
        **init_options: Any,
    ) -> None:
        super().__init__()
        if log_model not in (True, False, "all"):
            raise ValueError(f"log_model must be True, False or 'all', got {log_model!r}")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        # "" as Lightning's loggers take it (TensorBoardLogger(name="")): nothing given.
        project = project or None
        name = name or None
        if project is not None:
            check_name(project, "project")
        if name is not None:
            check_name(name, "name")
        check_init_options(init_options)
        # Refuses run= together with options for a run of our own.
        handle = RunHandle(run, project, name, dir, init_options, "lightning")
        self._project = handle.project
        self._name = name
        self._dir = dir
        self._init_options = dict(init_options)
        # The caller's run's id, kept in a pickled copy (which cannot log to that run).
        self._given_id = None if run is None else run.id
        # The id of a run of our own, decided now, so that the copies pickled into other
        # processes (ddp_spawn) log to one run and this one knows it; None for the caller's
        # run (its id is its own) and for the torchx job's (TORCHX_JOB_ID, read at first use).
        self._own_id: str | None = None
        if run is None and not in_torchx_job():
            self._own_id = init_options.get("id") or new_run_id(self._project, name)
            handle = self._new_handle(first=True)
        self._handle: RunHandle | None = handle
        self._log_model = log_model
        self._prefix = prefix
        self._save_dir = _resolved(save_dir if save_dir is not None else DEFAULT_SAVE_DIR)
        # Artifact name -> the path last recorded under it: a checkpoint is recorded once.
        self._recorded: dict[str, str] = {}

    def _new_handle(self, first: bool) -> RunHandle:
        """A handle on the run of our own (``first``: not opened by any copy of this logger
        yet, so the caller's ``resume`` applies; else it is resumed)."""
        options = {**self._init_options, "id": self._own_id}
        if not first:
            options["resume"] = "allow"
        return RunHandle(None, self._project, self._name, self._dir, options, "lightning")

    def _get(self) -> AppRun:
        if self._handle is None:
            # Unpickled from a logger given run=: that AppRun lives in the process that made it.
            raise RuntimeError(
                "AsyncTrackerLogger(run=...) logs to a run of the process that made it; to log "
                "from another process (strategy='ddp_spawn'), give project=, dir= (and id=) "
                "instead, and the logger opens the run where it logs"
            )
        return self._handle.get()

    # -- pickling: Lightning's spawn launchers send the logger to their workers ------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        handle = self._handle
        # The live AppRun (its locks, threads) stays here; the copy opens its own, resumed
        # when a run was opened here already.
        state["_handle"] = None
        state["_opened"] = handle is not None and handle.current is not None
        if self._own_id is not None and not state["_opened"]:
            # The copy may open (create) the run before this logger does: from now on, the
            # run is one of ours to resume here, whatever resume= asked of its first open.
            self._handle = self._new_handle(first=False)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        opened = state.pop("_opened")
        self.__dict__.update(state)
        if self._given_id is not None:
            self._handle = None
        elif self._own_id is not None:
            self._handle = self._new_handle(first=not opened)
        else:
            self._handle = RunHandle(
                None, self._project, self._name, self._dir, self._init_options, "lightning"
            )

    # -- Lightning's Logger properties ------------------------------------------------------
    @property
    @rank_zero_experiment
    def experiment(self) -> AppRun:
        """The ``AppRun`` (opened now if it was not yet); on other ranks, a stand-in that
        ignores every call."""
        return self._get()

    @property
    def run_id(self) -> str | None:
        """The run's id, known without opening it (also after ``finalize``, and in the
        process that pickled the logger for its workers); None on ranks other than zero."""
        # Set by Lightning (from RANK and friends, then by the strategy) as the decorator's
        # attribute, which its type does not declare.
        if getattr(rank_zero_only, "rank", 0) > 0:
            return None
        run = None if self._handle is None else self._handle.current
        if run is not None:
            return run.id
        return self._own_id or self._given_id or os.environ.get(ENV_TORCHX_JOB_ID)

    @property
    def name(self) -> str:
        """The project: Lightning's checkpoints go to ``<save_dir>/<name>/<version>/``."""
        return self._project

    @property
    def version(self) -> str | None:
        """The run id's last part, safe as a directory name (the whole id is ``run_id``);
        None on ranks other than zero. Opens nothing."""
        run_id = self.run_id
        if run_id is None:
            if getattr(rank_zero_only, "rank", 0) > 0:
                return None
            run_id = self._get().id
        tail = run_id.rstrip("/").rsplit("/", 1)[-1] or run_id
        return re.sub(r"[^\w.-]+", "_", tail)

    @property
    def save_dir(self) -> str:
        """The root of Lightning's files for this logger (``trainer.log_dir``)."""
        return self._save_dir

    @property
    def root_dir(self) -> str:
        """``<save_dir>/<name>``: where the versions of this project go."""
        return os.path.join(self._save_dir, self.name)

    @property
    def log_dir(self) -> str | None:
        """``<save_dir>/<name>/<version>``: this run's folder (its checkpoints go in
        ``checkpoints/`` there); None on ranks other than zero."""
        version = self.version
        return None if version is None else os.path.join(self.root_dir, version)

    # -- logging -----------------------------------------------------------------------------
    @rank_zero_only
    def log_hyperparams(
        self, params: dict[str, Any] | Namespace | None, *args: Any, **kwargs: Any
    ) -> None:
        """Records ``params`` as metadata, nested keys flattened with ``/``; a value that is
        not JSON data is recorded as its text, and a key a backend refuses is skipped with a
        warning: hyperparameters never stop the training."""
        if params:
            add_metadata_leniently(self._get(), flatten_params(params))

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if self._prefix:
            join = self.LOGGER_JOIN_CHAR
            metrics = {f"{self._prefix}{join}{k}": v for k, v in metrics.items()}
        self._get().log_metrics(metrics, step=step)

    def save(self) -> None:
        """Nothing to do: Lightning calls this after every ``log_metrics``, and the tracker
        already delivers in the background; waiting here would stall the training loop."""

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Training ended: a run the logger opened is closed with the ending
        :func:`finalize_ending` finds (``success``: finished; ``failed``: as the exception
        Lightning is handling says, Ctrl-C killed); a run that is not the logger's is told
        how its training ended, and gets what waits in it delivered."""
        if self._handle is not None:
            self._handle.finish(finalize_ending(status))

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback: ModelCheckpoint) -> None:
        if not self._log_model:
            return
        cb = checkpoint_callback
        score = cb.best_model_score
        best = {"monitor": cb.monitor, "score": None if score is None else float(score)}
        # The file just saved: ModelCheckpoint remembers it under a private name (absent,
        # the paths below still name what it keeps).
        saved = getattr(cb, "_last_checkpoint_saved", "") or ""
        # last_model_path is set with save_last=True; else the most recent save is the last.
        last = cb.last_model_path or saved
        wanted: dict[str, tuple[str, Mapping[str, object]]] = {}
        if cb.best_model_path:
            wanted["checkpoint/best"] = (cb.best_model_path, best)
        if last:
            wanted["checkpoint/last"] = (last, {"monitor": cb.monitor})
        if self._log_model == "all":
            # Every file saved, whatever kept it: the top k (with a monitor), the latest
            # (without one, ModelCheckpoint's best is the latest), the last.
            every: dict[str, float | None] = {
                p: None for p in (saved, cb.best_model_path, cb.last_model_path) if p
            }
            every.update({p: float(v) for p, v in cb.best_k_models.items()})
            for path, value in every.items():
                meta: dict[str, object] = {"monitor": cb.monitor}
                if value is not None:
                    meta["score"] = value
                wanted.setdefault(f"checkpoint/{Path(path).stem}", (path, meta))
        run = self._get()
        for artifact, (path, metadata) in wanted.items():
            path = os.path.abspath(path)
            if self._recorded.get(artifact) != path:
                run.add_artifact(artifact, path, metadata)
                self._recorded[artifact] = path


def finalize_ending(status: str) -> Ending:
    """How the training ended, from Lightning's ``finalize(status)`` and the exception it is
    handling then: ``success`` (and SLURM's requeue, ``finished``) ended well; ``failed`` is
    called from Lightning's ``except`` clause, so the exception it handles is at hand
    (``KeyboardInterrupt``: killed, its ``SIGTERMException``: the SIGTERM it stands for, any
    other: failed with its type and message), and without one the training failed; any other
    status (aborted, interrupted) was killed. SIGTERM, once the process got one, wins, as
    :func:`~async_tracker.runtime.ending.decide` says."""
    if status in ("success", "finished"):
        return decide()
    if status != "failed":
        return decide(None, None, Ending("killed"))
    exc = sys.exc_info()[1]
    if isinstance(exc, SIGTERMException):
        # Lightning's handler saw SIGTERM (ours may not have: another handler, or ours off)
        # and raised this SystemExit, whose code says nothing.
        return SIGTERM
    return decide(None, exc, Ending("failed"))


def _resolved(path: str | os.PathLike[str]) -> str:
    """A local path made absolute now (the same in every process, whatever the working
    directory becomes); a URL (``s3://...``) as it is."""
    text = os.fspath(path)
    return text if "://" in text else os.path.abspath(text)


__all__ = [
    "DEFAULT_SAVE_DIR",
    "AsyncTrackerLogger",
    "check_init_options",
    "finalize_ending",
    "new_run_id",
]
