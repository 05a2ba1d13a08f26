"""The backend conformance suite on MLflow: a real tracking server, and a local SQLite store
(the default kind of tracking URI, no server)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import requests
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

from async_tracker import AsyncTrackerBase
from async_tracker.backend.mlflow import AsyncMLflowTracker, map_error
from async_tracker.base import Checked
from tests.conformance import BackendConformance


class MLflowFaults:
    """The faults of the conformance suite's retry test, as the MLflow mapping makes them."""

    def mapped_faults(self) -> tuple[BaseException, BaseException]:
        outage = map_error(requests.exceptions.ConnectionError("connection refused"), "log_batch")
        too_long = map_error(
            MlflowException("Tag value exceeds the maximum length of 8000 characters",
                            error_code=INVALID_PARAMETER_VALUE),
            "log_batch",
        )
        return outage, too_long

    def library_faults(self) -> tuple[BaseException, BaseException | None]:
        too_long = MlflowException(
            "'tags[0].value' exceeds the maximum length of 8000 characters",
            error_code=INVALID_PARAMETER_VALUE,
        )
        return requests.exceptions.ConnectionError("connection refused"), too_long

    def unstorable(self) -> Checked | None:
        return {"k" * 251: 1}  # MLflow's keys hold 250 characters


class TestMLflowConformance(MLflowFaults, BackendConformance):
    @pytest.fixture
    async def backend(self, tracking_uri: str) -> AsyncIterator[AsyncTrackerBase]:
        # One experiment for the class: run ids are unique per test (the run_id fixture).
        tracker = AsyncMLflowTracker("conformance", tracking_uri)
        yield tracker
        await tracker.aclose()


@pytest.fixture(scope="module")
def sqlite_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow-local') / 'mlflow.db'}"


# MLflow's SQL store uses SQLAlchemy APIs SQLAlchemy 2.1 deprecates; our warnings-are-errors
# setting would turn that into a failed write. (Through a server, it warns in the server.)
@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SADeprecationWarning")
class TestMLflowLocalSqliteConformance(MLflowFaults, BackendConformance):
    @pytest.fixture
    async def backend(
        self, sqlite_uri: str, tmp_path: Path
    ) -> AsyncIterator[AsyncTrackerBase]:
        tracker = AsyncMLflowTracker("conformance", sqlite_uri, str(tmp_path / "artifacts"))
        yield tracker
        await tracker.aclose()
