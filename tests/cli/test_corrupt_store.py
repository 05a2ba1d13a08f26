"""``async-tracker`` (a child process, as a user runs it) on a store with corrupt and foreign
files: the good records print, one warning names the file skipped, no traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from async_tracker.backend.fsspec import encode_run_id
from tests.cli.conftest import cli
from tests.fsspec.test_corrupt_store import (
    DEEP,
    PARENT,
    RUN,
    nested,
    put,
    replace_by_file,
    run_dir,
    write_good,
)

CASES: dict[str, tuple[list[str], Callable[[Path], Path], list[str]]] = {
    "deep-json": (
        ["list", "metadata", RUN],
        lambda r: put(
            run_dir(r) / "metadata" / "1-deep", f'{{"metadata": {{"x": {nested(DEEP)}}}}}'
        ),
        ["a", "1"],
    ),
    "infinite-and-nan-steps": (
        ["list", "metrics", RUN],
        lambda r: put(
            run_dir(r) / "metrics" / "1-inf.jsonl",
            '{"name": "loss", "step": [Infinity], "value": [1.0], "time": [3.0]}\n'
            '{"name": "loss", "step": [NaN], "value": [1.0], "time": [3.0]}\n',
        ),
        ["loss", "0.5"],
    ),
    "truncated-line": (
        ["--json", "list", "metrics", RUN],
        lambda r: put(run_dir(r) / "metrics" / "1-cut.jsonl", '{"name": "loss", "step": [3, 4'),
        ['"count": 2'],
    ),
    "wrong-types": (
        ["list", "artifacts", RUN],
        lambda r: put(run_dir(r) / "artifacts" / "ODSXE===", '{"name": ["x"], "path": 5}'),
        ["model", "/m"],
    ),
    "file-for-a-directory": (
        ["lineage", RUN],
        lambda r: replace_by_file(run_dir(r) / "parents"),
        [PARENT, "[ckpt]"],
    ),
    "file-for-a-run-directory": (
        ["list", "jobs"],
        lambda r: put(r / encode_run_id("local://corrupt/ghost"), "not a run"),
        [RUN, PARENT],
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_the_cli_prints_the_good_records_and_one_warning(
    tmp_path: Path, case: tuple[list[str], Callable[[Path], Path], list[str]]
) -> None:
    args, plant, shown = case
    root = tmp_path / "store"
    write_good(root)
    bad = plant(root)
    config = tmp_path / "fsspec.cfg"
    config.write_text(f"protocol=file\nroot_path={root}\n")
    done = cli("--tracker", "fsspec", "--config", str(config), *args)
    assert done.returncode == 0, done.stderr
    for text in shown:
        assert text in done.stdout
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert str(bad) in line


def test_a_value_nested_as_deep_as_a_read_takes_prints_as_json(tmp_path: Path) -> None:
    # 850 levels parse; printing them must not recurse in Python (the JSON is made by C).
    root = tmp_path / "store"
    write_good(root)
    put(run_dir(root) / "metadata" / "1-deep", f'{{"metadata": {{"x": {nested(850)}}}}}')
    config = tmp_path / "fsspec.cfg"
    config.write_text(f"protocol=file\nroot_path={root}\n")
    done = cli("--json", "--tracker", "fsspec", "--config", str(config), "list", "metadata", RUN)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr == ""
    value = json.loads(done.stdout)["x"]
    for _ in range(849):
        (value,) = value
    assert value == []
