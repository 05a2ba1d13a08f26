"""What ended a run that did not finish, on a real MLflow server: the run's MLflow status
(FAILED, KILLED) and, beside it, the tag ``async_tracker.ending`` holding the exception's type
and message, read back as the run's metadata (and its summary's ``cause``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from async_tracker import AppRun
from async_tracker.backend.mlflow import AsyncMLflowTracker
from async_tracker.runtime.process import runtime
from async_tracker.store.summary import stored_ending
from async_tracker.tags import ENDING_KEY
from tests.mlflow.test_mlflow_lifecycle import only_run

pytestmark = pytest.mark.server


def test_a_failed_run_keeps_the_exceptions_type_and_message_as_a_tag(
    tracking_uri: str, experiment_name: str, client: Any
) -> None:
    backend = AsyncMLflowTracker(experiment_name, tracking_uri)
    with pytest.raises(KeyError), AppRun("failing", [backend]) as run:
        run.log_metric("loss", 1.0, step=0)
        raise KeyError("no such column")
    stored = only_run(client, experiment_name, "failing")
    assert stored.info.status == "FAILED"
    expected = {"reason": "failed", "type": "KeyError", "message": "'no such column'"}
    assert json.loads(stored.data.tags[ENDING_KEY]) == expected
    # Read back through the backend, as the readers do; never one of the run's params.
    metadata = runtime().loop.call(backend.metadata, "failing")
    assert stored_ending(metadata, "failed") == expected
    assert ENDING_KEY not in stored.data.params


def test_a_killed_run_says_what_killed_it(
    tracking_uri: str, experiment_name: str, client: Any
) -> None:
    backend = AsyncMLflowTracker(experiment_name, tracking_uri)
    with pytest.raises(KeyboardInterrupt), AppRun("stopped", [backend]) as run:
        run.log_metric("loss", 1.0, step=0)
        raise KeyboardInterrupt
    stored = only_run(client, experiment_name, "stopped")
    assert stored.info.status == "KILLED"
    assert json.loads(stored.data.tags[ENDING_KEY])["type"] == "KeyboardInterrupt"
