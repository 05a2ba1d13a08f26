"""``sync``: the command around the spool's replay (the replay itself is tested in
``tests/spool``): trackers configured the torchx way, exit codes, ``--json``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from async_tracker.adapters import as_sync
from async_tracker.cli.main import main
from async_tracker.cli.sync import is_store_url
from async_tracker.init_run import open_store
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


def spool_a_run(spool: Path) -> None:
    subprocess.run(
        [sys.executable, "-c", SPOOLING_JOB, str(spool)], check=True, env=child_env(), timeout=60
    )


def test_to_a_bare_word_is_a_store_unless_a_factory_has_that_name(
    tmp_path: Path, isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spool = tmp_path / "spool"
    spool_a_run(spool)
    # "store2" names no installed factory: a folder, as ./store2 would.
    assert main(["sync", str(spool), "--to", "store2"]) == 0
    assert set(as_sync(open_store(isolated / "store2")).run_ids()) == {"local://tests/spooled"}
    assert is_store_url("store2") and is_store_url("./x") and is_store_url("s3://b/p")
    assert not is_store_url("tensorboard") and not is_store_url("pkg.mod:create")
    (isolated / "mlflow").mkdir()  # an existing folder is the folder, whatever its name
    assert is_store_url("mlflow")


def test_a_store_that_stays_down_ends_the_sync_with_the_spool_intact(
    tmp_path: Path, isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spool = tmp_path / "spool"
    spool_a_run(spool)
    (isolated / "a-file").write_text("not a folder")  # a store that cannot take anything
    assert main(["sync", str(spool), "--to", "./a-file/runs", "--timeout", "0.5"]) == 1
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("async-tracker: ")]
    assert "gave up on 1 run(s) after 0.5 s each: 21 records stay in the spool" in line
    # Nothing was lost: the next sync, to a store that works, delivers everything.
    assert main(["--json", "sync", str(spool), "--to", "./good"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["delivered"] for r in data["runs"]] == [21]


# Logs an hour ago (its clock says so) to a backend that hangs, durably, and dies without
# ending its run (as a SIGKILL would): the records wait in the write-ahead spool.
KILLED_JOB = """
import os, sys, time
import async_tracker.run
from async_tracker import AppRun
from tests.faulty import FaultyTracker, Hang
an_hour_ago = time.time() - 3600
async_tracker.run._wall_clock = lambda: an_hour_ago
backend = FaultyTracker(name="fsspec").always("write_batch", Hang())
run = AppRun("local://tests/killed", [backend], spool_dir=sys.argv[1], durable=True,
             flush_interval=3600)
run.add_metadata(a=1)
for step in range(5):
    run.log_metric("loss", float(step), step=step)
run.flush(0.2)
print(an_hour_ago, flush=True)
os._exit(0)
"""


def test_a_synced_run_keeps_its_own_times(
    tmp_path: Path, isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spool = tmp_path / "spool"
    done = subprocess.run(
        [sys.executable, "-c", KILLED_JOB, str(spool)], check=True, env=child_env(),
        timeout=60, capture_output=True, text=True,
    )  # fmt: skip
    logged_at = float(done.stdout)
    assert main(["sync", str(spool), "--to", "./store"]) == 0
    capsys.readouterr()
    assert main(["--json", "--store", "./store", "list", "jobs"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    # Its last record is its last sign of life: not the sync, an hour later.
    assert row["start"] == pytest.approx(logged_at)
    assert row["heartbeat"] == pytest.approx(logged_at)
    assert row["duration_s"] == pytest.approx(0.0, abs=1e-3)


def test_to_a_factory_builds_it_with_its_torchx_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spool = tmp_path / "spool"
    subprocess.run(
        [sys.executable, "-c", SPOOLING_JOB, str(spool)], check=True, env=child_env(), timeout=60
    )
    config = tmp_path / "fsspec.cfg"
    config.write_text(f"protocol=file\nroot_path={tmp_path / 'runs'}\n")
    monkeypatch.setenv("TORCHX_TRACKER_FSSPEC_CONFIG", str(config))
    assert main(["sync", str(spool), "--to", "fsspec", "--timeout", "30"]) == 0
    capsys.readouterr()
    store = as_sync(open_store(str(tmp_path / "runs")))
    assert [p.step for p in store.metrics("local://tests/spooled")["loss"]] == list(range(20))


def test_a_store_made_with_options_is_not_offered_as_a_sync_url(tmp_path: Path) -> None:
    """The hint at exit (`sync SPOOL --to URL`) must not name a URL that reaches another store
    (or none): a config file's endpoint, credentials or other options are not in it."""
    from async_tracker.adapters import as_async
    from async_tracker.backend.fsspec import create

    plain, with_options = tmp_path / "plain.cfg", tmp_path / "options.cfg"
    plain.write_text(f"protocol=file\nroot_path={tmp_path / 'a'}\n")
    with_options.write_text(f"protocol=file\nroot_path={tmp_path / 'b'}\nauto_mkdir=true\n")
    a, b = as_async(create(str(plain))), as_async(create(str(with_options)))
    assert a.store_url == f"file://{tmp_path / 'a'}"
    assert b.store_url is None and b.url == f"file://{tmp_path / 'b'}"
