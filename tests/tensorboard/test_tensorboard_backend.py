"""The TensorBoard backend beyond the conformance suite: what TensorBoard's own reader sees,
jobs configured the torchx way, retries that never store a point twice, the backend
contract (validate, map_error, end_run), run folders, corrupt stores and the factory.

Faults are real: a file where a folder should be (ENOTDIR), a file size limit
(``RLIMIT_FSIZE``) that tears an append half-way, damaged files in a run's folder.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")

from async_tracker import (
    AppRun,
    Batch,
    RetryPolicy,
    TrackerArtifact,
    TrackerMetric,
    TrackerSource,
)
from async_tracker.backend.tensorboard import (
    ARTIFACTS_TAG,
    METADATA_TAG,
    SIDE_DIR,
    STATUS_TAG,
    AsyncTensorBoardTracker,
    TensorBoardTracker,
    create,
    map_error,
    run_path,
)
from async_tracker.clock import HybridClock
from async_tracker.errors import (
    PermanentBackendError,
    TrackerConfigError,
    TransientBackendError,
    classify,
)
from async_tracker.tags import ENDING_KEY
from tests.core.helpers import python_env
from tests.tensorboard.helpers import accumulate, f32, scalars, text

if sys.version_info < (3, 11):  # pragma: no cover - 3.10
    from exceptiongroup import ExceptionGroup

pytestmark = pytest.mark.server  # needs the tensorboard extra

# Retries without waiting; a parked lane waits for the next flush() or close().
NO_WAIT = RetryPolicy(max_attempts=3, initial_backoff_s=0, max_backoff_s=0, jitter_s=0,
                      cooldown_s=3600)  # fmt: skip


def event_files(logdir: str | Path) -> list[Path]:
    return sorted(p for p in Path(logdir).iterdir() if "tfevents" in p.name)


def config_file(tmp_path: Path, root: Path) -> str:
    cfg = tmp_path / "tensorboard.cfg"
    cfg.write_text(f"# where the runs go\nroot_path={root}\n")
    return str(cfg)


# -- what TensorBoard reads -------------------------------------------------------------------

JOB = """
from async_tracker import AppRun
run = AppRun.run_from_env()
run.add_metadata(lr=0.1, model="mlp", layers=[64, 64])
run.add_artifact("ckpt", "/ckpt/last.pt", {"epoch": 2})
for step in range(300):
    run.log_metrics({"loss": 1.0 / (step + 1), "acc": step / 300}, step=step)
