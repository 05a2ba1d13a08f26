"""``async_tracker.init()``: a run in a local store in one call (issue 16), and the warning
of ``run_from_env()`` without a job id."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import async_tracker
from async_tracker import AppRun, TrackerConfigError
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.init_run import open_store
from tests.core.helpers import REPO, python_env


def test_a_run_in_the_default_store_with_a_readable_unique_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ASYNC_TRACKER_DIR", raising=False)
    with async_tracker.init("mnist", config={"lr": 0.1, "layers": [64, 64]}) as run:
        for step in range(3):
            run.log_metric("loss", 1.0 / (step + 1))
    assert re.fullmatch(r"mnist/[a-z]+-[a-z]+-[0-9a-f]{6}", run.id), run.id
    other = async_tracker.init("mnist", name="baseline")
    assert re.fullmatch(r"mnist/baseline-[0-9a-f]{6}", other.id) and other.id != run.id
    other.close()
    # What a reader of ./tracker_runs finds: the run, its config, its points.
    reader = AppRun(run.id, [open_store(tmp_path / "tracker_runs")])
    assert reader.metadata() == {"project": "mnist", "lr": 0.1, "layers": [64, 64]}
    assert [p.step for p in reader.metrics()["loss"]] == [0, 1, 2]
    assert (tmp_path / "tracker_runs").is_dir()


def test_the_store_comes_from_the_environment_or_any_fsspec_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASYNC_TRACKER_DIR", str(tmp_path / "env-store"))
    with async_tracker.init("p") as run:
        run.log_metric("m", 1.0)
    assert [p.value for p in AppRun(run.id, [open_store()]).metrics()["m"]] == [1.0]
    assert (tmp_path / "env-store").is_dir()
    url = f"memory://init-{uuid.uuid4().hex}"
    with async_tracker.init("p", dir=url) as run:
        run.log_metric("m", 2.0)
    assert [p.value for p in AppRun(run.id, [open_store(url)]).metrics()["m"]] == [2.0]


def test_an_existing_id_is_resumed_after_its_last_steps(tmp_path: Path) -> None:
    store = str(tmp_path / "runs")
    with async_tracker.init("p", dir=store, id="p/long-job") as run:
        for _ in range(5):
            run.log_metric("loss", 1.0)
        run.log_metric("acc", 0.5, step=100)
    with async_tracker.init("p", dir=store, id="p/long-job") as resumed:
        resumed.log_metric("loss", 0.5)  # no step: continues after 4
        resumed.log_metric("acc", 0.6)  # continues after 100
    metrics = AppRun("p/long-job", [open_store(store)]).metrics()
    assert [p.step for p in metrics["loss"]] == [0, 1, 2, 3, 4, 5]
    assert [p.step for p in metrics["acc"]] == [100, 101]


def test_resume_never_refuses_an_existing_run_and_must_a_new_one(tmp_path: Path) -> None:
    store = str(tmp_path / "runs")
    with async_tracker.init("p", dir=store, id="p/once") as run:
        run.log_metric("loss", 1.0)
    with pytest.raises(TrackerConfigError, match="already exists"):
        async_tracker.init("p", dir=store, id="p/once", resume="never")
    with pytest.raises(TrackerConfigError, match="not in the store"):
        async_tracker.init("p", dir=store, id="p/never-made", resume="must")
    # Nothing was written by the refused calls.
    assert [p.step for p in AppRun("p/once", [open_store(store)]).metrics()["loss"]] == [0]


@dataclasses.dataclass
class Config:
    lr: float = 0.01
    depth: int = 3


@pytest.mark.parametrize(
    "config", [Config(), argparse.Namespace(lr=0.01, depth=3), {"lr": 0.01, "depth": 3}]
)
def test_config_is_the_runs_metadata_whatever_holds_it(tmp_path: Path, config: object) -> None:
    with async_tracker.init("p", dir=str(tmp_path), config=config) as run:
        pass
    assert AppRun(run.id, [open_store(tmp_path)]).metadata() == {
        "project": "p", "lr": 0.01, "depth": 3,
    }


def test_bad_arguments_fail_at_once_naming_them(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="project"):
        async_tracker.init(3, dir=str(tmp_path))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="resume"):
        async_tracker.init("p", dir=str(tmp_path), resume="sometimes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config"):
        async_tracker.init("p", dir=str(tmp_path), config=42)


def test_more_backends_beside_the_store(tmp_path: Path) -> None:
    extra = InMemoryTracker(name="extra")
    with async_tracker.init("p", dir=str(tmp_path), backends=[extra]) as run:
        run.log_metric("m", 1.0)
    assert [p.value for p in extra.points(run.id, "m")] == [1.0]


def test_run_from_env_without_a_job_id_says_once_that_nothing_is_recorded(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("TORCHX_JOB_ID", raising=False)
    monkeypatch.setattr("async_tracker.run._env_run", None)
    run = AppRun.run_from_env()
    with caplog.at_level(logging.WARNING, logger="async_tracker.run"):
        run.log_metrics({})  # a first write of no points says it too
        run.log_metric("loss", 1.0)
        run.log_metrics({"a": 1.0})
        run.add_metadata(lr=0.1)
    warned = [r for r in caplog.records if "not recorded" in r.getMessage()]
    assert len(warned) == 1 and "TORCHX_JOB_ID" in warned[0].getMessage()
    assert "async_tracker.init" in warned[0].getMessage()


def test_run_from_env_of_a_job_without_trackers_says_once_that_nothing_is_recorded(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # What torchx's runner sets for a job when no tracker is configured: the job id alone.
    monkeypatch.setenv("TORCHX_JOB_ID", "local_cwd://torchx/train-1")
    run = AppRun.run_from_env()
    with caplog.at_level(logging.WARNING, logger="async_tracker.run"):
        run.log_metric("loss", 1.0, step=0)
        run.log_metrics({"a": 1.0}, step=1)
        run.add_metadata(lr=0.1)
    report = run.flush()
    assert report.ok and report.delivered == 0 and report.pending == 0
    warned = [r.getMessage() for r in caplog.records if "not recorded" in r.getMessage()]
    assert len(warned) == 1
    assert "local_cwd://torchx/train-1" in warned[0] and "TORCHX_TRACKERS" in warned[0]


def test_plot_returns_a_figure_of_the_runs_curves_after_close(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    with async_tracker.init("p", dir=str(tmp_path)) as run:
        for step in range(5):
            run.log_metrics({"loss": 1.0 / (step + 1), "acc": step / 5}, step=step)
    fig = run.plot()  # closed: read back from the store
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert titles == ["loss", "acc"]
    (line,) = fig.axes[0].get_lines()
    assert list(line.get_xdata()) == [0, 1, 2, 3, 4]
    assert [ax.get_title(loc="left") for ax in run.plot(["acc"]).axes] == ["acc"]
    with pytest.raises(ValueError, match="no metric 'nope'"):
        run.plot(["nope"])


def test_environment_options_apply_and_keywords_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASYNC_TRACKER_CLOSE_TIMEOUT", "7")
    monkeypatch.setenv("ASYNC_TRACKER_BATCH_SIZE", "123")
    run = async_tracker.init("p", dir=str(tmp_path), batch_size=456)
    assert (run.options.close_timeout, run.options.batch_size) == (7.0, 456)
    run.close()


def test_the_start_says_on_stderr_which_run_where_and_how_to_see_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ASYNC_TRACKER_DIR", raising=False)
    monkeypatch.delenv("ASYNC_TRACKER_SILENT", raising=False)
    with async_tracker.init("mnist", name="lr-0.1") as run:
        pass
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    assert run.id in line and str(tmp_path / "tracker_runs") in line
    assert "async-tracker list jobs" in line and "async-tracker ui" in line
    assert "--store" not in line  # the CLI reads this store by itself
    # Another store: the commands name it.
    with async_tracker.init("mnist", dir=tmp_path / "elsewhere") as run:
        pass
    (line,) = capsys.readouterr().err.splitlines()
    assert f"async-tracker --store {tmp_path / 'elsewhere'} list jobs" in line
    # Quiet when asked, by the argument or the environment.
    async_tracker.init("mnist", quiet=True).close()
    monkeypatch.setenv("ASYNC_TRACKER_SILENT", "1")
    async_tracker.init("mnist").close()
    assert capsys.readouterr() == ("", "")


def test_init_honours_the_torchx_environment_and_arguments_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What torchx's runner (or `async-tracker run`) sets for a job.
    job_store = tmp_path / "job-store"
    config = tmp_path / "fsspec.cfg"
    config.write_text(f"protocol=file\nroot_path={job_store}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHX_JOB_ID", "local://session/job-1")
    monkeypatch.setenv("TORCHX_TRACKERS", "fsspec")
    monkeypatch.setenv("TORCHX_TRACKER_FSSPEC_CONFIG", str(config))
    monkeypatch.setenv("TORCHX_PARENT_RUN_ID", "local://session/sweep")
    with async_tracker.init("p", config={"lr": 0.1}, quiet=True) as run:
        run.log_metric("loss", 0.5)
    assert run.id == "local://session/job-1"
    reader = AppRun(run.id, [open_store(job_store)])
    assert reader.metadata() == {"project": "p", "lr": 0.1}
    assert [s.parent.id for s in reader.sources()] == ["local://session/sweep"]
    assert not (tmp_path / "tracker_runs").exists()
    # A second start of the job resumes its run (torchx restarts a job under its id).
    with async_tracker.init("p", quiet=True) as again:
        again.log_metric("loss", 0.25)
    assert [p.step for p in reader.metrics()["loss"]] == [0, 1]
    # Explicit arguments win: id= and dir=.
    with async_tracker.init("p", id="p/mine", dir=tmp_path / "mine", quiet=True) as mine:
        mine.log_metric("loss", 1.0)
    assert mine.id == "p/mine"
    assert list(AppRun(mine.id, [open_store(tmp_path / "mine")]).metrics()) == ["loss"]
    assert AppRun(mine.id, [open_store(job_store)]).metrics() == {}


# Runs two cells in a real headless kernel (nbclient, ipykernel), from a child interpreter:
# a run logged and closed, then `run.plot()` as the cell's value, in a fresh kernel where
# nothing imported pyplot. Prints the MIME types the second cell's output has.
PLOT_NOTEBOOK = """
import json, sys
import nbformat
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

