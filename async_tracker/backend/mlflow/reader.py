"""The read side's view of an MLflow tracking server: the generic reader (each run read
through the tracker API) with the status MLflow keeps for each run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from async_tracker.store.reader import GenericReader

if TYPE_CHECKING:
    from async_tracker.backend.mlflow.tracker import AsyncMLflowTracker

# MLflow's run statuses as readers show them.
_STATUS = {"RUNNING": "running", "SCHEDULED": "running", "FINISHED": "finished",
           "FAILED": "failed", "KILLED": "killed"}  # fmt: skip


class MLflowReader(GenericReader):
    """:class:`~async_tracker.store.reader.GenericReader` over an MLflow experiment, with
    each run's status and end time from MLflow."""

    backend: AsyncMLflowTracker

    def __init__(self, backend: AsyncMLflowTracker) -> None:
        super().__init__(backend, f"tracker {backend!r}")

    async def status(self, run_id: str) -> tuple[str, float | None]:
        run = await self.backend.get_run(run_id, create=False)
        if run is None:
            return "", None
        status = _STATUS.get(str(run.info.status), "")
        end_ms = run.info.end_time
        ended = status not in ("", "running") and end_ms
        return status, end_ms / 1000 if ended else None


__all__ = ["MLflowReader"]