print("logged", flush=True)
# No close(): the tracker closes the run at interpreter exit.
"""


def test_a_torchx_job_with_the_tensorboard_tracker_is_read_by_tensorboard(
    tmp_path: Path,
) -> None:
    root = tmp_path / "tb"
    job_id = "local://tb/train-1"
    env = python_env(
        TORCHX_JOB_ID=job_id,
        TORCHX_TRACKERS="tensorboard",
        TORCHX_TRACKER_TENSORBOARD_CONFIG=config_file(tmp_path, root),
        ASYNC_TRACKER_BATCH_SIZE="64",  # several flushes
    )
    done = subprocess.run(
        [sys.executable, "-c", JOB], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout == "logged\n", done.stderr

    tracker = create(config_file(tmp_path, root)).async_tracker
    assert isinstance(tracker, AsyncTensorBoardTracker)
    logdir = Path(tracker.logdir(job_id))
    assert logdir == root / "local:" / "%" / "tb" / "train-1"  # "//" keeps an empty part
    acc = accumulate(logdir)
    assert set(acc.PluginTagToContent("scalars")) == {"loss", "acc"}
    assert scalars(acc, "loss") == [(s, f32(1.0 / (s + 1))) for s in range(300)]
    assert scalars(acc, "acc") == [(s, f32(s / 300)) for s in range(300)]
    rows = {key: value for key, value in text(acc, METADATA_TAG)}
    assert rows == {"`lr`": "`0.1`", "`model`": "`mlp`", "`layers`": "`[64, 64]`"}
    assert text(acc, ARTIFACTS_TAG) == [["`ckpt`", "`/ckpt/last.pt`", '`{"epoch": 2}`']]
    assert text(acc, STATUS_TAG) == [["`finished`"]]
    assert "_hparams_/session_start_info" in acc.PluginTagToContent("hparams")

    sync = create(config_file(tmp_path, root))
    assert [p.value for p in sync.metrics(job_id)["loss"]] == [1.0 / (s + 1) for s in range(300)]
    assert sync.metadata(job_id) == {"lr": 0.1, "model": "mlp", "layers": [64, 64]}
    assert list(sync.run_ids()) == [job_id]


async def test_values_steps_and_times_round_trip_exactly(tmp_path: Path) -> None:
    tracker = AsyncTensorBoardTracker(tmp_path)
    points = [
        TrackerMetric("odd", v, s, 1.7e9 + s + 0.123456)
        for s, v in enumerate([0.1, math.nan, math.inf, -math.inf, -0.0, 1e-310, 2.0**-1074])
    ]
    points.append(TrackerMetric("odd", 1.0, 2**62, 1.7e9))
    points.append(TrackerMetric("odd", 2.0, -5, 1.7e9))
    await tracker.add_metrics("r", points)
    got = (await tracker.metrics("r"))["odd"]
    want = sorted(points, key=lambda p: (p.step, p.timestamp))
    assert [(p.step, p.timestamp) for p in got] == [(p.step, p.timestamp) for p in want]
    for g, w in zip(got, want):
        assert g.value == w.value or (math.isnan(g.value) and math.isnan(w.value))
        assert math.copysign(1, g.value) == math.copysign(1, w.value)  # -0.0 stays negative
    acc = accumulate(tracker.logdir("r"))
    assert [s for s, _ in scalars(acc, "odd")] == [p.step for p in points]  # as written


# -- retries: each point once ------------------------------------------------------------------

FSIZE_JOB = """
import json, resource, signal, sys
from async_tracker import AppRun, RetryPolicy
from async_tracker.backend.tensorboard import AsyncTensorBoardTracker

root, limit = sys.argv[1], int(sys.argv[2])
# Past the limit, write() stores what fits and the next one fails with EFBIG (SIGXFSZ
# ignored): an append torn half-way, as a full disk or a quota would tear it.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
retry = RetryPolicy(max_attempts=3, initial_backoff_s=0, max_backoff_s=0, jitter_s=0)
with AppRun("fsize/run", [AsyncTensorBoardTracker(root)], flush_interval=3600,
            retry=retry) as run:
    for step in range(3000):
        run.log_metric("loss", step / 7, step=step)
        if step % 500 == 499:
            report = run.flush()
            assert report.ok, report
    print(json.dumps({"retries": run.status().backends["tensorboard"].retries,
                      "delivered": run.flush().delivered}))
