"""torchx's own tests of its tracker API (``torchx/tracker/test/api_test.py``), run against
async_tracker with the imports rewritten (``torchx.tracker`` -> ``async_tracker``), as the
README tells torchx users to do.

torchx's wheels and sdists ship no tests, and their code is not ours to copy: point
``ASYNC_TRACKER_TORCHX_SRC`` at a checkout of https://github.com/pytorch/torchx to run them
(skipped otherwise). tests/torchx/test_read_own_writes.py checks the same behaviour in our
own words, always.
"""

from __future__ import annotations

import os
import re
import sys
import types
import unittest
from collections.abc import Iterator
from pathlib import Path

import pytest

import async_tracker.api
from async_tracker.factory import trackers_config_from_environ

ENV_TORCHX_SRC = "ASYNC_TRACKER_TORCHX_SRC"
# Read at collection: each test's environment is cleared of ASYNC_TRACKER_* (tests/conftest.py).
TORCHX_SRC = os.environ.get(ENV_TORCHX_SRC)
API_TEST = "torchx/tracker/test/api_test.py"

# The tests that patch torchx's internals rather than use its API: ``torchx.tracker.api``'s
# ``load_group`` and ``load_module`` (how torchx finds entry points; ours is
# async_tracker.factory, tested in tests/core/test_env.py), and ``run_from_env``'s
# functools cache (``AppRun.run_from_env.cache_clear()``; ours is ``reset_from_env()``).
TORCHX_INTERNALS = frozenset(
    {
        "test_env_factory_test",
        "test_tracker_from_environ",
        "test_tracker_from_environ_with_config_setting",
        "test_tracker_from_environ_with_missing_entrypoint",
        "test_build_trackers",
        "test_build_trackers_with_module",
        "test_build_trackers_with_no_entrypoints_group_defined",
        "test_build_trackers_with_no_trackers_defined",
        "test_run_from_env_not_launched_with_torchx",
    }
)


@pytest.fixture
def torchx_api_test(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """torchx's api_test.py as a module importing async_tracker."""
    if not TORCHX_SRC:
        pytest.skip(f"{ENV_TORCHX_SRC} names no torchx checkout")
    path = Path(TORCHX_SRC) / API_TEST
    text = path.read_text()
    text = re.sub(r"\btorchx\.tracker\.api\b", "async_tracker.api", text)
    text = re.sub(r"\btorchx\.tracker\.mlflow\b", "async_tracker.mlflow", text)
    text = re.sub(r"\bfrom torchx\.tracker import\b", "from async_tracker import", text)
    # A private name of torchx's that its tests import: ours under it, for them alone.
    monkeypatch.setattr(
        async_tracker.api,
        "_extract_tracker_name_and_config_from_environ",
        trackers_config_from_environ,
        raising=False,
    )
    module = types.ModuleType("torchx_api_test")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(text, str(path), "exec"), module.__dict__)
    yield module


def test_torchx_own_apprun_tests_pass(torchx_api_test: types.ModuleType) -> None:
    suite = unittest.defaultTestLoader.loadTestsFromModule(torchx_api_test)
    tests = [t for t in _flatten(suite) if t.id().rsplit(".", 1)[-1] not in TORCHX_INTERNALS]
    assert len(tests) >= 10, "api_test.py holds fewer tests than it did: a new layout?"
    result = unittest.TestResult()
    unittest.TestSuite(tests).run(result)
    failed = [(t.id(), why) for t, why in result.failures + result.errors]
    assert failed == [], "\n\n".join(f"{name}\n{why}" for name, why in failed)


def _flatten(suite: unittest.TestSuite) -> Iterator[unittest.TestCase]:
    for test in suite:
        if isinstance(test, unittest.TestSuite):
            yield from _flatten(test)
        else:
            yield test
