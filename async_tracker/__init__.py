"""async_tracker: an async-first experiment tracker behind torchx's tracker API.

Existing torchx code moves over by changing one import::

    from async_tracker import AppRun        # was: from torchx.tracker import AppRun

    run = AppRun.run_from_env()
    run.add_metadata(lr=0.01)
    run.log_metric("loss", 0.25, step=10)   # returns at once; a background flusher delivers
"""

from __future__ import annotations

from async_tracker.adapters import as_async, as_sync
from async_tracker.api import (
    ENV_TORCHX_JOB_ID,
    ENV_TORCHX_PARENT_RUN_ID,
    ENV_TORCHX_TRACKERS,
    AppRun,
    AppRunTrackableSource,
    AsyncTrackerBase,
    Lineage,
    TrackerArtifact,
    TrackerBase,
    TrackerMetric,
    TrackerSource,
    app_run_from_env,
    build_trackers,
    tracker_config_env_var_name,
    trackers_from_environ,
)
from async_tracker.errors import (
    BackendError,
    BackendUnavailableError,
    DeliveryError,
    PermanentBackendError,
    RecordError,
    TrackerClosedError,
    TrackerConfigError,
    TrackerError,
    TransientBackendError,
)
from async_tracker.init_run import init
from async_tracker.records import Batch
from async_tracker.report import BackendStatus, FlushReport, TrackerStatus
from async_tracker.retry import RetryPolicy
from async_tracker.run import RunState
from async_tracker.store.api import Store
from async_tracker.store.expr import FilterError
from async_tracker.store.summary import MetricSummary, RunSummary

__version__ = "0.1.0"

__all__ = [
    "ENV_TORCHX_JOB_ID",
    "ENV_TORCHX_PARENT_RUN_ID",
    "ENV_TORCHX_TRACKERS",
    "AppRun",
    "AppRunTrackableSource",
    "AsyncTrackerBase",
    "BackendError",
    "BackendStatus",
    "BackendUnavailableError",
    "Batch",
    "DeliveryError",
    "FilterError",
    "FlushReport",
    "Lineage",
    "MetricSummary",
    "PermanentBackendError",
    "RecordError",
    "RetryPolicy",
    "RunState",
    "RunSummary",
    "Store",
    "TrackerArtifact",
    "TrackerBase",
    "TrackerClosedError",
    "TrackerConfigError",
    "TrackerError",
    "TrackerMetric",
    "TrackerSource",
    "TrackerStatus",
    "TransientBackendError",
    "app_run_from_env",
    "as_async",
    "as_sync",
    "build_trackers",
    "init",
    "tracker_config_env_var_name",
    "trackers_from_environ",
]
