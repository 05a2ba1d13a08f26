"""``sync``: the command around the spool's replay (the replay itself is tested in
``tests/spool``): trackers configured the torchx way, exit codes, ``--json``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from async_tracker.cli.main import main
from tests.cli.conftest import Store, child_env, write_torchxconfig

pytest.importorskip("async_tracker.sync")

# A process whose backend (named "fsspec", the spool's key) hangs: close() spools everything
# and the process exits, leaving its segments for `sync`.
SPOOLING_JOB = """
import sys
from async_tracker import AppRun
from tests.faulty import FaultyTracker, Hang
backend = FaultyTracker(name="fsspec").always("write_batch", Hang())
run = AppRun("local://tests/spooled", [backend], spool_dir=sys.argv[1], flush_interval=3600)
run.add_metadata(a=1)
for step in range(20):
    run.log_metric("loss", float(step), step=step)
report = run.close(0.2)
assert report.spooled == 21, report
"""


def test_replays_a_dead_process_spool(
    writable_store: Store, isolated: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spool = tmp_path / "spool"
    subprocess.run(
        [sys.executable, "-c", SPOOLING_JOB, str(spool)], check=True, env=child_env(), timeout=60
    )
    write_torchxconfig(isolated, writable_store)
    assert main(["--json", "sync", str(spool), "--timeout", "30"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True
    assert data["runs"] == [
        {"run_id": "local://tests/spooled", "backend": "fsspec", "delivered": 21, "ok": True}
    ]
    tracker = writable_store.tracker()
    assert tracker.metadata("local://tests/spooled") == {"a": 1}
    assert [p.step for p in tracker.metrics("local://tests/spooled")["loss"]] == list(range(20))
    # Exactly once: a second sync finds nothing left.
    assert main(["sync", str(spool)]) == 0
    assert "nothing to replay" in capsys.readouterr().out


def test_spool_dir_from_the_environment(
    configured: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("ASYNC_TRACKER_SPOOL_DIR", str(tmp_path / "empty"))
    assert main(["sync"]) == 0
    assert f"nothing to replay in {tmp_path / 'empty'}" in capsys.readouterr().out


def test_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sync", str(tmp_path / "missing")]) == 2
    assert "no spool directory" in capsys.readouterr().err
    assert main(["sync", str(tmp_path)]) == 2
    assert "no tracker configured" in capsys.readouterr().err