repo, store = sys.argv[1], sys.argv[2]
cells = [
    f'''import sys
sys.path.insert(0, {repo!r})
import async_tracker
with async_tracker.init("nb", dir={store!r}, quiet=True) as run:
    for step in range(5):
        run.log_metrics({{"loss": 1.0 / (step + 1)}}, step=step)''',
    "run.plot()",
]
nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
# IPC sockets, not TCP ports that another process of a busy machine can take between the
# kernel manager's choice and the kernel's bind.
km = KernelManager(kernel_name="python3", transport="ipc")
NotebookClient(nb, timeout=120, km=km).execute()
outputs = nb.cells[1].outputs
print(json.dumps([o.get("output_type") for o in outputs]))
print(json.dumps(sorted(outputs[0].get("data", {})) if outputs else []))
print(json.dumps(outputs[0]["data"].get("image/png", "")[:8] if outputs else ""))
"""


def test_plot_shows_an_image_in_a_fresh_jupyter_kernel(tmp_path: Path) -> None:
    for module in ("matplotlib", "nbclient", "ipykernel"):
        pytest.importorskip(module)
    done = subprocess.run(
        [sys.executable, "-c", PLOT_NOTEBOOK, str(REPO), str(tmp_path / "store")],
        capture_output=True, text=True, env=python_env(), timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    kinds, mimes, png = (json.loads(line) for line in done.stdout.splitlines()[-3:])
    assert kinds == ["execute_result"]
    assert "image/png" in mimes
    assert png.startswith("iVBORw0K")  # base64 of the PNG signature


def test_init_writes_where_the_cli_reads_when_torchxconfig_names_a_tracker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A .torchxconfig in the working directory: `async-tracker list jobs` reads its tracker,
    # so init() records there too (the two never disagree about where runs are).
    from async_tracker.cli.main import main

    store = tmp_path / "configured"
    (tmp_path / "fsspec.cfg").write_text(f"protocol=file\nroot_path={store}\n")
    (tmp_path / ".torchxconfig").write_text(
        f"[torchx:tracker]\nfsspec =\n\n[tracker:fsspec]\nconfig = {tmp_path / 'fsspec.cfg'}\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with async_tracker.init("p", quiet=True) as run:
        run.log_metric("loss", 0.5)
    assert not (tmp_path / "tracker_runs").exists()
    assert main(["--json", "list", "jobs"]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == [run.id]
