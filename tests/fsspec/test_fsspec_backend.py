"""The fsspec backend: layout, batching, atomicity, foreign and corrupt files, config files."""

from __future__ import annotations

import errno
import json
import logging
import math
import posixpath
import sys
from pathlib import Path

import fsspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from async_tracker import AppRun, TrackerConfigError, TrackerSource
from async_tracker.backend.fsspec import (
    AsyncFsspecTracker,
    FsspecTracker,
    _columns_by_name,
    create,
    decode_run_id,
    encode_run_id,
    read_config,
)
from async_tracker.errors import RecordError, TransientBackendError
from async_tracker.records import MetricRow

if sys.version_info < (3, 11):  # pragma: no cover - 3.10
    from exceptiongroup import ExceptionGroup

RUN = "local://session/app-1"


def files(root: Path, run_id: str, category: str) -> list[str]:
    d = root / encode_run_id(run_id) / category
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def tracker(root: Path) -> FsspecTracker:
    return FsspecTracker(fsspec.filesystem("file"), str(root))


def test_run_dir_is_torchx_base32(root: Path, tracker: FsspecTracker) -> None:
    tracker.add_metadata(RUN, a=1)
    # The run's directory, and beside it (hidden files) the run index: the summary of what
    # this process wrote.
    (entry,) = [e for e in root.iterdir() if not e.name.startswith(".index-")]
    assert entry.name == "NRXWGYLMHIXS643FONZWS33OF5QXA4BNGE======"
    assert decode_run_id(entry.name) == RUN


def test_one_flush_writes_a_handful_of_files(root: Path, tracker: FsspecTracker) -> None:
    # No timed flush: on a loaded machine logging these points outlasts the default interval,
    # and a timed flush between them would cut a second segment.
    with AppRun(RUN, [tracker], batch_size=100_000, flush_interval=3600) as run:
        run.add_metadata(lr=0.1)
        run.add_metadata(lr=0.2, bs=32)
        run.add_artifact("model", "/m1")
        run.add_artifact("model", "/m2")
        for step in range(20_000):
            run.log_metrics({"loss": 1.0 / (step + 1), "acc": step / 20_000}, step=step)
        report = run.flush()
        assert report.ok and report.delivered == 40_004
        assert len(files(root, RUN, "metadata")) == 2  # one per key: lr (once), bs
        assert len(files(root, RUN, "metrics")) == 1
        assert len(files(root, RUN, "artifacts")) == 1
        assert run.metadata() == {"lr": 0.2, "bs": 32}
        assert run.artifacts()["model"].path == "/m2"
        points = run.metrics()
        assert [p.step for p in points["loss"]] == list(range(20_000))


def test_metadata_keeps_one_file_per_key_so_any_listing_order_reads_last_write(
    root: Path, tracker: FsspecTracker
) -> None:
    # torchx's reader merges files in listing order (hash order on local disks): with one
    # file left per key, that order cannot matter.
    with AppRun(RUN, [tracker]) as run:
        for i in range(30):
            run.add_metadata(epoch=i, **{f"k{i}": i})
            run.flush()
    names = files(root, RUN, "metadata")
    assert len(names) == 31  # epoch, k0 ... k29
    merged: dict[str, object] = {}
    for name in names:
        content = json.loads((root / encode_run_id(RUN) / "metadata" / name).read_text())
        (key,) = content["metadata"]  # one key a file
        assert key not in merged
        merged.update(content["metadata"])
    assert merged == {"epoch": 29, **{f"k{i}": i for i in range(30)}}


def test_metrics_segments_are_new_files_never_appended(root: Path, tracker: FsspecTracker) -> None:
    with AppRun(RUN, [tracker]) as run:
        seen: list[str] = []
        for i in range(5):
            run.log_metric("loss", float(i), step=i)
            run.flush()
            now = files(root, RUN, "metrics")
            assert set(seen) < set(now)  # old segments stay, a new one appears
            for name in seen:
                assert (root / encode_run_id(RUN) / "metrics" / name).stat().st_size > 0
            seen = now
        assert len(seen) == 5
        assert seen == sorted(seen)


