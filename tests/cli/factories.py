"""A tracker factory that ``.torchxconfig`` names by value (``mine = tests.cli.factories:create``):
the fsspec backend, built from the same config file, so the tests' store answers under a name
that is not a registered factory."""

from __future__ import annotations

from async_tracker.backend.fsspec import FsspecTracker
from async_tracker.backend.fsspec import create as create_fsspec


def create(config: str | None) -> FsspecTracker:
    return create_fsspec(config)
