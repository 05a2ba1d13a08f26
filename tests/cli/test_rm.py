"""``async-tracker rm RUN... [--yes]``: deletes runs (by unique prefix) from local and S3
stores, TensorBoard folders and what they left in the spool; asks first unless ``--yes``;
other runs stay as they were."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from async_tracker import AppRun
from async_tracker.adapters import as_sync
from async_tracker.backend.fsspec import INDEX_PREFIX, encode_run_id, summary_path
from async_tracker.cli.main import main
from async_tracker.cli.query import read_metrics
from async_tracker.init_run import open_store
from async_tracker.spool import has_spool, run_dir_name
from async_tracker.store.open import open_reader
from tests.cli.conftest import child_env, cli
from tests.core.helpers import wait_until
from tests.faulty import FaultyTracker, Hang

KEEP = "proj/keep-1"
GONE = "proj/gone-2"
OTHER = "other/gone-3"


class Terminal(io.StringIO):
    """What a person types, as a terminal's stdin."""

    def isatty(self) -> bool:
        return True


def write(url: str, *run_ids: str) -> None:
    for run_id in run_ids:
        with AppRun(run_id, [open_store(url)]) as run:
            run.add_metadata(lr=0.1)
            run.log_metric("loss", 1.0, step=0)


def ids(url: str) -> set[str]:
    return set(as_sync(open_store(url)).run_ids())


def listed(url: str, capsys: pytest.CaptureFixture[str]) -> set[str]:
    capsys.readouterr()
    assert main(["--store", url, "--json", "list", "jobs"]) == 0
    return {r["run_id"] for r in json.loads(capsys.readouterr().out)}


@pytest.fixture(params=["local", "s3"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "runs")
    return str(request.getfixturevalue("s3_store"))


def test_rm_by_prefix_deletes_those_runs_only(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    write(url, KEEP, GONE, OTHER)
    kept = as_sync(open_store(url))
    before = (kept.metadata(KEEP), read_metrics(open_reader(kept), KEEP))
    assert listed(url, capsys) == {KEEP, GONE, OTHER}

    assert main(["--store", url, "rm", "proj/g", OTHER, "--yes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{GONE}: store {url}: deleted", f"{OTHER}: store {url}: deleted"]
    assert ids(url) == {KEEP}
    assert listed(url, capsys) == {KEEP}
    assert (kept.metadata(KEEP), read_metrics(open_reader(kept), KEEP)) == before
    if not url.startswith("s3://"):
        # Nothing of theirs is left (status/, heartbeat/, claim.json, their summaries) but
        # the tombstones that void them in the run index until its next compaction.
        root = Path(url)
        left = [p.name for p in root.iterdir() if not p.name.startswith(INDEX_PREFIX)]
        assert left == [encode_run_id(KEEP)]
        for gone in (GONE, OTHER):
            assert not list(root.glob(Path(summary_path(url, gone, "*")).name))
            assert list(root.glob(f"{INDEX_PREFIX}removed-*"))

    # A run already gone: an unknown id, nothing done.
    assert main(["--store", url, "rm", GONE, "--yes"]) == 2
    assert f"unknown run id {GONE!r}" in capsys.readouterr().err


def test_rm_removes_the_run_from_its_sources_lineage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = str(tmp_path / "runs")
    write(url, KEEP)
    with AppRun(GONE, [open_store(url)]) as run:
        run.add_source(KEEP, "checkpoint")
    assert [d.source_run_id for d in as_sync(open_store(url)).lineage(KEEP).descendants] == [GONE]
    assert main(["--store", url, "rm", GONE, "--yes"]) == 0
    assert as_sync(open_store(url)).lineage(KEEP).descendants == []
    assert ids(url) == {KEEP}


@pytest.mark.parametrize("answer", ["n\n", "\n", "", "yes\n", "y\n"])
def test_rm_asks_first(
    answer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    url = str(tmp_path / "runs")
    write(url, KEEP, GONE)
    monkeypatch.setattr(sys, "stdin", Terminal(answer))
    code = main(["--store", url, "rm", GONE])
    out, err = capsys.readouterr()
    assert f"  {GONE}  (store {url})" in err
    assert "delete 1 run? [y/N] " in err
    if answer.startswith("y"):
        assert code == 0
        assert out == f"{GONE}: store {url}: deleted\n"
        assert ids(url) == {KEEP}
    else:
        assert out == ""
        assert ids(url) == {KEEP, GONE}
        # "n" or a bare Enter: no, as asked; the input ended: nobody answered, a failure.
        assert code == (1 if answer == "" else 0)
        assert "nothing deleted" in err


def test_rm_without_a_terminal_deletes_nothing(tmp_path: Path) -> None:
    url = str(tmp_path / "runs")
    write(url, KEEP, GONE)
    result = cli("--store", url, "rm", GONE)  # stdin: /dev/null, not a terminal
    assert result.returncode == 1
    assert "pass --yes" in result.stderr
    assert ids(url) == {KEEP, GONE}


def test_rm_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "runs")
    write(url, GONE)
    assert main(["--store", url, "--json", "rm", GONE, "-y"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"run_id": GONE, "where": f"store {url}", "result": "deleted", "reason": ""}
    ]


def test_rm_of_every_configured_tracker_says_where_it_was_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tensorboard")
    from async_tracker.backend.tensorboard import TensorBoardTracker

    store, board = tmp_path / "runs", tmp_path / "tb"
    write(str(store), KEEP, GONE)
    # In TensorBoard: the run, and a run whose folder is inside the run's ("a" and "a/b").
    nested = f"{GONE}/child"
    tb = TensorBoardTracker(board)
    with AppRun(GONE, [tb]) as run:
        run.log_metric("loss", 1.0, step=0)
    with AppRun(nested, [tb]) as run:
        run.log_metric("loss", 2.0, step=0)
    assert set(TensorBoardTracker(board).run_ids()) == {GONE, nested}
    cfg = tmp_path / "tb.cfg"
    cfg.write_text(f"root_path={board}\n")
    fs_cfg = tmp_path / "fs.cfg"
    fs_cfg.write_text(f"protocol=file\nroot_path={store}\n")
    monkeypatch.setenv("TORCHX_TRACKERS", "fsspec,tensorboard")
    monkeypatch.setenv("TORCHX_TRACKER_FSSPEC_CONFIG", str(fs_cfg))
    monkeypatch.setenv("TORCHX_TRACKER_TENSORBOARD_CONFIG", str(cfg))

    assert main(["rm", GONE, KEEP, "--yes"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{GONE}: tracker 'fsspec': deleted",
        f"{GONE}: tracker 'tensorboard': deleted",
        f"{KEEP}: tracker 'fsspec': deleted",
        f"{KEEP}: tracker 'tensorboard': not found",
    ]
    assert ids(str(store)) == set()
    after = TensorBoardTracker(board)
    assert set(after.run_ids()) == {nested}
    assert [p.value for p in read_metrics(open_reader(after), nested)["loss"]] == [2.0]
    assert not any("tfevents" in p.name for p in (board / "proj" / "gone-2").iterdir())


def test_rm_deletes_a_dead_process_spool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url, spool = str(tmp_path / "runs"), tmp_path / "spool"
    write(url, KEEP, GONE)
    # A process that could not deliver its records left them in the spool and exited: the
    # next sync (or start) of the run would write them to the store again.
    job = (
        "import sys\n"
        "from async_tracker import AppRun\n"
        "from tests.faulty import FaultyTracker, Hang\n"
        "backend = FaultyTracker(name='fsspec').always('write_batch', Hang())\n"
        f"run = AppRun({GONE!r}, [backend], spool_dir=sys.argv[1], flush_interval=3600)\n"
        "run.log_metric('loss', 5.0, step=1)\n"
        "assert run.close(0.2).spooled == 1\n"
    )
    subprocess.run([sys.executable, "-c", job, str(spool)], check=True, env=child_env(), timeout=60)
    assert has_spool(spool, GONE)
    monkeypatch.setenv("ASYNC_TRACKER_SPOOL_DIR", str(spool))

    assert main(["--store", url, "rm", GONE, "--yes"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{GONE}: store {url}: deleted",
        f"{GONE}: spool {spool / run_dir_name(GONE)}: deleted",
    ]
    assert not (spool / run_dir_name(GONE)).exists()
    assert main(["sync", str(spool), "--to", url]) == 0
    assert "nothing to replay" in capsys.readouterr().out
    assert ids(url) == {KEEP}


def test_rm_keeps_the_spool_of_a_live_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url, spool = str(tmp_path / "runs"), tmp_path / "spool"
    write(url, GONE)
    monkeypatch.setenv("ASYNC_TRACKER_SPOOL_DIR", str(spool))
    release = threading.Event()
    backend = FaultyTracker(name="fsspec").always("write_batch", Hang(release))
    # Write-ahead: the record is on disk, under this live pipeline's lock, before delivery.
    live = AppRun(GONE, [backend], spool_dir=str(spool), durable=True, flush_interval=3600)
    try:
        live.log_metric("loss", 1.0, step=0)
        live.flush(0)
        wait_until(lambda: has_spool(spool, GONE), "the write-ahead segment")

        assert main(["--store", url, "rm", GONE, "--yes"]) == 1
        out = capsys.readouterr().out.splitlines()
        assert out[0] == f"{GONE}: store {url}: deleted"
        assert out[1].startswith(f"{GONE}: spool {spool / run_dir_name(GONE)}: could not: ")
        assert "a live process is writing it (fsspec)" in out[1]
        assert has_spool(spool, GONE)
    finally:
        release.set()
        live.close(30)


def test_rm_of_a_run_a_live_process_writes_needs_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = str(tmp_path / "runs")
    monkeypatch.setenv("ASYNC_TRACKER_SPOOL_DIR", str(tmp_path / "spool"))
    write(url, KEEP)
    # A run left open: its lane beats at once, then every 30 s.
    live = AppRun(GONE, [open_store(url)], spool_dir=str(tmp_path / "spool"), heartbeat_s=30)
    try:
        live.log_metric("loss", 1.0, step=0)
        assert live.flush(30).ok
        beats = Path(url) / encode_run_id(GONE) / "heartbeat"
        wait_until(lambda: beats.is_dir() and any(beats.iterdir()), "a heartbeat")

        assert main(["--store", url, "rm", GONE, "--yes"]) == 1
        (line,) = capsys.readouterr().out.splitlines()
        assert line.startswith(f"{GONE}: store {url}: could not: a live process is writing it")
        assert "rm --force deletes it anyway" in line
        assert ids(url) == {KEEP, GONE}

        assert main(["--store", url, "rm", GONE, "--yes", "--force"]) == 0
        assert capsys.readouterr().out.splitlines() == [f"{GONE}: store {url}: deleted"]
        assert ids(url) == {KEEP}
    finally:
        live.close(30)


def test_rm_of_a_run_a_live_child_process_writes_needs_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = str(tmp_path / "runs")
    monkeypatch.setenv("ASYNC_TRACKER_SPOOL_DIR", str(tmp_path / "spool"))
    job = (
        "import sys\n"
        "from async_tracker import AppRun\n"
        "from async_tracker.init_run import open_store\n"
        f"run = AppRun({GONE!r}, [open_store(sys.argv[1])], spool_dir=sys.argv[2], "
        "heartbeat_s=30)\n"
        "run.log_metric('loss', 1.0, step=0)\n"
        "assert run.flush(30).ok\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"  # open until the test lets go
        "run.close(30)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", job, url, str(tmp_path / "spool")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env(),
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        beats = Path(url) / encode_run_id(GONE) / "heartbeat"
        wait_until(lambda: beats.is_dir() and any(beats.iterdir()), "a heartbeat")
        assert main(["--store", url, "--json", "rm", GONE, "--yes"]) == 1
        (outcome,) = json.loads(capsys.readouterr().out)
        assert outcome["result"] == "could not"
        assert outcome["reason"].startswith("a live process is writing it")
        assert main(["--store", url, "rm", GONE, "--yes", "--force"]) == 0
        assert capsys.readouterr().out.splitlines() == [f"{GONE}: store {url}: deleted"]
    finally:
        child.communicate("", timeout=60)
    assert child.returncode == 0