def test_nan_and_infinities_round_trip(tracker: FsspecTracker) -> None:
    with AppRun(RUN, [tracker]) as run:
        run.log_metric("x", float("nan"), step=0)
        run.log_metric("x", math.inf, step=1)
        run.log_metric("x", -math.inf, step=2)
        values = [p.value for p in run.metrics()["x"]]
    assert math.isnan(values[0]) and values[1:] == [math.inf, -math.inf]


def test_sources_append_without_repeats_and_descendants(root: Path, tracker: FsspecTracker) -> None:
    tracker.add_source(RUN, "parent", None)
    tracker.add_source(RUN, "parent", "ckpt")
    tracker.add_source(RUN, "parent", "ckpt")
    text = (root / encode_run_id(RUN) / "sources" / encode_run_id("parent")).read_text()
    assert text == "\nckpt\n"
    assert list(tracker.sources(RUN, "ckpt")) == [TrackerSource("parent", "ckpt")]
    assert {(s.source_run_id, s.artifact_name) for s in tracker.sources(RUN)} == {
        ("parent", None),
        ("parent", "ckpt"),
    }
    lineage = tracker.lineage("parent")
    assert {(d.source_run_id, d.artifact_name) for d in lineage.descendants} == {
        (RUN, None),
        (RUN, "ckpt"),
    }
    assert list(tracker.run_ids(parent_run_id="parent")) == [RUN]


def test_non_ascii_run_id(tracker: FsspecTracker) -> None:
    run_id = "local://sess/entraînement-模型"
    tracker.add_metadata(run_id, a="é")
    assert tracker.metadata(run_id) == {"a": "é"}
    assert run_id in list(tracker.run_ids())


def test_foreign_and_corrupt_files_are_skipped_with_one_warning(
    root: Path, tracker: FsspecTracker, caplog: pytest.LogCaptureFixture
) -> None:
    tracker.add_metadata(RUN, a=1)
    tracker.add_artifact(RUN, "model", "/m")
    run_dir = root / encode_run_id(RUN)
    (run_dir / "metadata" / "0000-corrupt").write_text("{not json")
    (run_dir / "metadata" / "0001-wrong-shape").write_text('{"metadata": [1, 2]}')
    (run_dir / "metadata" / "a-directory").mkdir()
    (run_dir / "artifacts" / "zzz").write_text('{"no": "name"}')
    (run_dir / "metrics").mkdir(exist_ok=True)
    (run_dir / "metrics" / "bad.jsonl").write_text('{"name": "x", "step": [1], "value": []}\n')
    (root / "not-base32!").mkdir()
    (root / "README.txt").write_text("hello")
    with caplog.at_level(logging.WARNING, logger="async_tracker"):
        assert tracker.metadata(RUN) == {"a": 1}
        (warning,) = caplog.records
        for name in ("0000-corrupt", "0001-wrong-shape", "a-directory"):
            assert str(run_dir / "metadata" / name) in warning.getMessage()
        assert list(tracker.artifacts(RUN)) == ["model"]
        assert tracker.metrics(RUN) == {}
        assert list(tracker.run_ids()) == [RUN]


def test_reads_of_an_unknown_run_are_empty(tracker: FsspecTracker) -> None:
    assert tracker.metadata("nope") == {}
    assert tracker.artifacts("nope") == {}
    assert list(tracker.sources("nope")) == []
    assert tracker.metrics("nope") == {}
    assert list(tracker.run_ids()) == []


def test_staged_writes_leave_no_partial_files(root: Path, tracker: FsspecTracker) -> None:
    with AppRun(RUN, [tracker]) as run:
        run.add_metadata(a=1)
        run.log_metric("m", 1.0)
        run.flush()
    tmp = root / encode_run_id(RUN) / ".tmp"
    assert not tmp.exists() or list(tmp.iterdir()) == []


