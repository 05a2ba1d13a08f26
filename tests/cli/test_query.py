"""``list`` and ``lineage`` against a prepared store, configured through ``.torchxconfig``,
the ``TORCHX_*`` variables and flags; tables for people, ``--json`` for scripts."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import async_tracker
import async_tracker.run
from async_tracker.cli.main import main
from tests.cli.conftest import (
    CHILD_A,
    CHILD_B,
    EMPTY,
    GRANDCHILD,
    PARENT,
    Store,
    cli,
    write_torchxconfig,
)
from tests.conftest import needs_matplotlib

ALL_RUNS = {PARENT, CHILD_A, CHILD_B, GRANDCHILD, EMPTY}


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert main(["--json", *argv]) == 0
    data = json.loads(capsys.readouterr().out)
    if argv[-2:] == ("list", "jobs") or "jobs" in argv[:2]:
        return [row["run_id"] for row in data]  # the ids, what these tests are about
    return data


# -- list jobs, metadata, artifacts, metrics -------------------------------------------------


def test_list_jobs_table(configured: Store, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "jobs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "RUN", "ID", "STARTED", "DURATION", "STATUS", "PARAMS", "LAST", "METRICS",
    ]  # fmt: skip
    assert set(lines[1]) == {"-", " "}
    assert {line.split()[0] for line in lines[2:]} == ALL_RUNS
    (parent,) = [line for line in lines if line.startswith(PARENT + " ")]
    assert "finished" in parent
    assert "model=mlp lr=0.05 layers=[64, 64]" in parent
    assert "loss=0.1 accuracy=0.9 grad_norm=2" in parent


def test_list_jobs_json_has_every_column(
    configured: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--json", "list", "jobs"]) == 0
    rows = {row["run_id"]: row for row in json.loads(capsys.readouterr().out)}
    parent = rows[PARENT]
    assert parent["status"] == "finished"
    assert parent["params"] == {"model": "mlp", "lr": 0.05, "layers": [64, 64]}
    assert parent["metrics"] == {"loss": 0.1, "accuracy": 0.9, "grad_norm": 2.0}
    assert parent["start"] <= parent["end"]
    assert parent["duration_s"] == parent["end"] - parent["start"]
    # No metric: it started at its first write (its metadata), and it ended.
    assert rows[EMPTY]["start"] <= rows[EMPTY]["end"] and rows[EMPTY]["duration_s"] >= 0
    assert rows[EMPTY]["status"] == "finished"


def test_list_jobs_by_parent(configured: Store, capsys: pytest.CaptureFixture[str]) -> None:
    assert sorted(run_json(capsys, "list", "jobs", "--parent-run-id", PARENT)) == [
        CHILD_A,
        CHILD_B,
    ]
    assert run_json(capsys, "list", "jobs", "--parent-run-id", CHILD_A) == [GRANDCHILD]


def test_json_flag_after_the_subcommand(
    configured: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["list", "jobs", "--json"]) == 0
    assert {row["run_id"] for row in json.loads(capsys.readouterr().out)} == ALL_RUNS


def test_list_metadata(configured: Store, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "metadata", PARENT]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["ID", "VALUE"]
    assert [line.split(None, 1) for line in out[2:]] == [
        ["model", "mlp"],
        ["lr", "0.05"],
        ["layers", "[64, 64]"],
    ]
    assert run_json(capsys, "list", "metadata", PARENT) == {
        "model": "mlp",
        "lr": 0.05,
        "layers": [64, 64],
    }


def test_list_artifacts(configured: Store, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "artifacts", PARENT]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["ARTIFACT", "PATH", "METADATA"]
    assert any(line.split()[:2] == ["checkpoint", "/ckpt/step-9.pt"] for line in out)
    data = run_json(capsys, "list", "artifacts", "--artifact", "checkpoint", PARENT)
    assert data == [{"name": "checkpoint", "path": "/ckpt/step-9.pt", "metadata": {"step": 9}}]


def test_list_metrics(configured: Store, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "metrics", PARENT]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["METRIC", "LAST", "MIN", "MAX", "COUNT", "LAST", "STEP"]
    assert out[2].split() == ["loss", "0.1", "0.1", "1", "10", "9"]
    data = run_json(capsys, "list", "metrics", PARENT)
    assert data["accuracy"] == {"last": 0.9, "min": 0.0, "max": 0.9, "count": 10, "last_step": 9}
    # NaN and infinities are stored faithfully; JSON has no token for them, so they are null.
    assert data["grad_norm"] == {"last": 2.0, "min": 2.0, "max": None, "count": 3, "last_step": 2}


def test_list_metrics_of_a_run_without_metrics(
    configured: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_json(capsys, "list", "metrics", EMPTY) == {}


# -- lineage ---------------------------------------------------------------------------------


def test_lineage_tree(configured: Store, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lineage", PARENT]) == 0
    assert capsys.readouterr().out.splitlines() == [
        PARENT,
        "├── parents",
        "└── descendants",
        f"    ├── {CHILD_A}",
        f"    │   └── {GRANDCHILD}",
        f"    └── {CHILD_B}  [checkpoint]",
    ]
    assert main(["lineage", GRANDCHILD]) == 0
    assert capsys.readouterr().out.splitlines() == [
        GRANDCHILD,
        "├── parents",
        f"│   └── {CHILD_A}",
        f"│       └── {PARENT}",
        "└── descendants",
    ]


def test_lineage_json_and_depth(configured: Store, capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "lineage", PARENT)
    assert data == {
        "run_id": PARENT,
        "parents": [],
        "descendants": [
            {
                "run_id": CHILD_A,
                "artifact": None,
                "descendants": [{"run_id": GRANDCHILD, "artifact": None, "descendants": []}],
            },
            {"run_id": CHILD_B, "artifact": "checkpoint", "descendants": []},
        ],
    }
    shallow = run_json(capsys, "lineage", "--depth", "1", PARENT)
    assert shallow["descendants"] == [
        {"run_id": CHILD_A, "artifact": None},
        {"run_id": CHILD_B, "artifact": "checkpoint"},
    ]


def test_lineage_of_a_data_set_that_is_not_a_run(
    writable_store: Store, isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_torchxconfig(isolated, writable_store)
    tracker = writable_store.tracker()
    tracker.add_metadata(CHILD_A, lr=0.1)
    tracker.add_source(CHILD_A, "s3://data/imagenet", "train")
    # The data set holds only its descendants: no job, yet its lineage shows.
    assert run_json(capsys, "list", "jobs") == [CHILD_A]
    assert run_json(capsys, "lineage", "--depth", "1", "s3://data/imagenet")["descendants"] == [
        {"run_id": CHILD_A, "artifact": "train"}
    ]


# -- which tracker ---------------------------------------------------------------------------


def test_flags_without_any_config(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--tracker", "fsspec", "--config", str(store.config)]
    assert set(run_json(capsys, *flags, "list", "jobs")) == ALL_RUNS
    # ... and after the subcommand.
    assert main(["list", "metadata", PARENT, *flags, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "mlp"


def test_flags_override_the_torchxconfig(
    store: Store, writable_store: Store, isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_torchxconfig(isolated, writable_store)  # an empty store
    assert run_json(capsys, "list", "jobs") == []
    assert (
        set(run_json(capsys, "--config", str(store.config), "--tracker", "fsspec", "list", "jobs"))
        == ALL_RUNS
    )


def test_environment_variables(
    store: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TORCHX_TRACKERS", "fsspec")
    monkeypatch.setenv("TORCHX_TRACKER_FSSPEC_CONFIG", str(store.config))
    assert set(run_json(capsys, "list", "jobs")) == ALL_RUNS


def test_environment_config_overrides_the_file(
    store: Store,
    writable_store: Store,
    isolated: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    write_torchxconfig(isolated, writable_store)
    monkeypatch.setenv("TORCHX_TRACKER_FSSPEC_CONFIG", str(store.config))
    assert set(run_json(capsys, "list", "jobs")) == ALL_RUNS


def test_home_config_and_working_directory_wins(
    store: Store,
    writable_store: Store,
    isolated: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    write_torchxconfig(tmp_path / "home", store)
    assert set(run_json(capsys, "list", "jobs")) == ALL_RUNS
    write_torchxconfig(isolated, writable_store)
    assert run_json(capsys, "list", "jobs") == []


def test_torchxconfig_variable_names_the_file(
    store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("TORCHXCONFIG", str(write_torchxconfig(elsewhere, store)))
    assert set(run_json(capsys, "list", "jobs")) == ALL_RUNS


def test_factory_named_by_value(
    store: Store, isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_torchxconfig(isolated, store, name="mine", factory="tests.cli.factories:create")
    assert set(run_json(capsys, "list", "jobs")) == ALL_RUNS
    # --tracker with a configured name keeps that name's factory and config.
    assert set(run_json(capsys, "--tracker", "mine", "list", "jobs")) == ALL_RUNS


# -- errors: a message and exit code 2, never a traceback ------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["list", "metadata", "local://nope"],
        ["list", "artifacts", "local://nope"],
        ["list", "metrics", "local://nope"],
        ["lineage", "local://nope"],
    ],
)
def test_unknown_run_id(
    configured: Store, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "unknown run id 'local://nope'" in captured.err
    assert "Traceback" not in captured.err


@needs_matplotlib  # plot checks that matplotlib is there before it reads the store
def test_unknown_run_id_plot(configured: Store, capsys: pytest.CaptureFixture[str]) -> None:
    test_unknown_run_id(configured, ["plot", "local://nope", "-o", "out.png"], capsys)


def test_nothing_configured_reads_the_default_store(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # ./tracker_runs does not exist: no run, and run ids are unknown there.
    assert main(["--json", "list", "jobs"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["lineage", PARENT]) == 2
    assert "unknown run id" in capsys.readouterr().err


def test_unknown_factory(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--tracker", "no_such_tracker", "list", "jobs"]) == 2
    err = capsys.readouterr().err
    assert "no tracker factory named 'no_such_tracker'" in err
    assert "Traceback" not in err


def test_bad_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["--tracker", "fsspec", "--config", str(tmp_path / "missing.cfg"), "list", "jobs"])
        == 2
    )
    assert "cannot read tracker config" in capsys.readouterr().err


def test_config_without_tracker(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", "x.cfg", "list", "jobs"]) == 2
    assert "--config needs --tracker" in capsys.readouterr().err


def test_usage_error_returns_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "nonsense"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert main(["--help"]) == 0


# -- as a command ----------------------------------------------------------------------------


def test_as_a_child_process(configured: Store) -> None:
    ok = cli("--json", "list", "jobs")
    assert ok.returncode == 0, ok.stderr
    assert {row["run_id"] for row in json.loads(ok.stdout)} == ALL_RUNS
    bad = cli("list", "metadata", "local://nope")
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr.startswith("async-tracker: unknown run id")
    assert "Traceback" not in bad.stderr


def test_console_script(configured: Store) -> None:
    script = Path(sys.executable).parent / "async-tracker"
    if not script.exists():
        pytest.skip("the async-tracker script is not installed next to this interpreter")
    out = subprocess.run(
        [str(script), "list", "jobs"], capture_output=True, text=True, timeout=60, check=True
    )
    assert PARENT in out.stdout


def test_version_is_the_installed_one(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.metadata

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"async-tracker {importlib.metadata.version('async-tracker')}"
    )


def test_compare_and_plot_take_a_run_name_and_pick_its_newest_run(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The README's tour run twice: two runs named mnist/lr-0.1 (and two mnist/lr-0.01).
    clock = iter(float(t) for t in range(1_000, 2_000))
    monkeypatch.setattr(async_tracker.run, "_wall_clock", lambda: next(clock))
    ids: dict[str, list[str]] = {}
    for _ in range(2):
        for lr in (0.1, 0.01):
            with async_tracker.init("mnist", name=f"lr-{lr}", quiet=True) as run:
                run.log_metric("loss", lr, step=0)
            ids.setdefault(f"mnist/lr-{lr}", []).append(run.id)
    done = cli("--json", "compare", "mnist/lr-0.1", "mnist/lr-0.01")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["runs"] == [ids["mnist/lr-0.1"][1], ids["mnist/lr-0.01"][1]]
    lines = done.stderr.splitlines()
    assert len(lines) == 2
    assert "'mnist/lr-0.1'" in lines[0] and ids["mnist/lr-0.1"][1] in lines[0]
    # An id, and a unique prefix of one, still name that run (the older one here).
    older = ids["mnist/lr-0.1"][0]
    done = cli("--json", "compare", older, ids["mnist/lr-0.01"][0][:-2])
    assert json.loads(done.stdout)["runs"] == [older, ids["mnist/lr-0.01"][0]]
    assert done.stderr == ""
    if importlib.util.find_spec("matplotlib") is not None:
        done = cli("--json", "plot", "mnist/lr-0.1", "-o", "curves.png")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["runs"] == [ids["mnist/lr-0.1"][1]]
        assert ids["mnist/lr-0.1"][1] in done.stderr


def test_every_command_takes_a_run_name_by_one_rule_and_refuses_an_empty_id(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tag and the list commands name runs as compare and plot do: a name means its newest
    run (said on stderr); an empty or blank id (an unset $RUN) names none, even in a store
    of one run, where every id starts with it."""
    clock = iter(float(t) for t in range(1_000, 2_000))
    monkeypatch.setattr(async_tracker.run, "_wall_clock", lambda: next(clock))
    ids = []
    for _ in range(2):
        with async_tracker.init("mnist", name="lr-0.1", quiet=True) as run:
            run.log_metric("loss", 0.1, step=0)
        ids.append(run.id)
    newest = ids[1]
    for args in (("tag", "mnist/lr-0.1", "+best"), ("list", "metrics", "mnist/lr-0.1"),
                 ("list", "metadata", "mnist/lr-0.1"), ("lineage", "mnist/lr-0.1")):  # fmt: skip
        done = cli(*args)
        assert done.returncode == 0, (args, done.stderr)
        assert "using the newest" in done.stderr and newest in done.stderr, args
    tagged = json.loads(cli("--json", "list", "jobs", "--filter", "tag:best").stdout)
    assert [r["run_id"] for r in tagged] == [newest]

    for args in (("rm", "", "--yes"), ("rm", " ", "--yes"), ("tag", "", "+x"),
                 ("list", "metrics", "")):  # fmt: skip
        done = cli(*args)
        assert done.returncode == 2 and "must not be empty" in done.stderr, (args, done.stderr)
    listed = json.loads(cli("--json", "list", "jobs").stdout)
    assert sorted(r["run_id"] for r in listed) == sorted(ids)  # nothing deleted


