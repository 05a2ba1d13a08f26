"""torchx's import path for the MLflow tracker.

``from torchx.tracker.mlflow import MLflowTracker`` becomes
``from async_tracker.mlflow import MLflowTracker``. See :mod:`async_tracker.backend.mlflow`.
"""

from async_tracker.backend.mlflow import (
    AsyncMLflowTracker,
    MLflowTracker,
    create_tracker,
    default_experiment_name,
    flatten_params,
)

__all__ = [
    "AsyncMLflowTracker",
    "MLflowTracker",
    "create_tracker",
    "default_experiment_name",
    "flatten_params",
]