def test_memory_filesystem() -> None:
    fs = fsspec.filesystem("memory")
    root = "/at-test-" + RUN.replace("/", "_")
    tracker = FsspecTracker(fs, root)
    with AppRun(RUN, [tracker]) as run:
        run.add_metadata(a=1)
        run.log_metric("m", 2.0, step=3)
        assert run.metadata() == {"a": 1}
        assert run.metrics()["m"][0].step == 3
    fs.rm(root, recursive=True)


# -- config files -------------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "tracker.cfg"
    p.write_text(text)
    return str(p)


def test_config_nested_keys_comments_and_booleans(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        "# a comment = with an equals sign\n"
        "; another = comment\n"
        "\n"
        "protocol = file\n"
        f"root_path = {tmp_path}/runs\n"
        "client_kwargs.endpoint_url = http://x:1/?a=b\n"
        "client_kwargs.nested.deep = 2\n"
        "auto_mkdir = true\n",
    )
    assert read_config(cfg) == {
        "protocol": "file",
        "root_path": f"{tmp_path}/runs",
        "client_kwargs": {"endpoint_url": "http://x:1/?a=b", "nested": {"deep": 2}},
        "auto_mkdir": True,
    }


def test_config_creates_a_working_tracker(tmp_path: Path) -> None:
    cfg = write(tmp_path, f"protocol=file\nroot_path={tmp_path}/runs\n")
    tracker = create(cfg)
    tracker.add_metadata(RUN, x=1)
    assert tracker.metadata(RUN) == {"x": 1}
    assert isinstance(tracker.async_tracker, AsyncFsspecTracker)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("root_path=/x\n", "lacks 'protocol'"),
        ("protocol=file\n", "lacks 'root_path'"),
        ("", "lacks 'protocol' and 'root_path'"),
        ("protocol=file\nroot_path=/x\nthis line is broken\n", "line 3: expected key=value"),
        ("protocol=file\nroot_path=/x\na.=1\n", "malformed key"),
    ],
)
def test_config_errors_are_clear(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TrackerConfigError, match=message):
        create(write(tmp_path, text))


def test_config_errors_never_show_credentials(tmp_path: Path) -> None:
    cfg = write(tmp_path, "protocol=nosuchprotocol\nroot_path=/x\nsecret=hunter2-SECRET\n")
    with pytest.raises(TrackerConfigError) as info:
        create(cfg)
    assert "hunter2" not in str(info.value)
    assert "secret" in str(info.value)  # the key is named, not its value


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(TrackerConfigError, match="cannot read tracker config"):
        create(str(tmp_path / "absent.cfg"))
    with pytest.raises(TrackerConfigError, match="needs a config file"):
        create(None)


def test_names_sort_into_write_order_across_runs(tmp_path: Path) -> None:
    fs = fsspec.filesystem("file")
    tracker = AsyncFsspecTracker(fs, str(tmp_path))
    from async_tracker.backend.fsspec import _names

    names = [_names.new() for _ in range(1000)]
    assert names == sorted(names)
    assert len(set(names)) == 1000
    assert posixpath.basename(tracker.root_dir) == tmp_path.name


def test_numbers_in_config_files_are_parsed_but_credentials_stay_text(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        "protocol=file\nroot_path=/x\n"
        "timeout=30\nratio=0.5\nneg=-3\nbig=1e3\nversion=1.2.3\nzero=0\n"
        "padded=007\nsecret=12345\nclient_kwargs.region_name=123\n"
        "config_kwargs.retries.max_attempts=5\n",
    )
    assert read_config(cfg) == {
        "protocol": "file",
        "root_path": "/x",
        "timeout": 30,
        "ratio": 0.5,
        "neg": -3,
        "big": 1000.0,
        "version": "1.2.3",
        "zero": 0,
        "padded": "007",  # a leading zero: maybe an id or a secret, kept as written
        "secret": "12345",
        "client_kwargs": {"region_name": "123"},
        "config_kwargs": {"retries": {"max_attempts": 5}},
    }


