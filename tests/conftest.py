"""Fixtures for the whole suite."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# The simulator's hypothesis profiles: "ci" (the default here: few, fixed examples) and
# "soak" (thousands, new ones each time): ``--hypothesis-profile=soak``.
_SIM_HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
settings.register_profile(
    "ci", max_examples=100, deadline=None, derandomize=True, suppress_health_check=_SIM_HEALTH
)
settings.register_profile(
    "soak", max_examples=3000, deadline=None, suppress_health_check=_SIM_HEALTH
)
settings.load_profile("ci")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("simulation", "the delivery simulator (tests/simulation)")
    group.addoption("--sim-seeds", type=int, default=300, help="schedules to run by seed")
    group.addoption(
        "--sim-start", default="0", help="the first seed, or 'random' for seeds never run"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sim_seed" in metafunc.fixturenames:
        count = metafunc.config.getoption("--sim-seeds")
        start = metafunc.config.getoption("--sim-start")
        first = random.SystemRandom().randrange(2**40) if start == "random" else int(start)
        metafunc.parametrize("sim_seed", range(first, first + count))


@pytest.fixture(autouse=True)
def _cache_in_tmp(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Every test's default spool lives under its own temporary cache directory, never the
    user's (XDG_CACHE_HOME, so that tests clearing ASYNC_TRACKER_* keep it)."""
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache
