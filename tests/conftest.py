"""Fixtures for the whole suite."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _cache_in_tmp(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Every test's default spool lives under its own temporary cache directory, never the
    user's (XDG_CACHE_HOME, so that tests clearing ASYNC_TRACKER_* keep it)."""
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache
