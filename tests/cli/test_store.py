"""The commands against a store named by ``--store`` (a local folder and an ``s3://`` bucket on
the moto server): run ids by prefix, the ``list jobs`` table with end statuses, ``compare``,
``export tensorboard``, ``sync --to``, and the errors of each."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from async_tracker import init
from async_tracker.adapters import as_sync
from async_tracker.cli.main import main
from async_tracker.init_run import open_store
from async_tracker.report import FlushReport
from async_tracker.store.open import open_reader
from tests.cli.conftest import Store, child_env, cli, write_torchxconfig
from tests.cli.test_sync import SPOOLING_JOB

ALPHA = "proj/alpha-1"
BETA = "proj/beta-2"
FAILED = "other/failed-3"
KILLED = "other/killed-4"
RUNNING = "other/running-5"


@pytest.fixture(params=["local", "s3"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "runs")
    return str(request.getfixturevalue("s3_store"))


def write_runs(url: str) -> None:
    """Two finished runs of one project, a failed one, a killed one, one still running."""
    for run_id, lr, losses in ((ALPHA, 0.1, [3.0, 1.0, 2.0]), (BETA, 0.01, [4.0, 0.5])):
        with init("proj", dir=url, id=run_id, config={"lr": lr, "batch": 32}) as run:
            for value in losses:
                run.log_metric("loss", value)
    with pytest.raises(RuntimeError), init("other", dir=url, id=FAILED) as run:
        run.log_metric("loss", 1.0)
        raise RuntimeError("the training loop failed")
    run = init("other", dir=url, id=KILLED)
    run.log_metric("loss", 1.0)
    run.close(reason="killed")
    # Written without a run, which would end it at close: nothing says it ended.
    as_sync(open_store(url)).add_metadata(RUNNING, note="still going")


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    assert main(["--json", *argv]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_list_jobs_shows_status_time_params_metrics(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    write_runs(url)
    rows = run_json(capsys, "--store", url, "list", "jobs")
    assert isinstance(rows, list)
    by_id = {row["run_id"]: row for row in rows}
    assert {k: v["status"] for k, v in by_id.items()} == {
        ALPHA: "finished", BETA: "finished", FAILED: "failed", KILLED: "killed",
        RUNNING: "running",
    }  # fmt: skip
    alpha = by_id[ALPHA]
    assert alpha["params"] == {"project": "proj", "lr": 0.1, "batch": 32}
    assert alpha["metrics"] == {"loss": 2.0}
    # Started at its first point, ended when the run said so (after its last point).
    assert alpha["start"] <= alpha["end"] and alpha["duration_s"] >= 0
    # Started at its first write (its metadata), not ended.
    assert by_id[RUNNING]["start"] is not None and by_id[RUNNING]["end"] is None

    assert main(["list", "jobs", "--store", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("RUN ID")
    assert {line.split()[0] for line in lines[2:]} == set(by_id)
    (alpha_line,) = [line for line in lines if line.startswith(ALPHA)]
    assert "finished" in alpha_line and "lr=0.1" in alpha_line and "loss=2" in alpha_line


def test_run_ids_by_unique_prefix(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")  # one of the commands tried is plot (the plot extra)
    write_runs(url)
    assert run_json(capsys, "--store", url, "list", "metadata", "proj/al") == {
        "project": "proj", "lr": 0.1, "batch": 32,
    }  # fmt: skip
    for argv in (["list", "metrics", "proj/"], ["compare", "proj/alpha", "other/"]):
        assert main(["--store", url, *argv]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        (line,) = err.splitlines()
        assert "matches" in line and "runs" in line
    assert main(["--store", url, "plot", "nope", "-o", "x.png"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "unknown run id 'nope'" in line


def test_compare_shows_params_that_differ_and_metric_stats(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    write_runs(url)
    data = run_json(capsys, "--store", url, "compare", "proj/a", "proj/b")
    assert data == {
        "runs": [ALPHA, BETA],
        "params": {"lr": {ALPHA: 0.1, BETA: 0.01}},  # batch and project are equal
        "metrics": {
            "loss": {
                ALPHA: {"last": 2.0, "min": 1.0, "max": 3.0},
                BETA: {"last": 0.5, "min": 0.5, "max": 4.0},
            }
        },
    }
    assert main(["--store", url, "compare", ALPHA, BETA]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-2:] == [ALPHA, BETA]
    assert [line.split() for line in lines[2:]] == [
        ["lr", "0.1", "0.01"],
        ["loss", "last", "2", "0.5"],
        ["loss", "min", "1", "0.5"],
        ["loss", "max", "3", "4"],
    ]


def test_export_tensorboard(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tensorboard")  # the tensorboard extra
    tensorboard = pytest.importorskip("async_tracker.backend.tensorboard")
    write_runs(url)
    out = tmp_path / "tb"
    data = run_json(capsys, "--store", url, "export", "tensorboard", "proj/a", FAILED, "--out",
                    str(out))  # fmt: skip
    assert [r["run_id"] for r in data["runs"]] == [ALPHA, FAILED]
    store = as_sync(open_store(url))
    board = tensorboard.TensorBoardTracker(out)
    assert sorted(board.run_ids()) == [FAILED, ALPHA]
    # The same points (steps and client timestamps), params and ending as in the store.
    assert board.metrics(ALPHA) == store.metrics(ALPHA)
    assert board.metadata(ALPHA) == store.metadata(ALPHA)
    ended = [open_reader(board).status(r) for r in (ALPHA, FAILED)]
    assert [e[0] for e in ended] == ["finished", "failed"]
    assert ended == [open_reader(url).status(r) for r in (ALPHA, FAILED)]  # and when


def test_export_tensorboard_again_replaces_the_runs_never_doubles_them(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tensorboard")
    tensorboard = pytest.importorskip("async_tracker.backend.tensorboard")
    write_runs(url)
    out = tmp_path / "tb"
    for _ in range(2):
        run_json(capsys, "--store", url, "export", "tensorboard", ALPHA, "--out", str(out))
    store = as_sync(open_store(url))
    board = tensorboard.TensorBoardTracker(out)
    assert board.metrics(ALPHA) == store.metrics(ALPHA)  # each point once
    assert open_reader(board).status(ALPHA) == open_reader(url).status(ALPHA)


def test_export_without_the_tensorboard_extra(tmp_path: Path) -> None:
    write_runs(str(tmp_path / "runs"))
    # A None entry makes `import tensorboard` raise ImportError, as when it is not installed.
    code = (
        "import sys; sys.modules['tensorboard'] = None\n"
        "from async_tracker.cli.main import main\n"
        f"sys.exit(main(['--store', {str(tmp_path / 'runs')!r}, 'export', 'tensorboard', "
        f"{ALPHA!r}, '--out', 'tb']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=60
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert "pip install 'async-tracker[tensorboard]'" in line


def test_an_unreachable_store_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("s3fs")  # the s3 extra
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = child_env(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_MAX_ATTEMPTS="1",
    )
    done = subprocess.run(
        [sys.executable, "-m", "async_tracker", "--store", "s3://nowhere/runs", "list", "jobs"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("async-tracker: cannot read the store s3://nowhere/runs: ")
    bad = cli("--store", "nosuch://x", "list", "jobs")
    assert bad.returncode == 2
    (line,) = bad.stderr.splitlines()
    assert "cannot open the store 'nosuch://x'" in line


def test_which_store_is_read(
    tmp_path: Path, isolated: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    def ids(*argv: str) -> list[str]:
        rows = run_json(capsys, *argv, "list", "jobs")
        assert isinstance(rows, list)
        return [row["run_id"] for row in rows]

    for name in ("default", "env", "flag", "configured"):
        with init("p", dir=str(tmp_path / name), id=f"p/{name}"):
            pass
    configured = Store(tmp_path / "configured", tmp_path / "configured.cfg")
    configured.config.write_text(f"protocol=file\nroot_path={configured.root}\n")
    monkeypatch.chdir(tmp_path / "default" / "..")
    (tmp_path / "default").rename(tmp_path / "tracker_runs")
    assert ids() == ["p/default"]  # ./tracker_runs
    monkeypatch.setenv("ASYNC_TRACKER_DIR", str(tmp_path / "env"))
    assert ids() == ["p/env"]
    write_torchxconfig(tmp_path, configured)
    assert ids() == ["p/configured"]  # the torchx way beats the default store
    assert ids("--store", str(tmp_path / "flag")) == ["p/flag"]  # --store beats it
    # --tracker/--config beat --store.
    flags = ["--tracker", "fsspec", "--config", str(configured.config)]
    assert ids(*flags, "--store", str(tmp_path / "flag")) == ["p/configured"]


def test_end_status_of_several_writers(tmp_path: Path) -> None:
    """Ranks of one job end one run: a failed rank fails it, whatever order they end in.
    (Ranks start together: a process that resumes the run after its ranks ended is its next
    life, see tests/cli/test_end_status.py.)"""
    store = str(tmp_path / "runs")
    tracker = as_sync(open_store(store))
    for n, reasons, expected in (
        (1, ["finished"], "finished"), (2, ["finished", "failed"], "failed"),
        (3, ["failed", "finished", "finished"], "failed"),
        (3, ["finished", "killed", "finished"], "killed"),
        (3, ["killed", "failed", "finished"], "failed"),
    ):  # fmt: skip
        run_id = f"job/ranks-{n}-{'-'.join(reasons)}"
        ranks = [init("job", dir=store, id=run_id, resume="allow") for _ in reasons]
        for rank, reason in zip(ranks, reasons):
            rank.log_metric("loss", 1.0)
            rank.close(reason=reason)  # type: ignore[arg-type]
        ended = open_reader(tracker).status(run_id)
        assert ended is not None and ended[0] == expected and ended[1] is not None, reasons


def test_exit_summary_names_the_store() -> None:
    report = FlushReport(delivered=3, spooled=5, spool_paths={"fsspec": "/spool/RUN/fsspec"})
    lines = report.summary("r", {"fsspec": "s3://bucket/runs"}).splitlines()
    assert lines[-1].strip() == "deliver them: async-tracker sync /spool --to s3://bucket/runs"
    assert len(lines) <= 5
    # A backend that is not a store: the torchx configuration is needed.
    assert "same TORCHX_TRACKERS" in report.summary("r", {}).splitlines()[-1]


def test_sync_to_a_store_stores_each_record_once(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spool = tmp_path / "spool"
    # The records were spooled for a backend named "fsspec" that hung: no tracker of that
    # name is configured here, --to says where they go.
    subprocess.run(
        [sys.executable, "-c", SPOOLING_JOB, str(spool)], check=True, env=child_env(), timeout=60
    )
    assert main(["--json", "sync", str(spool), "--to", url, "--timeout", "30"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["ok"] is True
    assert data["runs"] == [
        {"run_id": "local://tests/spooled", "backend": "fsspec", "delivered": 21, "ok": True}
    ]
    assert "1/1" in captured.err  # the progress bar
    store = as_sync(open_store(url))
    assert store.metadata("local://tests/spooled") == {"a": 1}
    steps = [p.step for p in store.metrics("local://tests/spooled")["loss"]]  # type: ignore[attr-defined]
    assert steps == list(range(20))
    # Idempotent: the second sync finds the spool acknowledged and stores nothing twice.
    assert main(["sync", str(spool), "--to", url]) == 0
    assert "nothing to replay" in capsys.readouterr().out
    steps = [p.step for p in store.metrics("local://tests/spooled")["loss"]]  # type: ignore[attr-defined]
    assert steps == list(range(20))


def test_sync_to_a_factory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spool = tmp_path / "spool"
    subprocess.run(
        [sys.executable, "-c", SPOOLING_JOB, str(spool)], check=True, env=child_env(), timeout=60
    )
    assert main(["sync", str(spool), "--to", "no_such_module:factory"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "no_such_module:factory" in line


READ_COMMANDS = [
    ["list", "jobs"],
    ["list", "metadata", ALPHA],
    ["list", "artifacts", ALPHA],
    ["list", "metrics", ALPHA],
    ["compare", ALPHA],
    ["lineage", ALPHA],
    ["export", "csv", ALPHA, "--out", "-"],
]


@pytest.mark.parametrize("argv", READ_COMMANDS, ids=[" ".join(a[:2]) for a in READ_COMMANDS])
def test_a_store_that_is_not_there_is_one_line_and_exit_1(
    tmp_path: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    missing = str(tmp_path / "nonexistent")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for store, why in ((missing, "no such directory"), (str(a_file), "not a directory")):
        assert main(["--store", store, *argv]) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        (line,) = captured.err.splitlines()
        assert line == f"async-tracker: cannot read the store {store}: {why}"
    # $ASYNC_TRACKER_DIR names a store as --store does: a typo there is no empty store.
    monkeypatch.setenv("ASYNC_TRACKER_DIR", missing)
    assert main(argv) == 1
    assert "no such directory" in capsys.readouterr().err
