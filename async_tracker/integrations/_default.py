"""What the framework integrations share: which run they log to, and turning a framework's
hyperparameters and logs into what ``AppRun`` takes without stopping the training.

Who opens a run closes it. An integration given ``run=`` leaves it to the caller; inside a
torchx job (``TORCHX_JOB_ID`` set) with no ``name=`` (nor ``id=``) of its own it logs to
``AppRun.run_from_env()``, the job's run, which the tracker closes at exit with the job's
outcome; otherwise (a named run inside a job is a child of the job's run, as ``init()``
makes it) it opens a run of its own with
``async_tracker.init()``, closes it when training ends, and reopens (resumes) the same run id
if the framework logs again afterwards (``trainer.fit()`` then ``trainer.test()``).

How a training ended is reported, never decided, here: an integration finds its ending with
:func:`async_tracker.runtime.ending.decide` (SIGTERM, else the exception it saw, else what it
knows without one) and hands it to :meth:`RunHandle.finish`, which closes a run of its own with
it, and reports it on a run that is not (``AppRun.report_ending``: the close at exit then
ends the run as its last training did, when nothing says otherwise).
"""

from __future__ import annotations

import logging
import os
from argparse import Namespace
from collections.abc import Mapping
from typing import Any, SupportsFloat

from async_tracker.init_run import init, job_run_id
from async_tracker.records import check_metadata
from async_tracker.run import AppRun
from async_tracker.runtime.ending import Ending

logger = logging.getLogger("async_tracker.integrations")

# Time allowed to deliver what an integration logged when training ends, for a run the
# integration does not close (closing is bounded by the run's own close_timeout).
FLUSH_TIMEOUT_S = 30.0


def in_torchx_job() -> bool:
    """Whether the process runs as a torchx job (``TORCHX_JOB_ID`` names its run)."""
    return job_run_id() is not None


def joins_job_run(name: str | None, init_options: Mapping[str, Any]) -> bool:
    """Whether an integration logs to the torchx job's run: inside a job, unless it names a
    run of its own (``name=``, or an ``id=`` other than the job's), which ``init()`` opens as
    a child of the job's run (the rule of one run per ``init()``)."""
    job_id = job_run_id()  # init()'s own reading of the job's environment
    return job_id is not None and name is None and init_options.get("id") in (None, job_id)


class RunHandle:
    """The run an integration logs to, opened at its first use.

    Args:
        run: a run of the caller's; never closed here.
        project, name, dir, init_options: ``async_tracker.init()``'s arguments for a run of
            our own, used when ``run`` is None and no torchx job id is set.
        default_project: the project when ``project`` is None.
    """

    def __init__(
        self,
        run: AppRun | None,
        project: str | None,
        name: str | None,
        dir: str | os.PathLike[str] | None,
        init_options: Mapping[str, Any],
        default_project: str,
    ) -> None:
        if run is not None:
            if not isinstance(run, AppRun):
                raise TypeError(f"run must be an AppRun, got {type(run).__name__}")
            named = (("project", project), ("name", name), ("dir", dir))
            given = [k for k, v in named if v is not None]
            if given or init_options:
                raise ValueError(
                    f"run= is a run of yours; {', '.join([*given, *init_options])} would "
                    "open another: pass one or the other"
                )
        self.project = project or default_project
        self._name = name
        self._dir = dir
        self._init_options = dict(init_options)
        self._run = run
        # True once we opened the run with init(): then it is ours to close.
        self._owned = False

    @property
    def current(self) -> AppRun | None:
        """The run, if one was opened (or given); opens nothing."""
        return self._run

    @property
    def owned(self) -> bool:
        return self._owned

    def get(self) -> AppRun:
        """The run to log to now: opened on first use; a run of ours closed by :meth:`finish`
        is reopened under the same id (resumed: step-less points continue after its last)."""
        run = self._run
        if run is None:
            if joins_job_run(self._name, self._init_options):
                unused = [k for k, v in (("dir", self._dir),) if v]
                if unused or self._init_options:
                    logger.warning(
                        "async_tracker: TORCHX_JOB_ID is set: logging to the job's run "
                        "(AppRun.run_from_env()); %s not used",
                        ", ".join([*unused, *self._init_options]),
                    )
                run = AppRun.run_from_env()
            else:
                # Outside a job, a run of our own; inside one, a named run (or one named by
                # an id of its own) is a run of its own too, a child of the job's run, as
                # init() makes it: one run per training, the sweep's trials kept apart.
                run = init(self.project, name=self._name, dir=self._dir, **self._init_options)
                self._owned = True
            self._run = run
        elif run.closed and self._owned:
            # Our own run again, whatever its first open asked: an id= of the caller's, or
            # resume="never" (the run exists now: it is the one we made). Its tags and note
            # were set at the first open: given again, they would undo the user's changes.
            options = {
                **{k: v for k, v in self._init_options.items() if k not in ("tags", "note")},
                "id": run.id,
                "resume": "allow",
            }
            run = init(self.project, dir=self._dir, **options)
            self._run = run
        return run

    def finish(self, ending: Ending) -> None:
        """Training ended as ``ending`` says: close a run of ours with it; on one that is
        not, report it (the run's close at exit, or the caller's, then knows how its last
        training ended) and deliver what waits in it (within ``FLUSH_TIMEOUT_S``: a backend
        that is down must not hold the end of training forever; what is left keeps going in
        the background)."""
        run = self._run
        if run is None or run.closed:
            return
        if self._owned:
            report = run.close(reason=ending)
        else:
            run.report_ending(ending)
            report = run.flush(FLUSH_TIMEOUT_S)
        if not report.ok:
            logger.warning("async_tracker: run %r: %s", run.id, report)


def flatten_params(params: Mapping[Any, Any] | Namespace, sep: str = "/") -> dict[str, object]:
    """Hyperparameters as flat metadata: nested mappings (and ``Namespace``) become
    ``outer/inner`` keys; each value is JSON data, converted as ``add_metadata`` converts it,
    else its ``str()``, so that no hyperparameter stops the training."""
    flat: dict[str, object] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, Namespace):
            value = vars(value)
        # An empty nested mapping stays as it is, under its key.
        if isinstance(value, Mapping) and (value or not prefix):
            for key, inner in value.items():
                walk(f"{prefix}{sep}{key}" if prefix else str(key), inner)
        else:
            flat[prefix] = json_safe(prefix, value)

    walk("", params)
    return flat


def json_safe(key: str, value: object) -> object:
    """``value`` as ``add_metadata`` stores it, or its text when that refuses it."""
    try:
        return check_metadata({key: value})[key]
    except (TypeError, ValueError):
        text = value if isinstance(value, str) else str(value)
        # A lone surrogate is the one thing text can hold that no backend stores.
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def add_metadata_leniently(run: AppRun, metadata: Mapping[str, object]) -> None:
    """``run.add_metadata(**metadata)``; when a backend refuses some keys at the call site
    (a value over MLflow's tag limit), the others are recorded and those are named in a
    warning, instead of stopping the training."""
    try:
        run.add_metadata(**metadata)
        return
    except (TypeError, ValueError):
        pass
    for key, value in metadata.items():
        try:
            run.add_metadata(**{key: value})
        except (TypeError, ValueError) as exc:
            logger.warning("async_tracker: run %r: metadata %r not recorded: %s", run.id, key, exc)


def numeric_logs(logs: Mapping[str, object]) -> tuple[dict[str, SupportsFloat], list[str]]:
    """The entries of ``logs`` that are numbers (a one-element tensor is passed on as it is:
    ``AppRun`` reads it), and the keys of the others."""
    numbers: dict[str, SupportsFloat] = {}
    skipped: list[str] = []
    for key, value in logs.items():
        numel = getattr(value, "numel", None)
        if callable(numel):
            # A tensor: its size is known without reading it (no device sync here).
            if numel() == 1:
                numbers[key] = value  # type: ignore[assignment]  # a tensor has __float__
            else:
                skipped.append(key)
            continue
        if isinstance(value, (str, bytes)):  # float() parses text: not a metric here
            skipped.append(key)
            continue
        try:
            numbers[key] = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):
            skipped.append(key)
    return numbers, skipped


__all__ = [
    "FLUSH_TIMEOUT_S",
    "RunHandle",
    "add_metadata_leniently",
    "flatten_params",
    "in_torchx_job",
    "joins_job_run",
    "json_safe",
    "numeric_logs",
]
