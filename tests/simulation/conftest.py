"""A fast directory for the simulator's spools: a memory file system where there is one (a
schedule renames an ack file per delivered batch; on an overlay disk each rename costs
milliseconds, in memory a tenth of that). The spool code is the same either way."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

FAST = Path("/dev/shm")


@pytest.fixture
def sim_dir() -> Iterator[Callable[[], Path]]:
    made: list[Path] = []

    def make() -> Path:
        base = str(FAST) if FAST.is_dir() else None
        path = Path(tempfile.mkdtemp(prefix="async-tracker-sim-", dir=base))
        made.append(path)
        return path

    yield make
    for path in made:
        shutil.rmtree(path, ignore_errors=True)
