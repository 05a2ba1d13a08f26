"""Fixtures and hooks for the whole suite.

The ``server`` marker: a test needs a server (``mlflow server``, moto's S3 server), an extra
beyond ``[test]`` (mlflow, s3, plot) or torchx's virtual environment. It is given here, by the
fixtures a test uses and by directory, so that new tests get it without asking; a test that
needs one otherwise (an example that starts its own server) is marked by hand. CI runs the
whole suite on one Python and ``-m "not server and not scale"`` on the others (``scale``:
tests whose cost is their size, marked by hand), in venvs holding ``[test]`` alone, where those
tests are deselected and a missing extra skips (``pytest.importorskip``).

A run that does not deselect them (``python -m pytest``, the README's command) is meant to run
everything: there a test skipped for a module it could not import fails instead, naming it.
"""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Generator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from async_tracker import AppRun

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

TESTS = Path(__file__).resolve().parent

# Fixtures (looked up in each test's whole fixture closure) that start a server or build
# torchx's venv, and the fixtures below that import an extra.
SERVER_FIXTURES = frozenset({"mlflow_server", "s3_endpoint", "torchx_python", "plot_extra"})
# Directories whose every test needs an extra: the MLflow backend's, even without a server.
SERVER_DIRS = (TESTS / "mlflow",)

MISSING_MODULE = "could not import "  # how pytest.importorskip's skips begin

# The tests' models are tiny: one thread each. torch's OpenMP threads otherwise wait for work
# by spinning, which on CI's 2 cores takes CPU from the suites running beside (tests and their
# child processes alike: set before torch is imported, inherited by children).
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No TORCHX_*, ASYNC_TRACKER_* or MLFLOW_TRACKING_URI variable of the machine leaks into
    a test, and no run_from_env() run outlives it: closed (its records delivered or spooled
    within a second) and forgotten, before the test and after."""
    for var in list(os.environ):
        if var.startswith(("TORCHX_", "ASYNC_TRACKER_")) or var == "MLFLOW_TRACKING_URI":
            monkeypatch.delenv(var)
    AppRun.reset_from_env(timeout=1.0)
    yield
    AppRun.reset_from_env(timeout=1.0)


@pytest.fixture(autouse=True)
def _cache_in_tmp(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Every test's default spool lives under its own temporary cache directory, never the
    user's (XDG_CACHE_HOME, so that tests clearing ASYNC_TRACKER_* keep it)."""
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


@pytest.fixture(autouse=True)
def _signal_mask_kept() -> Iterator[None]:
    """No test leaves the main thread with signals blocked (async_tracker blocks SIGTERM for
    a moment around a thread's start and a fork): every child process a later test starts
    would inherit the mask, and never see the SIGTERM it waits for."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    yield
    after = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    assert after == before, f"the main thread's signal mask was {before}, now {after}"


@pytest.fixture(scope="session")
def plot_extra() -> ModuleType:
    """matplotlib (the ``plot`` extra); the test is skipped without it."""
    return pytest.importorskip("matplotlib")


# For a test (or a pytest.param) that draws, or otherwise needs matplotlib installed.
needs_matplotlib = pytest.mark.usefixtures("plot_extra")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())) or any(
            item.path.is_relative_to(d) for d in SERVER_DIRS
        ):
            item.add_marker(pytest.mark.server)


def _missing_extra(skip_message: str) -> str:
    return (
        f'{skip_message}\nThis run includes the server tests (no -m "not server"), so every '
        "extra must be installed: pip install -e '.[all,test]' -c constraints.txt"
    )


class MissingExtrasFail:
    """Turns pytest.importorskip's skips into failures, in a test (its fixtures included) or
    at import time (a module's or a conftest's; the latter is reported by a collector above
    this directory, out of a conftest hook's reach: hence a plugin)."""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        exc = call.excinfo
        if (
            report.skipped
            and exc is not None
            and exc.errisinstance(pytest.skip.Exception)
            and str(exc.value).startswith(MISSING_MODULE)
        ):
            report.outcome = "failed"
            report.longrepr = _missing_extra(str(exc.value))
        return report

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(
        self, collector: pytest.Collector
    ) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
        report = yield
        longrepr: Any = report.longrepr
        if report.skipped and isinstance(longrepr, tuple) and len(longrepr) == 3:
            message = str(longrepr[2]).removeprefix("Skipped: ")
            if message.startswith(MISSING_MODULE):
                report.outcome = "failed"
                report.longrepr = _missing_extra(message)
        return report


def pytest_configure(config: pytest.Config) -> None:
    # Unless the run deselects the server tests (-m "not server"), it is meant to run
    # everything: a missing extra is a failure there, not a skip.
    if "not server" not in (config.getoption("markexpr") or ""):
        config.pluginmanager.register(MissingExtrasFail(), "async-tracker-missing-extras-fail")
