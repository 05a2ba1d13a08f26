"""torchx's ``MLflowTracker`` (the blocking face of :class:`AsyncMLflowTracker`) and the
``mlflow`` tracker factory."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from async_tracker.adapters import SyncTracker
from async_tracker.backend.mlflow.config import (
    ENV_EXPERIMENT_NAME,
    default_experiment_name,
    read_config,
)
from async_tracker.backend.mlflow.mapping import flatten_params
from async_tracker.backend.mlflow.tracker import AsyncMLflowTracker
from async_tracker.base import CloseReason
from async_tracker.records import (
    TrackerMetric,
    check_artifact,
    check_metadata,
    check_name,
    check_source,
)
from async_tracker.runtime.process import close_reason


class MLflowTracker(SyncTracker):
    """torchx's ``MLflowTracker``, over :class:`AsyncMLflowTracker`.

    Each call blocks until MLflow has stored or answered. Given to an ``AppRun``, it is
    unwrapped: the run's writes never block, and the run ends the MLflow run when it closes.
    Call :meth:`close` when you used the tracker directly, so that the runs it wrote to end
    FINISHED (or FAILED) instead of staying RUNNING.

    Example::

        tracker = MLflowTracker("demo", "http://127.0.0.1:5000")
        tracker.add_metadata("my-run", lr=0.01)
        tracker.log_params_flat("my-run", Config())
        tracker.close()
    """

    def __init__(
        self,
        experiment_name: str | None = None,
        tracking_uri: str | None = None,
        artifact_location: str | None = None,
        *,
        name: str = "mlflow",
        metadata_params: bool = True,
    ) -> None:
        self.mlflow = AsyncMLflowTracker(
            experiment_name,
            tracking_uri,
            artifact_location,
            name=name,
            metadata_params=metadata_params,
        )
        super().__init__(self.mlflow)

    default_experiment_name = staticmethod(default_experiment_name)

    @property
    def tracking_uri(self) -> str:
        return self.mlflow.tracking_uri

    @property
    def experiment_name(self) -> str:
        return self.mlflow.experiment_name

    @property
    def experiment(self) -> Any:
        """The MLflow ``Experiment`` (looked up, or created, on first use)."""
        return self._call(self.mlflow.experiment)

    @property
    def experiment_id(self) -> str:
        return str(self.experiment.experiment_id)

    @property
    def artifact_location(self) -> str:
        return str(self.experiment.artifact_location)

    def get_run(self, run_name: str) -> Any:
        """The MLflow ``Run`` for ``run_name`` (a torchx run id), created if missing.
        Several runs with that name and none of ours: ``AmbiguousRunError`` (a
        ``ValueError``) naming the name and the count."""
        check_name(run_name, "run_id")
        return self._call(self.mlflow.get_run, run_name)

    def get_run_id(self, run_name: str) -> str:
        """The MLflow id of the run for ``run_name``."""
        return str(self.get_run(run_name).info.run_id)

    # MLflow's limits, checked here on the caller's thread (as AppRun does, through the
    # backend's validate): bad input raises ValueError at the call site, nothing is sent.
    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        self.mlflow.validate(check_metadata(kwargs))
        super().add_metadata(run_id, **kwargs)

    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        self.mlflow.validate(check_artifact(name, path, metadata))
        super().add_artifact(run_id, name, path, metadata)

    def add_source(self, run_id: str, source_id: str, artifact_name: str | None = None) -> None:
        self.mlflow.validate(check_source(source_id, artifact_name))
        super().add_source(run_id, source_id, artifact_name)

    def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        metrics = list(metrics)
        for metric in metrics:
            self.mlflow.validate(metric)
        super().add_metrics(run_id, metrics)

    def log_params_flat(self, run_name: str, cfg: Any, key: str = "") -> None:
        """Logs ``cfg`` (a dataclass, mapping or sequence, nested) as flat MLflow params, as
        torchx does: ``{"opt": {"lr": 0.1}, "layers": [8, 8]}`` gives ``opt.lr = 0.1`` and
        ``layers = [8, 8]``. See :func:`flatten_params`."""
        check_name(run_name, "run_id")
        params = flatten_params(cfg, key)  # on the caller's thread: errors raise here
        self._call(self.mlflow.log_params, run_name, params)

    def close(self, reason: CloseReason | None = None) -> None:
        """Ends the runs this process wrote to and has not ended yet: ``finished``, or
        ``failed`` when called while an exception propagates or as the process exits on one
        (decided here, in the caller's thread, which is where that is known)."""
        self._call(self.mlflow.aclose, close_reason(reason))

    def __enter__(self) -> MLflowTracker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close("finished" if exc is None else "failed")

    def __repr__(self) -> str:
        return (
            f"MLflowTracker(experiment_name={self.experiment_name!r}, "
            f"tracking_uri={self.tracking_uri!r})"
        )


def create_tracker(
    config: str | None = None, *, project: str | None = None
) -> MLflowTracker:
    """The ``mlflow`` tracker factory (``TORCHX_TRACKERS=mlflow``).

    ``config`` is what torchx passes: a directory holding ``.torchxconfig``, or that file's
    path, whose ``[tracker:mlflow]`` section may set ``experiment_name``, ``tracking_uri`` and
    ``artifact_location``. ``$TORCHX_TRACKING_EXPERIMENT_NAME`` overrides the experiment name
    (torchx's ``dist.spmd`` sets it). Without either, MLflow's own
    ``$MLFLOW_EXPERIMENT_NAME``, then ``project`` (``init()`` passes its project:
    ``init("mnist", backends=["mlflow"])`` lands in experiment ``mnist``), then torchx's
    default (named after the user and host).
    """
    values = read_config(config)
    experiment_name = (
        os.environ.get(ENV_EXPERIMENT_NAME)
        or values.get("experiment_name")
        or os.environ.get("MLFLOW_EXPERIMENT_NAME")
        or project
    )
    return MLflowTracker(
        experiment_name=experiment_name,
        tracking_uri=values.get("tracking_uri"),
        artifact_location=values.get("artifact_location"),
    )
