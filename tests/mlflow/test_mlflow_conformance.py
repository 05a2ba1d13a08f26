"""The backend conformance suite on MLflow: a real tracking server, and a local SQLite store
(the default kind of tracking URI, no server)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from async_tracker import AsyncTrackerBase
from async_tracker.backend.mlflow import AsyncMLflowTracker
from tests.conformance import BackendConformance


class TestMLflowConformance(BackendConformance):
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
class TestMLflowLocalSqliteConformance(BackendConformance):
    @pytest.fixture
    async def backend(
        self, sqlite_uri: str, tmp_path: Path
    ) -> AsyncIterator[AsyncTrackerBase]:
        tracker = AsyncMLflowTracker("conformance", sqlite_uri, str(tmp_path / "artifacts"))
        yield tracker
        await tracker.aclose()