"""


def test_an_append_torn_by_a_file_size_limit_is_cut_back_and_retried_in_a_new_file(
    tmp_path: Path,
) -> None:
    root = tmp_path / "tb"
    limit = 64 * 1024  # about 2.4 flushes of 500 points: the third append is torn
    done = subprocess.run(
        [sys.executable, "-c", FSIZE_JOB, str(root), str(limit)],
        env=python_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["delivered"] == 3000
    assert result["retries"] >= 2  # the torn appends were retried

    logdir = root / run_path("fsize/run")
    files = event_files(logdir)
    assert len(files) >= 3  # each torn append moved the run to a new file
    # Each file reads to its end (no torn record hides what follows it), and is a scalar
    # series by itself ...
    accs = [accumulate(f) for f in files]
    assert all("loss" in acc.PluginTagToContent("scalars") for acc in accs)
    per_file = [scalars(acc, "loss") for acc in accs]
    assert all(os.path.getsize(f) <= limit for f in files)
    # ... and together they hold every point once, in order.
    want = [(s, f32(s / 7)) for s in range(3000)]
    assert [p for points in per_file for p in points] == want
    assert scalars(accumulate(logdir), "loss") == want
    got = TensorBoardTracker(root).metrics("fsize/run")["loss"]
    assert [(p.step, p.value) for p in got] == [(s, s / 7) for s in range(3000)]  # exact


def test_a_blocked_folder_keeps_the_records_and_the_retry_stores_each_once(
    tmp_path: Path,
) -> None:
    root = tmp_path / "tb"
    tracker = AsyncTensorBoardTracker(root)
    # The parent's folder is a file: the child's own side file is written, then the edge
    # into its parent's folder fails (ENOTDIR), after the metadata and before the points.
    parent = root / run_path("blocked")
    parent.parent.mkdir(parents=True)
    parent.write_text("not a folder")
    run = AppRun("child", [tracker], flush_interval=3600, retry=NO_WAIT)
    try:
        run.add_metadata(lr=0.1)
        run.add_source("blocked", "model")
        for step in range(10):
            run.log_metric("loss", float(step), step=step)
        report = run.flush()
        assert not report.ok and report.delivered == 0 and report.dropped == 0, report
        assert "Not a directory" in report.errors["tensorboard"]

        parent.unlink()
        report = run.flush()
        assert report.ok and report.delivered == 12, report
    finally:
        assert run.close(10).ok
    sync = TensorBoardTracker(root)
    assert [p.step for p in sync.metrics("child")["loss"]] == list(range(10))
    assert scalars(accumulate(tracker.logdir("child")), "loss") == [
        (s, float(s)) for s in range(10)
    ]
    assert [(s.source_run_id, s.artifact_name) for s in sync.sources("child")] == [
        ("blocked", "model")
    ]
    assert [d.source_run_id for d in sync.lineage("blocked").descendants] == ["child"]
    assert sync.metadata("child") == {"lr": 0.1}


async def test_a_batch_replayed_by_another_process_is_read_once(tmp_path: Path) -> None:
    # A crash after the append and before the ack: the next process replays the batch (the
    # same key) into its own event file. Side files are overwritten; event files cannot be,
    # so the points are there twice, and metrics() reads them once.
    key = f"{time.time_ns():019d}-deadbeef-{7:012d}"
    batch = Batch(
        7,
        metadata={"lr": 0.1},
        artifacts={"ckpt": TrackerArtifact("ckpt", "/c.pt", None)},
        sources=[TrackerSource("parent", None)],
        metrics=[TrackerMetric("loss", 1.0 / (s + 1), s, 1.7e9 + s) for s in range(50)],
        key=key,
    )
    first, replay = AsyncTensorBoardTracker(tmp_path), AsyncTensorBoardTracker(tmp_path)
    await first.write_batch("r", batch.for_lane())
    await replay.write_batch("r", batch.for_lane())

    logdir = Path(first.logdir("r"))
    assert len(event_files(logdir)) == 2
    assert len(scalars(accumulate(logdir), "loss")) == 100  # TensorBoard's reader: twice
    got = (await replay.metrics("r"))["loss"]
    assert [(p.step, p.value) for p in got] == [(s, 1.0 / (s + 1)) for s in range(50)]
    side = [p.name for p in (logdir / SIDE_DIR).iterdir() if p.name.startswith(key)]
    assert len(side) == 1  # overwritten, not added
    assert [s.source_run_id for s in await replay.sources("r")] == ["parent"]
    assert [d.source_run_id for d in (await replay.lineage("parent")).descendants] == ["r"]


async def test_a_retried_batch_skips_what_it_stored(tmp_path: Path) -> None:
    tracker = AsyncTensorBoardTracker(tmp_path)
    batch = Batch(0, metadata={"a": 1}, metrics=[TrackerMetric("loss", 0.5, 0, 1.7e9)])
    await tracker.write_batch("r", batch)
    assert {"metadata", "metrics", "events"} <= batch.done
    await tracker.write_batch("r", batch)  # the lane's retry of a batch that did land
    assert len(scalars(accumulate(tracker.logdir("r")), "loss")) == 1
    assert len(list((Path(tracker.logdir("r")) / SIDE_DIR).glob("*.json"))) == 2  # + run.json


# -- the contract: validate, map_error, end_run ------------------------------------------------


@pytest.mark.parametrize(
    ("write", "key"),
    [
        (lambda run: run.log_metric("async_tracker/metadata", 1.0), "async_tracker/metadata"),
        (lambda run: run.log_metric("_hparams_/x", 1.0), "_hparams_/x"),
        (lambda run: run.log_metric("big", 1.0, step=2**63), "big"),
        (lambda run: run.log_metrics({"ok": 1.0, "lone\ud800": 2.0}, step=0), "lone"),
        (lambda run: run.add_artifact("ckpt", "/tmp/\udcff.pt"), "ckpt"),
        (lambda run: run.add_source("parent\ud800", "model"), "parent"),
    ],
    ids=["own-tag", "hparams-tag", "step", "surrogate-name", "surrogate-path", "surrogate-id"],
)
def test_what_tensorboard_cannot_hold_is_refused_at_the_call_site(
    tmp_path: Path, write: object, key: str
) -> None:
    tracker = AsyncTensorBoardTracker(tmp_path)
    with AppRun("r", [tracker], flush_interval=3600, retry=NO_WAIT) as run:
        with pytest.raises(ValueError, match=key):
            write(run)  # type: ignore[operator]
        run.log_metric("fine", 1.0, step=0)
        report = run.flush()
        assert report.ok and report.delivered == 1, report  # nothing of the refused call
    assert set(TensorBoardTracker(tmp_path).metrics("r")) == {"fine"}


def test_a_later_point_tensorboard_cannot_hold_is_dropped_alone(tmp_path: Path) -> None:
    # validate() sees the first point of each name; a later step beyond 64 bits fails the
    # batch's encoding before anything is written, and the lane drops that point alone.
    tracker = AsyncTensorBoardTracker(tmp_path)
    with AppRun("r", [tracker], flush_interval=3600, retry=NO_WAIT) as run:
        for step in [0, 1, 2**64, 3]:
            run.log_metric("loss", float(step), step=step)
        report = run.flush()
    assert report.delivered == 3 and report.dropped == 1, report
    assert "loss" in report.refused["tensorboard"][0]
    assert [p.step for p in TensorBoardTracker(tmp_path).metrics("r")["loss"]] == [0, 1, 3]


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (OSError(errno.EIO, "Input/output error"), "transient"),
        (FileNotFoundError(errno.ENOENT, "No such file or directory"), "transient"),
        (OSError(errno.ENOSPC, "No space left on device"), "backend"),
        (OSError(errno.EROFS, "Read-only file system"), "backend"),
        (NotADirectoryError(errno.ENOTDIR, "Not a directory"), "backend"),
        (OSError(errno.ENAMETOOLONG, "File name too long"), "record"),
        (RuntimeError("unknown"), "backend"),
        (ExceptionGroup("g", [OSError(errno.EIO, "x"), OSError(errno.EAGAIN, "y")]), "transient"),
    ],
    ids=["EIO", "ENOENT", "ENOSPC", "EROFS", "ENOTDIR", "ENAMETOOLONG", "unknown", "group"],
)
def test_map_error(error: BaseException, kind: str) -> None:
    mapped = AsyncTensorBoardTracker("/unused").map_error(error)
    assert classify(mapped) == kind
    assert isinstance(mapped, (TransientBackendError, PermanentBackendError))
    assert "tensorboard" in str(mapped)
    assert map_error(mapped) is mapped  # mapping twice changes nothing


async def test_end_run_records_how_the_run_ended(tmp_path: Path) -> None:
    tracker = AsyncTensorBoardTracker(tmp_path)
    with pytest.raises(KeyError):
        async with AppRun("failing", [tracker]) as run:
            run.log_metric("loss", 1.0, step=0)
            raise KeyError("boom")
    async with AppRun("fine", [tracker]) as run:
        run.log_metric("loss", 1.0, step=0)
    assert await tracker.run_status("failing") == "failed"
    assert await tracker.run_status("fine") == "finished"
    assert text(accumulate(tracker.logdir("failing")), STATUS_TAG) == [["`failed`"]]
    # The status is not metadata: metadata() reads what the job wrote, and what ended a run
    # that did not finish (the reserved key sealed with its end record).
    assert await tracker.metadata("failing") == {
        ENDING_KEY: {"reason": "failed", "type": "KeyError", "message": "'boom'"}
    }
    assert await tracker.metadata("fine") == {}


async def test_aclose_ends_the_runs_still_open_and_writes_again_later(tmp_path: Path) -> None:
    tracker = AsyncTensorBoardTracker(tmp_path)
    await tracker.add_metrics("a", [TrackerMetric("x", 1.0, 0, 1.7e9)])
    await tracker.add_metadata("b", k="v")
    await tracker.aclose("killed")
    assert await tracker.run_status("a") == "killed" and await tracker.run_status("b") == "killed"
    await tracker.add_metrics("a", [TrackerMetric("x", 2.0, 1, 1.7e9 + 1)])  # a new file
    assert [p.value for p in (await tracker.metrics("a"))["x"]] == [1.0, 2.0]
    assert len(event_files(tracker.logdir("a"))) == 2
    assert await tracker.run_status("never") is None


# -- run folders ---------------------------------------------------------------------------------


async def test_run_ids_nest_as_folders_and_never_leave_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    tracker = AsyncTensorBoardTracker(root)
    ids = [
        "sweep", "sweep/trial-1", "sweep/trial-2", "local://session/run", "../../escape",
        ".hidden/x", "sweep/.async_tracker", "a%2Fb", "a/b", "a//b", "", "/", "x" * 300,
        "x" * 299 + "y", "nul\x00byte", "lone\udc80",
    ]  # fmt: skip
    for i, run_id in enumerate(ids):
        await tracker.add_metadata(run_id, i=i)
        await tracker.add_metrics(run_id, [TrackerMetric("m", float(i), 0, 1.7e9)])
    folders = {tracker.logdir(r) for r in ids}
    assert len(folders) == len(ids)  # distinct ids, distinct folders
    for folder in folders:
        assert Path(folder).resolve().is_relative_to(root.resolve())
        assert all(not part.startswith(".") for part in Path(folder).relative_to(root).parts)
    assert sorted(await tracker.run_ids()) == sorted(ids)
    for i, run_id in enumerate(ids):
        assert await tracker.metadata(run_id) == {"i": i}
        assert [p.value for p in (await tracker.metrics(run_id))["m"]] == [float(i)]
    assert Path(tracker.logdir("sweep/trial-1")) == root / "sweep" / "trial-1"
    # TensorBoard sees one run per folder holding event files.
    acc = accumulate(tracker.logdir("sweep"))
    assert scalars(acc, "m") == [(0, 0.0)]  # not the trials' points, which nest below


# -- corrupt stores --------------------------------------------------------------------------


async def test_reads_skip_what_they_cannot_parse_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tracker = AsyncTensorBoardTracker(tmp_path)
    await tracker.add_metadata("r", lr=0.1)
    await tracker.add_metrics("r", [TrackerMetric("loss", 0.5, 0, 1.7e9)])
    logdir = Path(tracker.logdir("r"))
    (logdir / "events.out.tfevents.0.garbage").write_bytes(b"\x05" * 40)  # bad CRCs
    (logdir / SIDE_DIR / "0000-deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (logdir / SIDE_DIR / "0001-wrong.json").write_text('{"metadata": [1, 2]}')
    (logdir / SIDE_DIR / "0002-truncated.json").write_text('{"metadata": {"lr"')
    # Sorts after the real file: read whole or not at all, so its metadata does not win.
    (logdir / SIDE_DIR / "9999-half.json").write_text('{"metadata": {"lr": 9}, "artifacts": ["x"]}')
    # A torn last record (a crash mid-append): the points before it are read.
    (events,) = (f for f in event_files(logdir) if "garbage" not in f.name)
    with open(events, "ab") as f:
        f.write(b"\x10\x00\x00")
    (tmp_path / run_path("file-for-a-folder")).write_text("x")
    with caplog.at_level(logging.WARNING, "async_tracker"):
        assert await tracker.metadata("r") == {"lr": 0.1}
        assert [p.value for p in (await tracker.metrics("r"))["loss"]] == [0.5]
        assert await tracker.metadata("file-for-a-folder") == {}
        assert await tracker.metrics("file-for-a-folder") == {}
        assert await tracker.run_ids() == ["r"]
    warnings = [r.getMessage() for r in caplog.records]
    assert len([w for w in warnings if "0000-deep.json" in w and "9999-half" in w]) == 1
    assert any("file-for-a-folder" in w for w in warnings)


# -- the factory and the sync face --------------------------------------------------------------


def test_create_reads_root_path_from_a_config_file(tmp_path: Path) -> None:
    tracker = create(config_file(tmp_path, tmp_path / "tb"))
    assert isinstance(tracker, TensorBoardTracker)
    tracker.add_metadata("r", a=1)
    tracker.add_metrics("r", [TrackerMetric("loss", 0.5, 3, 1.7e9)])
    assert tracker.metadata("r") == {"a": 1}
    assert [(p.step, p.value) for p in tracker.metrics("r")["loss"]] == [(3, 0.5)]
    tracker.close()
    assert (tmp_path / "tb" / "r" / SIDE_DIR / "run.json").exists()
    assert repr(tracker) == f"<TensorBoardTracker: root_path={tmp_path / 'tb'}>"


def test_create_without_a_config_writes_to_the_default_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ASYNC_TRACKER_TENSORBOARD_DIR", raising=False)
    assert repr(create(None)) == f"<TensorBoardTracker: root_path={tmp_path / 'tensorboard_runs'}>"
    monkeypatch.setenv("ASYNC_TRACKER_TENSORBOARD_DIR", str(tmp_path / "tb"))
    assert repr(create(None)) == f"<TensorBoardTracker: root_path={tmp_path / 'tb'}>"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "lacks 'root_path'"),
        ("root_path=/x\nflush_secs=3\n", "unknown keys ['flush_secs']"),
        ("root_path=s3://bucket/tb\n", "local folder"),
        ("just words\n", "line 1: expected key=value"),
    ],
    ids=["no-root", "unknown-key", "remote", "malformed"],
)
def test_create_refuses_configs_it_cannot_use(
    tmp_path: Path, content: str | None, message: str
) -> None:
    config = None
    if content is not None:
        config = str(tmp_path / "tb.cfg")
        Path(config).write_text(content)
    with pytest.raises(TrackerConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        create(config)
    with pytest.raises(TrackerConfigError, match="cannot read"):
        create(str(tmp_path / "missing.cfg"))


def test_init_with_a_tensorboard_beside_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import async_tracker

    monkeypatch.setenv("ASYNC_TRACKER_TENSORBOARD_DIR", str(tmp_path / "tb"))
    with async_tracker.init("p", dir=str(tmp_path / "store"), backends=["tensorboard"]) as run:
        for step in range(3):
            run.log_metric("loss", 1.0 / (step + 1), step=step)
    read = create(None).metrics(run.id)
    assert [(p.step, p.value) for p in read["loss"]] == [(0, 1.0), (1, 0.5), (2, 1 / 3)]


def test_a_run_reopened_after_the_clock_steps_back_keeps_its_later_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The side files a flush writes are named by the time the batch was cut, and read back in
    # name order: a run reopened in the same process after the wall clock was set back must
    # still name its files after the earlier ones.
    now = [1_700_000_000 * 10**9]
    fake_time = type("FakeTime", (), {"time_ns": staticmethod(lambda: now[0])})
    monkeypatch.setattr("async_tracker.pipeline.cutter.time", fake_time)
    # A new process clock: keys this test process cut before are later than these times.
    monkeypatch.setattr("async_tracker.pipeline.cutter._key_clock", HybridClock())
    tracker = TensorBoardTracker(str(tmp_path))
    with AppRun("r", [tracker], flush_interval=3600) as run:
        run.add_metadata(lr=1)
    now[0] -= 10 * 10**9
    with AppRun("r", [tracker], flush_interval=3600) as run:
        run.add_metadata(lr=2)
    assert TensorBoardTracker(str(tmp_path)).metadata("r") == {"lr": 2}
