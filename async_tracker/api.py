"""torchx's tracker API, under async_tracker: replace ``torchx.tracker`` with ``async_tracker``.

Everything here is re-exported from :mod:`async_tracker`.
"""

from __future__ import annotations

from async_tracker.base import AsyncTrackerBase, TrackerBase
from async_tracker.factory import (
    ENV_TORCHX_JOB_ID,
    ENV_TORCHX_PARENT_RUN_ID,
    ENV_TORCHX_TRACKERS,
    build_trackers,
    tracker_config_env_var_name,
    trackers_from_environ,
)
from async_tracker.records import Lineage, TrackerArtifact, TrackerMetric, TrackerSource
from async_tracker.run import AppRun, AppRunTrackableSource, app_run_from_env

__all__ = [
    "ENV_TORCHX_JOB_ID",
    "ENV_TORCHX_PARENT_RUN_ID",
    "ENV_TORCHX_TRACKERS",
    "AppRun",
    "AppRunTrackableSource",
    "AsyncTrackerBase",
    "Lineage",
    "TrackerArtifact",
    "TrackerBase",
    "TrackerMetric",
    "TrackerSource",
    "app_run_from_env",
    "build_trackers",
    "tracker_config_env_var_name",
    "trackers_from_environ",
]
