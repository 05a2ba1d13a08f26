"""Corrupt and foreign files in a store: every read skips what it cannot parse, with one
warning naming the file, and still returns the good records around it."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import fsspec
import pytest

from async_tracker.backend.fsspec import FsspecTracker, encode_run_id
from async_tracker.base import Lineage
from async_tracker.store.open import open_reader

RUN = "local://corrupt/run"
PARENT = "local://corrupt/parent"
DEEP = 200_000  # far beyond any recursion limit


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def write_good(root: Path) -> FsspecTracker:
    """The records every case must still read: metadata, an artifact, an edge, a metric."""
    tracker = FsspecTracker(fsspec.filesystem("file"), str(root))
    tracker.add_metadata(PARENT, role="parent")
    tracker.add_metadata(RUN, a=1)
    tracker.add_artifact(RUN, "model", "/m")
    tracker.add_source(RUN, PARENT, "ckpt")
    put(
        root / encode_run_id(RUN) / "metrics" / "0-good.jsonl",
        '{"name": "loss", "step": [0, 1], "value": [1.0, 0.5], "time": [1.0, 2.0]}\n',
    )
    return tracker


def losses(tracker: FsspecTracker) -> dict[str, list[tuple[int, float]]]:
    return {n: [(p.step, p.value) for p in pts] for n, pts in tracker.metrics(RUN).items()}


GOOD_LOSS = {"loss": [(0, 1.0), (1, 0.5)]}


@dataclass(frozen=True)
class Case:
    """``plant`` damages the store and returns the path the warning must name; ``check``
    reads and asserts the good records are there."""

    plant: Callable[[Path], Path]
    check: Callable[[FsspecTracker], None]


def replace_run_by_file(root: Path) -> Path:
    shutil.rmtree(run_dir(root))
    return put(run_dir(root), "not a directory")


def expect(got: object, want: object) -> None:
    assert got == want


def run_dir(root: Path, run_id: str = RUN) -> Path:
    return root / encode_run_id(run_id)


def put(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def make_dir(path: Path) -> Path:
    path.mkdir()
    return path


def replace_by_file(path: Path) -> Path:
    for child in path.iterdir():
        child.unlink()
    path.rmdir()
    path.write_text("not a directory")
    return path


def check_metadata(t: FsspecTracker) -> None:
    assert t.metadata(RUN) == {"a": 1}


def check_artifacts(t: FsspecTracker) -> None:
    assert {a.name: a.path for a in t.artifacts(RUN).values()} == {"model": "/m"}


def check_metrics(t: FsspecTracker) -> None:
    assert losses(t) == GOOD_LOSS


def check_sources(t: FsspecTracker) -> None:
    assert [(s.source_run_id, s.artifact_name) for s in t.sources(RUN)] == [(PARENT, "ckpt")]


def check_descendants(t: FsspecTracker) -> None:
    assert [(d.source_run_id, d.artifact_name) for d in t.lineage(PARENT).descendants] == [
        (RUN, "ckpt")
    ]


def check_run_ids(t: FsspecTracker) -> None:
    assert sorted(t.run_ids()) == sorted([RUN, PARENT])


def check_truncated(t: FsspecTracker) -> None:
    assert losses(t) == {"loss": [(0, 1.0), (1, 0.5), (2, 0.25)]}


def check_no_metrics(t: FsspecTracker) -> None:
    assert losses(t) == {}
    check_metadata(t)


def check_no_descendants(t: FsspecTracker) -> None:
    lineage = t.lineage(PARENT)
    assert list(lineage.descendants) == [] and list(lineage.parents) == []


CASES = {
    # JSON nested 200k deep: json.loads raises RecursionError.
    "deep-metadata": Case(
        lambda r: put(
            run_dir(r) / "metadata" / "1-deep", f'{{"metadata": {{"x": {nested(DEEP)}}}}}'
        ),
        check_metadata,
    ),
    "deep-artifact": Case(
        lambda r: put(run_dir(r) / "artifacts" / "DEEP", nested(DEEP)), check_artifacts
    ),
    "deep-metric-line": Case(
        lambda r: put(run_dir(r) / "metrics" / "1-deep.jsonl", nested(DEEP) + "\n"),
        check_metrics,
    ),
    # Steps that are not integers: infinities (int() raises OverflowError), NaN, 1e999.
    "infinite-step": Case(
        lambda r: put(
            run_dir(r) / "metrics" / "1-inf.jsonl",
            '{"name": "loss", "step": [Infinity], "value": [1.0], "time": [3.0]}\n'
            '{"name": "loss", "step": [-Infinity], "value": [1.0], "time": [3.0]}\n'
            '{"name": "loss", "step": [1e999], "value": [1.0], "time": [3.0]}\n'
            '{"name": "loss", "step": [NaN], "value": [1.0], "time": [3.0]}\n',
        ),
        check_metrics,
    ),
    # Wrong types, each on a line of its own.
    "wrong-types-metrics": Case(
        lambda r: put(
            run_dir(r) / "metrics" / "1-types.jsonl",
            '{"name": "loss", "step": ["3"], "value": [1.0], "time": [3.0]}\n'
            '{"name": "loss", "step": [3], "value": ["x"], "time": [3.0]}\n'
            '{"name": 5, "step": [3], "value": [1.0], "time": [3.0]}\n'
            '{"name": "loss", "step": [true], "value": [1.0], "time": [3.0]}\n'
            '{"name": "loss", "step": 3, "value": 1.0, "time": 3.0}\n'
            # An integer value beyond float's range: float() raises OverflowError.
            f'{{"name": "loss", "step": [3], "value": [1{"0" * 400}], "time": [3.0]}}\n'
            "[1, 2, 3]\n",
        ),
        check_metrics,
    ),
    "wrong-types-metadata": Case(
        lambda r: put(run_dir(r) / "metadata" / "1-list", '{"metadata": [1, 2]}'),
        check_metadata,
    ),
    "not-an-object-metadata": Case(
        lambda r: put(run_dir(r) / "metadata" / "1-null", "null"), check_metadata
    ),
    "wrong-types-artifact": Case(
        lambda r: put(run_dir(r) / "artifacts" / "ODSXE===", '{"name": 5, "path": "/x"}'),
        check_artifacts,
    ),
    # A line cut short (a foreign writer that crashed): the file's other lines are kept.
    "truncated-line": Case(
        lambda r: put(
            run_dir(r) / "metrics" / "1-cut.jsonl",
            '{"name": "loss", "step": [2], "value": [0.25], "time": [3.0]}\n'
            '{"name": "loss", "step": [3, 4',
        ),
        check_truncated,
    ),
    "truncated-metadata": Case(
        lambda r: put(run_dir(r) / "metadata" / "1-cut", '{"metadata": {"a": 2, "b"'),
        check_metadata,
    ),
    # A file where a directory should be, and the other way round.
    "file-for-metrics-dir": Case(
        lambda r: replace_by_file(run_dir(r) / "metrics"), check_no_metrics
    ),
    "file-for-parents-dir": Case(lambda r: replace_by_file(run_dir(r) / "parents"), check_sources),
    "file-for-descendants-dir": Case(
        lambda r: replace_by_file(run_dir(r, PARENT) / "descendants"), check_no_descendants
    ),
    "file-for-run-dir": Case(
        lambda r: put(r / encode_run_id("local://corrupt/ghost"), "x"), check_run_ids
    ),
    # The run's own directory replaced by a file: each read returns nothing, naming it.
    "file-for-run-dir-metadata": Case(
        lambda r: replace_run_by_file(r), lambda t: expect(t.metadata(RUN), {})
    ),
    "file-for-run-dir-artifacts": Case(
        lambda r: replace_run_by_file(r), lambda t: expect(t.artifacts(RUN), {})
    ),
    "file-for-run-dir-metrics": Case(
        lambda r: replace_run_by_file(r), lambda t: expect(t.metrics(RUN), {})
    ),
    "file-for-run-dir-lineage": Case(
        lambda r: replace_run_by_file(r),
        lambda t: expect(t.lineage(RUN), Lineage(RUN, parents=[], descendants=[])),
    ),
    "file-for-run-dir-sources": Case(
        lambda r: replace_run_by_file(r), lambda t: expect(list(t.sources(RUN)), [])
    ),
    "directory-for-metadata-file": Case(
        lambda r: make_dir(run_dir(r) / "metadata" / "1-dir"), check_metadata
    ),
    # Lineage files: not UTF-8, or a name that encodes no run id.
    "binary-sources-file": Case(
        lambda r: put(run_dir(r) / "sources" / encode_run_id("other"), b"\xff\xfe\n"),
        check_sources,
    ),
    "foreign-descendants-name": Case(
        lambda r: put(run_dir(r, PARENT) / "descendants" / "notes.txt", "hello\n"),
        check_descendants,
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_a_read_skips_what_it_cannot_parse_with_one_warning_naming_it(
    tmp_path: Path, case: Case, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "store"
    tracker = write_good(root)
    bad = case.plant(root)
    with caplog.at_level(logging.WARNING, logger="async_tracker"):
        case.check(tracker)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert str(bad) in warnings[0].getMessage()


def test_the_store_root_is_a_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = put(tmp_path / "store", "not a directory")
    tracker = FsspecTracker(fsspec.filesystem("file"), str(root))
    with caplog.at_level(logging.WARNING, logger="async_tracker"):
        assert list(tracker.run_ids()) == []
    (warning,) = caplog.records
    assert str(root) in warning.getMessage()


def test_one_warning_for_many_bad_files_names_the_first_and_counts_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "store"
    tracker = write_good(root)
    for i in range(12):
        put(run_dir(root) / "metadata" / f"1-bad-{i:02d}", "{")
    with caplog.at_level(logging.WARNING, logger="async_tracker"):
        check_metadata(tracker)
    (warning,) = caplog.records
    message = warning.getMessage()
    assert str(run_dir(root) / "metadata" / "1-bad-00") in message
    assert "and 7 more" in message


def test_good_reads_warn_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tracker = write_good(tmp_path / "store")
    with caplog.at_level(logging.WARNING, logger="async_tracker"):
        for check in (check_metadata, check_artifacts, check_metrics, check_sources):
            check(tracker)
        check_descendants(tracker)
        check_run_ids(tracker)
    assert caplog.records == []


def test_the_stores_own_files_beside_the_runs_warn_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # What a store holds beside its runs: the fsspec config file the CLI is pointed at, a
    # .torchxconfig, a plot, a hidden working folder. None of these can be a run (a run is a
    # directory with a base32 name), and a read of the store does not warn about them.
    root = tmp_path / "store"
    tracker = write_good(root)
    put(root / "fsspec.cfg", f"protocol=file\nroot_path={root}\n")
    put(root / ".torchxconfig", "[torchx:tracker]\nfsspec =\n")
    put(root / "curves.png", b"\x89PNG")
    (root / ".lightning").mkdir()
    with caplog.at_level(logging.WARNING, logger="async_tracker"):
        check_run_ids(tracker)
        assert len(open_reader(tracker).run_summaries()) == 2
    assert caplog.records == []
    # A folder with a foreign name is still named: it may be a run someone renamed.
    (root / "not-a-run").mkdir()
    with caplog.at_level(logging.WARNING, logger="async_tracker"):
        check_run_ids(tracker)
    (warning,) = caplog.records
    assert str(root / "not-a-run") in warning.getMessage()