def test_config_url_names_the_store(tmp_path: Path) -> None:
    cfg = write(tmp_path, f"url=file://{tmp_path}/runs\nauto_mkdir=true\n")
    tracker = create(cfg)
    tracker.add_metadata(RUN, x=1)
    assert (tmp_path / "runs" / encode_run_id(RUN) / "metadata").is_dir()
    assert FsspecTracker(fsspec.filesystem("file"), str(tmp_path / "runs")).metadata(RUN) == {
        "x": 1
    }
    memory = create(write(tmp_path, f"url=memory://url-test-{tmp_path.name}/runs\n"))
    memory.add_metadata(RUN, y=2)
    assert memory.metadata(RUN) == {"y": 2}
    assert type(memory.async_tracker.fs).__name__ == "MemoryFileSystem"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("url=file:///x\nprotocol=file\n", "not both"),
        ("url=file:///x\nroot_path=/x\n", "not both"),
        ("url=nosuchscheme://user:hunter2@host/x\n", "cannot create the 'nosuchscheme'"),
    ],
)
def test_config_url_errors_are_clear_and_hide_credentials(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(TrackerConfigError, match=message) as info:
        create(write(tmp_path, text))
    assert "hunter2" not in str(info.value)


# -- the backend contract ---------------------------------------------------------------------


def test_validate_refuses_names_that_make_no_file_at_the_call_site(root: Path) -> None:
    tracker = FsspecTracker(fsspec.filesystem("file"), str(root))
    with AppRun(RUN, [tracker]) as run:
        longest_artifact = "a" * 155  # base32: 248 characters
        run.add_artifact(longest_artifact, "/m")
        with pytest.raises(ValueError, match=r"artifact 'aaa.*156 bytes.*at most 155"):
            run.add_artifact("a" * 156, "/m")
        with pytest.raises(ValueError, match=r"artifact 'model.*lone surrogate"):
            run.add_artifact("model\ud800", "/m")
        longest_source = "s" * 145  # base32 and a digest: 255 characters
        run.add_source(longest_source, "ckpt")
        with pytest.raises(ValueError, match=r"source 'sss.*146 bytes"):
            run.add_source("s" * 146)
        for art in ("two\nlines", "cr\rhere", " padded", "padded "):
            with pytest.raises(ValueError, match="line break or surrounding blanks"):
                run.add_source("parent", art)
        with pytest.raises(ValueError, match=r"artifact_name .* lone surrogate"):
            run.add_source("parent", "ckpt\udc80")
        # Metadata keys are only inside JSON (the file is named by a digest): any length.
        run.add_metadata(**{"k" * 1000: 1})
        assert run.close(30).ok
    assert set(tracker.artifacts(RUN)) == {longest_artifact}
    assert [(s.source_run_id, s.artifact_name) for s in tracker.sources(RUN)] == [
        (longest_source, "ckpt")
    ]
    assert [d.source_run_id for d in tracker.lineage(longest_source).descendants] == [RUN]
    assert tracker.metadata(RUN) == {"k" * 1000: 1}


def test_map_error_method_maps_what_escapes_a_write() -> None:
    tracker = AsyncFsspecTracker(fsspec.filesystem("memory"), "/map-error")
    assert isinstance(tracker.map_error(ConnectionResetError(errno.ECONNRESET, "reset")),
                      TransientBackendError)  # fmt: skip
    assert isinstance(tracker.map_error(OSError(errno.EFBIG, "too large")), RecordError)
    group = ExceptionGroup("writes", [TimeoutError("slow"), ValueError("x")])
    assert isinstance(tracker.map_error(group), TransientBackendError)
    already = RecordError("kept as it is")
    assert tracker.map_error(already) is already


async def test_aclose_with_each_reason_leaves_the_store_and_filesystem_usable(
    root: Path,
) -> None:
    fs = fsspec.filesystem("file")
    for reason in ("finished", "failed", "killed"):
        tracker = AsyncFsspecTracker(fs, str(root))
        await tracker.add_metadata(RUN, **{reason: True})
        await tracker.aclose(reason)  # type: ignore[arg-type]
    # The filesystem is fsspec's shared instance: still working for anyone holding it.
    again = AsyncFsspecTracker(fs, str(root))
    assert await again.metadata(RUN) == {"finished": True, "failed": True, "killed": True}


def test_metadata_keys_read_back_in_call_order(tracker: FsspecTracker) -> None:
    # One file per key: the files of one call sort in the order of its keys, not by digest;
    # keys come in the order of their last writes (a rewritten key's older file is gone).
    keys = [f"key{i}" for i in range(40)]
    tracker.add_metadata(RUN, **{k: i for i, k in enumerate(keys)})
    assert list(tracker.metadata(RUN)) == keys
    tracker.add_metadata(RUN, key0="again", new=1)
    assert list(tracker.metadata(RUN)) == [*keys[1:], "key0", "new"]
    assert tracker.metadata(RUN)["key0"] == "again"


def test_a_later_call_wins_over_an_earlier_one_flushed_after_it(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two writers of one run (two processes, as two pipelines here), each with its own
    # clock: the earlier call (t=100) is flushed after the later one (t=200). The later call
    # must win, whatever the order of the flushes: keys are ordered by call time, not by
    # when their batch was cut.
    early = AppRun(RUN, [FsspecTracker(fsspec.filesystem("file"), str(root))],
                   flush_interval=3600)
    late = AppRun(RUN, [FsspecTracker(fsspec.filesystem("file"), str(root))],
                  flush_interval=3600)
    monkeypatch.setattr("async_tracker.run._wall_clock", lambda: 100.0)
    early.add_metadata(lr=0.1, keep="early")
    monkeypatch.setattr("async_tracker.run._wall_clock", lambda: 200.0)
    late.add_metadata(lr=0.2)
    assert late.flush().ok
    assert early.flush().ok
    reader = AppRun(RUN, [FsspecTracker(fsspec.filesystem("file"), str(root))])
    assert reader.metadata() == {"lr": 0.2, "keep": "early"}
    early.close()
    late.close()


def _grouped_one_by_one(
    rows: list[MetricRow],
) -> dict[str, tuple[list[int], list[float], list[float]]]:
    """The reference: each name's points in call order, names in the order they first came."""
    out: dict[str, tuple[list[int], list[float], list[float]]] = {}
    for name, value, step, time in rows:
        steps, values, times = out.setdefault(name, ([], [], []))
        steps.append(step)
        values.append(value)
        times.append(time)
    return out


@given(
    st.lists(st.sampled_from("abcd"), min_size=1, max_size=6),
    st.integers(1, 30),
    st.lists(st.tuples(st.integers(0, 200), st.sampled_from("abcde")), max_size=4),
)
def test_segment_columns_keep_each_names_points_in_call_order(
    per_step: list[str], steps: int, strays: list[tuple[int, str]]
) -> None:
    # A loop logging the same names at every step (strided: the fast case), with a few stray
    # points inserted anywhere (the general case), a name twice in a step, or one name only.
    names = [n for _ in range(steps) for n in per_step]
    for at, name in strays:
        names.insert(min(at, len(names)), name)
    rows: list[MetricRow] = [(n, float(i), i, i / 2) for i, n in enumerate(names)]
    got = {k: tuple(map(list, v)) for k, v in _columns_by_name(rows).items()}
    expected = _grouped_one_by_one(rows)
    assert got == expected and list(got) == list(expected)
