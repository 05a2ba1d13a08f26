"""Fixtures for torchx plug-ins as backends: a clean environment and ``run_from_env()``
singleton, and child interpreters in torchx's venv that import this checkout."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import filelock
import pytest

from tests.core.helpers import REPO, python_env
from tests.fsspec.conftest import torchx_python  # the venv fixture, shared
from tests.torchx import plugins

__all__ = ["torchx_python"]

TorchxChild = Callable[..., Any]


@pytest.fixture(autouse=True)
def fresh_plugins() -> Iterator[None]:
    """No plug-in built before a test is seen by it (the environment is clean: see
    tests/conftest.py)."""
    plugins.BUILT.clear()
    yield
    plugins.BUILT.clear()


@pytest.fixture(scope="session")
def torchx_tracker_python(torchx_python: Path) -> Path:
    """torchx's venv, with async_tracker's light dependencies added (async_tracker itself
    comes from this checkout through PYTHONPATH). fsspec and filelock are torchx's too."""
    # Our dependencies as pyproject.toml lists them (names only: the pins are constraints').
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pytest's own dependency on 3.10
        import tomli as tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    # Those with an environment marker may not apply to that venv: pip decides.
    unmarked = [dep for dep in project["dependencies"] if ";" not in dep]
    wanted = [re.split(r"[<>=!\[ ]", dep, maxsplit=1)[0] for dep in unmarked]
    check = "import importlib.metadata as m, sys; [m.version(n) for n in sys.argv[1:]]"
    # One install at a time: each pytest-xdist worker runs this session fixture, and two pips
    # installing into one venv at once leave it broken.
    with filelock.FileLock(f"{torchx_python.parent.parent}.deps.lock"):
        if subprocess.run([str(torchx_python), "-c", check, *wanted]).returncode:
            subprocess.run(
                [
                    str(torchx_python), "-m", "pip", "install", "-q",
                    "-c", str(REPO / "constraints.txt"), *project["dependencies"],
                ],
                check=True,
            )
    return torchx_python


@pytest.fixture
def torchx_child(torchx_tracker_python: Path, tmp_path: Path) -> TorchxChild:
    """Runs ``script`` in torchx's venv (``sys.argv[1:]`` = ``args``, extra variables from
    ``env``) and returns the JSON of its last stdout line; a failure shows its stderr."""

    def run(script: str, *args: str, env: dict[str, str] | None = None) -> Any:
        done = subprocess.run(
            [str(torchx_tracker_python), "-c", script, *args],
            cwd=tmp_path,
            env=python_env(**(env or {})),
            capture_output=True,
            text=True,
        )
        if done.returncode != 0 or not done.stdout.strip():
            pytest.fail(f"the child failed ({done.returncode}):\n{done.stderr}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    return run

