"""A store written by the real torchx package (from PyPI, in its own virtual environment):
``list jobs`` lists its runs from summaries rebuilt from torchx's files, once."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from async_tracker.backend.fsspec import REBUILT_TOKEN, summary_path
from async_tracker.cli.main import main
from tests.fsspec.conftest import torchx_python  # noqa: F401
from tests.fsspec.test_torchx_interop import WRITE_WITH_TORCHX

pytestmark = pytest.mark.timeout(600)  # the first run builds torchx's environment


def test_list_jobs_of_a_store_torchx_wrote(
    tmp_path: Path,
    torchx_python: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = tmp_path / "store"
    subprocess.run([str(torchx_python), "-c", WRITE_WITH_TORCHX, str(root)], check=True)
    assert main(["--json", "list", "jobs", "--store", str(root)]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"local://torchx/parent", "local://torchx/child"}
    child = rows["local://torchx/child"]
    # torchx's runs never end nor beat: running, as they always were.
    assert child["params"] == {"lr": 0.2, "layers": [1, 2]} and child["status"] == "running"
    assert rows["local://torchx/parent"]["params"] == {"kind": "parent"}
    rebuilt = Path(summary_path(str(root), "local://torchx/child", REBUILT_TOKEN))
    inode = rebuilt.stat().st_ino
    assert main(["--json", "list", "jobs", "--store", str(root)]) == 0
    assert {r["run_id"]: r for r in json.loads(capsys.readouterr().out)} == rows
    assert rebuilt.stat().st_ino == inode  # read, not rebuilt again
