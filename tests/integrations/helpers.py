"""Helpers for the integration tests: a backend that records how runs ended, and a store
read back the way a user would (the fsspec backend, and the CLI)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

from async_tracker import TrackerArtifact, TrackerMetric
from async_tracker.backend.fsspec import FsspecTracker
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.base import CloseReason

REPO = Path(__file__).resolve().parents[2]


class Recorder(InMemoryTracker):
    """Stores like any backend, and records each ``end_run`` as (run id, reason)."""

    def __init__(self) -> None:
        super().__init__(name="recorder")
        self.ended: list[tuple[str, CloseReason]] = []

    async def end_run(self, run_id: str, reason: CloseReason) -> None:
        self.ended.append((run_id, reason))


@dataclass(frozen=True)
class Store:
    """A local store as ``async_tracker.init(dir=root)`` writes it."""

    root: Path

    def _tracker(self) -> FsspecTracker:
        return FsspecTracker(LocalFileSystem(), str(self.root))

    def run_ids(self) -> list[str]:
        return sorted(self._tracker().run_ids())

    def metadata(self, run_id: str) -> Mapping[str, object]:
        return self._tracker().metadata(run_id)

    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        return self._tracker().artifacts(run_id)

    def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        return self._tracker().metrics(run_id)

    def parents(self, run_id: str) -> list[str]:
        """The runs ``run_id`` came from (its sources' parent run ids)."""
        return [s.source_run_id for s in self._tracker().sources(run_id)]

    def steps(self, run_id: str, name: str) -> list[int]:
        return [p.step for p in self.metrics(run_id)[name]]

    def cli(self, *args: str) -> str:
        """``python -m async_tracker --tracker fsspec --config CFG ARGS``: its stdout."""
        config = self.root.parent / "store.cfg"
        config.write_text(f"protocol=file\nroot_path={self.root}\n")
        proc = subprocess.run(
            [sys.executable, "-m", "async_tracker", "--tracker", "fsspec", "--config",
             str(config), *args],
            capture_output=True,
            text=True,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            timeout=60,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc.stdout


def as_torchx_job(
    job_id: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The environment torchx's runner sets for job ``job_id`` whose tracker is the fsspec
    store ``store``."""
    config = tmp_path / "fsspec.cfg"
    config.write_text(f"protocol=file\nroot_path={store.root}\n")
    monkeypatch.setenv("TORCHX_JOB_ID", job_id)
    monkeypatch.setenv("TORCHX_TRACKERS", "fsspec")
    monkeypatch.setenv("TORCHX_TRACKER_FSSPEC_CONFIG", str(config))