def test_sort_takes_a_minus_key_as_typed_and_unknown_keys_are_named(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = iter(float(t) for t in range(1_000, 2_000))
    monkeypatch.setattr(async_tracker.run, "_wall_clock", lambda: next(clock))
    for lr in (0.1, 0.01, 0.001):
        with async_tracker.init("mnist", name=f"lr-{lr}", config={"lr": lr}, quiet=True) as run:
            run.log_metric("loss", lr, step=0)
    done = cli("--json", "list", "jobs", "--sort", "-lr")  # as typed, not --sort=-lr
    assert done.returncode == 0, done.stderr
    assert [r["params"]["lr"] for r in json.loads(done.stdout)] == [0.1, 0.01, 0.001]
    assert done.stderr == ""
    done = cli("--json", "list", "jobs", "--sort", "-loss.min")
    assert [r["params"]["lr"] for r in json.loads(done.stdout)] == [0.1, 0.01, 0.001]

    # A key no run has: the list as asked, and one line naming the nearest columns.
    done = cli("--json", "list", "jobs", "--sort", "-lrr")
    assert done.returncode == 0
    assert done.stderr.strip() == "async-tracker: no run has param 'lrr' (nearest: lr)"
    done = cli("list", "jobs", "--filter", "los.min<1")
    assert done.returncode == 0
    assert "no run has metric 'los' (nearest: loss.min)" in done.stderr
    # A key some run has is no mistake, even when the runs shown lack it.
    done = cli("list", "jobs", "--filter", "lr<0.05", "--limit", "1")
    assert done.returncode == 0 and done.stderr == ""


def test_compare_groups_runs_by_a_param(
    isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A sweep: two lrs, three seeds each, and a run without lr.
    for lr in (0.1, 0.01):
        for seed in range(3):
            with async_tracker.init("sweep", config={"lr": lr, "seed": seed}, quiet=True) as run:
                for step, value in enumerate((1.0, lr * (seed + 1), lr * 10 * (seed + 1))):
                    run.log_metric("loss", value, step=step)
    with async_tracker.init("other", config={"seed": 0}, quiet=True) as run:
        run.log_metric("loss", 0.5)
    data = run_json(capsys, "compare", "--group", "lr", "--filter", "params.lr>0")
    assert list(data["groups"]) == ["lr=0.01", "lr=0.1"]  # by value
    small, big = data["groups"]["lr=0.01"], data["groups"]["lr=0.1"]
    assert len(small["runs"]) == len(big["runs"]) == 3
    loss = big["metrics"]["loss"]
    assert loss["runs"] == 3
    assert loss["last_mean"] == pytest.approx(2.0)  # lasts 1, 2, 3
    assert (loss["last_min"], loss["last_max"]) == pytest.approx((1.0, 3.0))
    assert (loss["min"], loss["max"]) == pytest.approx((0.1, 3.0))
    # Every run: the one without lr is a group of its own, last.
    assert list(run_json(capsys, "compare", "--group", "lr")["groups"]) == [
        "lr=0.01", "lr=0.1", "lr unset"
    ]
    assert main(["compare", "--group", "lr"]) == 0
    text = capsys.readouterr().out
    assert "lr=0.01" in text and "last, mean" in text
    # Clear errors: a param no run has, --filter without --group, nothing named.
    assert main(["compare", "--group", "momentum"]) == 2
    assert "no run has the param 'momentum'" in capsys.readouterr().err
    assert main(["compare", "--filter", "lr>0"]) == 2
    assert "--filter chooses the runs of --group" in capsys.readouterr().err
    assert main(["compare"]) == 2
    assert "give the runs to compare" in capsys.readouterr().err
