"""The fsspec backend maps its libraries' errors at its boundary: one BackendError naming the
file, transient, about the backend (the records are kept) or about a record.

Real components: a moto S3 server killed and restarted (and a closed port), a missing bucket,
a directory bind-mounted read-only and back, a full tmpfs, real ENAMETOOLONG on local disk,
values JSON cannot hold. What cannot happen for real here (EACCES and EPERM as root, a quota)
comes from a thin subclass of fsspec's memory filesystem that raises the OSError the OS would.
The mount tests skip where mounting is not allowed.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from async_tracker import Batch, TrackerArtifact, TrackerMetric, TrackerSource
from async_tracker.backend.fsspec import AsyncFsspecTracker, encode_run_id, map_error
from async_tracker.errors import (
    BackendError,
    PermanentBackendError,
    RecordError,
    TransientBackendError,
    classify,
)
from tests.core.helpers import free_port
from tests.fsspec.conftest import make_bucket, wait_http

if sys.version_info < (3, 11):  # pragma: no cover - 3.10
    from exceptiongroup import BaseExceptionGroup, ExceptionGroup

RUN = "errors/run-1"
_seq = iter(range(1, 1_000_000))


def batch_key(seq: int | None = None) -> str:
    """A key shaped as the lane makes them: time, process token, sequence number."""
    return f"{time.time_ns():019d}-{'t' * 8}{os.getpid():x}-{seq or next(_seq):012d}"


def a_batch(key: str = "", **kw: Any) -> Batch:
    kw.setdefault("metadata", {"lr": 0.1})
    kw.setdefault("metrics", [TrackerMetric("loss", 1.0 / (i + 1), i, 1.7e9 + i) for i in range(5)])
    records = len(kw["metadata"]) + len(kw["metrics"]) + len(kw.get("artifacts", {}))
    return Batch(0, records=records, key=key, **kw)


def s3_fs(endpoint: str) -> Any:
    """s3fs on ``endpoint``, failing fast: no botocore retries, one s3fs attempt."""
    fs = fsspec.filesystem(
        "s3",
        key="testing",
        secret="testing",
        skip_instance_cache=True,
        client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"},
        config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 2, "read_timeout": 5},
    )
    fs.retries = 1
    return fs


class MotoServer:
    """A moto S3 server of the test's own, on a fixed port, that can be killed (SIGKILL, as
    a crash) and started again (empty: moto keeps its state in memory)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_http(self.url, self.proc, 30)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def moto() -> Iterator[MotoServer]:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    server = MotoServer()
    server.start()
    try:
        yield server
    finally:
        server.kill()


# -- S3 ------------------------------------------------------------------------------------------


async def test_s3_endpoint_unreachable_is_transient_and_names_the_file() -> None:
    pytest.importorskip("s3fs")
    tracker = AsyncFsspecTracker(s3_fs(f"http://127.0.0.1:{free_port()}"), "bucket/runs")
    key = batch_key()
    with pytest.raises(TransientBackendError) as info:
        await tracker.write_batch(RUN, a_batch(key))
    message = str(info.value)
    assert f"bucket/runs/{encode_run_id(RUN)}/metadata/{key}" in message
    assert "EndpointConnectionError" in message
    assert classify(info.value) == "transient"


async def test_s3_server_killed_mid_run_is_transient_then_the_retry_lands(
    moto: MotoServer,
) -> None:
    bucket = make_bucket(moto.url)
    tracker = AsyncFsspecTracker(s3_fs(moto.url), f"{bucket}/runs")
    first = a_batch(batch_key())
    await tracker.write_batch(RUN, first)

    moto.kill()  # an outage longer than botocore's and s3fs's own retries
    points = [TrackerMetric("loss", 0.5, step, 1.7e9 + step) for step in range(5, 10)]
    second = a_batch(batch_key(), metadata={"phase": "during"}, metrics=points)
    with pytest.raises(TransientBackendError, match="metadata/" + second.key):
        await tracker.write_batch(RUN, second)
    assert "metadata" not in second.done

    moto.start()  # back on the same port, empty (moto keeps nothing): the bucket made again
    boto3 = pytest.importorskip("boto3")
    boto3.client(
        "s3", endpoint_url=moto.url, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    ).create_bucket(Bucket=bucket)  # fmt: skip
    await tracker.write_batch(RUN, second)  # the lane's retry: the same batch
    # The restarted server kept nothing of the first batch: the retry's files are all there is.
    assert await tracker.metadata(RUN) == {"phase": "during"}
    assert [p.step for p in (await tracker.metrics(RUN))["loss"]] == [5, 6, 7, 8, 9]


async def test_s3_missing_bucket_is_about_the_backend(s3_endpoint: str) -> None:
    tracker = AsyncFsspecTracker(s3_fs(s3_endpoint), "no-such-bucket-here/runs")
    key = batch_key()
    with pytest.raises(PermanentBackendError) as info:
        await tracker.write_batch(RUN, a_batch(key))
    assert not isinstance(info.value, RecordError)
    assert classify(info.value) == "backend"  # the lane keeps the records
    message = str(info.value)
    assert "NoSuchBucket" in message
    assert f"no-such-bucket-here/runs/{encode_run_id(RUN)}/metadata/{key}" in message


# -- local disk --------------------------------------------------------------------------------


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory bind-mounted over itself read-only (real EROFS even for root: chmod does
    not stop root), made writable again by ``remount_rw``. Skipped where mounting is not
    allowed."""
    target = tmp_path / "ro"
    target.mkdir()
    mounted = subprocess.run(
        ["mount", "--bind", str(target), str(target)], capture_output=True
    ).returncode == 0
    if not mounted:
        pytest.skip("bind mounts are not allowed here")
    try:
        if subprocess.run(
            ["mount", "-o", "remount,bind,ro", str(target)], capture_output=True
        ).returncode != 0:
            pytest.skip("cannot remount read-only here")
        yield target
    finally:
        subprocess.run(["umount", str(target)], capture_output=True, check=False)


def remount_rw(target: Path) -> None:
    subprocess.run(["mount", "-o", "remount,bind,rw", str(target)], check=True)


async def test_read_only_root_is_about_the_backend_and_passes_when_writable(
    read_only_dir: Path,
) -> None:
    tracker = AsyncFsspecTracker(fsspec.filesystem("file"), str(read_only_dir / "store"))
    batch = a_batch(batch_key())
    with pytest.raises(PermanentBackendError) as info:
        await tracker.write_batch(RUN, batch)
    assert not isinstance(info.value, RecordError)
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == errno.EROFS
    assert str(read_only_dir / "store") in str(info.value)

    remount_rw(read_only_dir)  # the store comes back: the lane's later retry lands
    await tracker.write_batch(RUN, batch)
    run_dir = read_only_dir / "store" / encode_run_id(RUN)
    (name,) = [p.name for p in (run_dir / "metadata").iterdir()]
    assert name.startswith(batch.key + "-")
    assert await tracker.metadata(RUN) == {"lr": 0.1}


async def test_name_too_long_on_disk_is_about_the_record(tmp_path: Path) -> None:
    tracker = AsyncFsspecTracker(fsspec.filesystem("file"), str(tmp_path / "store"))
    name = "checkpoint-" + "x" * 300  # its base32 file name is far beyond 255 bytes
    batch = a_batch(artifacts={name: TrackerArtifact(name, "/ckpt", None)})
    with pytest.raises(RecordError) as info:
        await tracker.write_batch(RUN, batch)
    assert "artifacts/" in str(info.value)
    assert info.value.__cause__ is not None
    assert getattr(info.value.__cause__, "errno", None) == errno.ENAMETOOLONG
    assert "metadata" in batch.done  # the parts before it were stored


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A small tmpfs filled to the last byte (real ENOSPC); ``filler`` in it frees the room.
    Skipped where mounting is not allowed."""
    target = tmp_path / "full"
    target.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(target)], capture_output=True
    ).returncode != 0:
        pytest.skip("tmpfs mounts are not allowed here")
    try:
        (target / "store").mkdir()
        with open(target / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        yield target
    finally:
        subprocess.run(["umount", str(target)], capture_output=True, check=False)


async def test_full_disk_is_about_the_backend_and_passes_when_room_is_made(
    full_disk: Path,
) -> None:
    tracker = AsyncFsspecTracker(fsspec.filesystem("file"), str(full_disk / "store"))
    batch = a_batch(batch_key())
    with pytest.raises(PermanentBackendError) as info:
        await tracker.write_batch(RUN, batch)
    assert not isinstance(info.value, RecordError)
    assert classify(info.value) == "backend"
    cause = info.value.__cause__
    assert isinstance(cause, OSError) and cause.errno == errno.ENOSPC, cause
    assert f"store/{encode_run_id(RUN)}/metadata/{batch.key}" in str(info.value)
    # The partial temporary file was removed, not left to fill the disk further.
    tmp = full_disk / "store" / encode_run_id(RUN) / ".tmp"
    assert not tmp.exists() or list(tmp.iterdir()) == []

    (full_disk / "filler").unlink()  # room again: the lane's later retry lands
    await tracker.write_batch(RUN, batch)
    assert await tracker.metadata(RUN) == {"lr": 0.1}


class FailingMemoryFS(MemoryFileSystem):
    """fsspec's memory filesystem whose writes raise the OSError the OS would raise."""

    fail_errno: int | None = None

    def pipe_file(self, path: str, value: bytes, *args: Any, **kwargs: Any) -> None:
        if self.fail_errno is not None:
            raise OSError(self.fail_errno, os.strerror(self.fail_errno), path)
        super().pipe_file(path, value, *args, **kwargs)


@pytest.fixture
def failing_fs() -> Iterator[FailingMemoryFS]:
    fs = FailingMemoryFS(skip_instance_cache=True)
    yield fs
    fs.fail_errno = None


@pytest.mark.parametrize(
    ("err", "kind"),
    [
        (errno.EROFS, PermanentBackendError),
        (errno.ENOSPC, PermanentBackendError),
        (errno.EDQUOT, PermanentBackendError),
        (errno.EACCES, PermanentBackendError),
        (errno.EPERM, PermanentBackendError),
        (errno.EIO, TransientBackendError),
        (errno.ECONNRESET, TransientBackendError),
        (errno.EFBIG, RecordError),
    ],
    ids=lambda v: errno.errorcode[v] if isinstance(v, int) else v.__name__,
)
async def test_oserrors_of_the_filesystem_are_mapped_naming_the_file(
    failing_fs: FailingMemoryFS, err: int, kind: type[BackendError]
) -> None:
    root = f"/errors-{uuid.uuid4().hex}"
    tracker = AsyncFsspecTracker(failing_fs, root)
    failing_fs.fail_errno = err
    key = batch_key()
    with pytest.raises(BackendError) as info:
        await tracker.write_batch(RUN, a_batch(key))
    assert type(info.value) is kind
    assert f"{root}/{encode_run_id(RUN)}/metadata/{key}" in str(info.value)
    assert os.strerror(err) in str(info.value)

    failing_fs.fail_errno = None  # the disk has room again: the same batch is written
    await tracker.write_batch(RUN, a_batch(key))
    assert await tracker.metadata(RUN) == {"lr": 0.1}
    failing_fs.rm(root, recursive=True)


# -- values that cannot be encoded --------------------------------------------------------------


def cycle() -> dict[str, object]:
    d: dict[str, object] = {"a": 1}
    d["self"] = d
    return d


@pytest.mark.parametrize(
    "value",
    [cycle(), 10**5000, {"deep": object()}],
    ids=["cycle", "huge-int", "not-json"],
)
async def test_metadata_json_cannot_hold_is_a_record_error_naming_the_file(
    tmp_path: Path, value: object
) -> None:
    tracker = AsyncFsspecTracker(fsspec.filesystem("file"), str(tmp_path / "store"))
    key = batch_key()
    with pytest.raises(RecordError) as info:
        await tracker.write_batch(RUN, a_batch(key, metadata={"ok": 1, "bad": value}))
    assert f"metadata/{key}" in str(info.value)
    assert classify(info.value) == "record"
    # Nothing of the refused value stays in the process's merged metadata: the lane's
    # split sends the good record alone, and later batches carry no trace of the bad one.
    await tracker.write_batch(RUN, a_batch(key, metadata={"ok": 1}))
    await tracker.write_batch(RUN, a_batch(batch_key(), metadata={"later": 2}))
    assert await tracker.metadata(RUN) == {"ok": 1, "later": 2}


async def test_artifact_metadata_and_metric_steps_json_cannot_hold(tmp_path: Path) -> None:
    tracker = AsyncFsspecTracker(fsspec.filesystem("file"), str(tmp_path / "store"))
    art = TrackerArtifact("model", "/m", cycle())
    with pytest.raises(RecordError, match=f"artifacts/{encode_run_id('model')}"):
        await tracker.write_batch(RUN, a_batch(artifacts={"model": art}))
    huge = TrackerMetric("loss", 1.0, 10**5000, 1.7e9)
    with pytest.raises(RecordError, match=r"metric 'loss' in .*/metrics"):
        await tracker.write_batch(RUN, a_batch(metadata={}, metrics=[huge]))


async def test_lone_surrogates(tmp_path: Path) -> None:
    tracker = AsyncFsspecTracker(fsspec.filesystem("file"), str(tmp_path / "store"))
    # JSON escapes them: a metadata value round-trips.
    await tracker.write_batch(RUN, a_batch(metadata={"s": "a\udc80b"}))
    assert await tracker.metadata(RUN) == {"s": "a\udc80b"}
    # A name with no UTF-8 form cannot name a file: about that record.
    bad = "model\ud800"
    with pytest.raises(RecordError, match="artifact"):
        await tracker.write_batch(
            RUN, a_batch(metadata={}, artifacts={bad: TrackerArtifact(bad, "/m", None)})
        )
    with pytest.raises(RecordError, match="source"):
        await tracker.write_batch(
            RUN, a_batch(metadata={}, sources=[TrackerSource("parent\ud800", None)])
        )


# -- deterministic names ----------------------------------------------------------------------


async def test_batch_key_names_the_files_and_a_replay_overwrites(tmp_path: Path) -> None:
    store = tmp_path / "store"
    run_dir = store / encode_run_id(RUN)
    first = AsyncFsspecTracker(fsspec.filesystem("file"), str(store))
    k1, k2 = batch_key(1), batch_key(2)
    assert k1 < k2
    await first.write_batch(RUN, a_batch(k1, metadata={"a": 1}))
    b2 = a_batch(k2, metadata={"b": 2}, metrics=[TrackerMetric("loss", 0.5, 7, 1.7e9)])
    await first.write_batch(RUN, b2)
    metadata_files = sorted(p.name for p in (run_dir / "metadata").iterdir())
    metric_files = sorted(p.name for p in (run_dir / "metrics").iterdir())
    # One file per key, named by the batch's key, its position, a digest of the key.
    assert [f.rsplit("-", 2)[0] for f in metadata_files] == [k1, k2]
    assert [f.split("-")[:3] for f in metric_files] == [k1.split("-"), k2.split("-")]
    assert all(f.endswith(".parquet") for f in metric_files)

    # The process crashed before the ack of k2: another process replays k2 from the
    # write-ahead log. Its files are overwritten, not duplicated.
    replay = AsyncFsspecTracker(fsspec.filesystem("file"), str(store))
    b2_again = a_batch(k2, metadata={"b": 2}, metrics=[TrackerMetric("loss", 0.5, 7, 1.7e9)])
    await replay.write_batch(RUN, b2_again)
    assert sorted(p.name for p in (run_dir / "metadata").iterdir()) == metadata_files
    assert sorted(p.name for p in (run_dir / "metrics").iterdir()) == metric_files
    content = json.loads((run_dir / "metadata" / metadata_files[1]).read_text())
    assert content == {"metadata": {"b": 2}}
    assert await replay.metadata(RUN) == {"a": 1, "b": 2}
    assert len((await replay.metrics(RUN))["loss"]) == 6


async def test_parts_of_a_split_batch_do_not_overwrite_each_other(tmp_path: Path) -> None:
    # The lane splits a batch to find a record the store refused; the parts keep the key.
    tracker = AsyncFsspecTracker(fsspec.filesystem("file"), str(tmp_path / "store"))
    key = batch_key()
    left = [TrackerMetric("loss", 1.0, 0, 1.7e9)]
    right = [TrackerMetric("loss", 2.0, 1, 1.7e9 + 1)]
    await tracker.write_batch(RUN, a_batch(key, metadata={"a": 1}, metrics=left))
    await tracker.write_batch(RUN, a_batch(key, metadata={"b": 2}, metrics=right))
    assert [p.value for p in (await tracker.metrics(RUN))["loss"]] == [1.0, 2.0]
    assert await tracker.metadata(RUN) == {"a": 1, "b": 2}


async def test_without_a_key_names_are_chosen_once_per_batch(tmp_path: Path) -> None:
    tracker = AsyncFsspecTracker(fsspec.filesystem("file"), str(tmp_path / "store"))
    batch = a_batch()
    await tracker.write_batch(RUN, batch)
    assert set(batch.names) == {"metadata", "metrics"}
    batch.done.clear()  # a retry of the whole batch: the same names, overwritten
    await tracker.write_batch(RUN, batch)
    run_dir = tmp_path / "store" / encode_run_id(RUN)
    assert [p.name for p in (run_dir / "metrics").iterdir()] == [batch.names["metrics"]]


def test_for_lane_keeps_the_key() -> None:
    batch = a_batch("k-1")
    assert batch.for_lane().key == "k-1"


# -- the mapping, case by case (real exception objects of botocore, s3fs, aiohttp) -----------


def s3_client_error(code: str, status: int) -> BaseException:
    """What s3fs raises for an S3 error answer: its translation, caused by botocore's."""
    botocore_exceptions = pytest.importorskip("botocore.exceptions")
    s3fs_errors = pytest.importorskip("s3fs.errors")
    error = botocore_exceptions.ClientError(
        {"Error": {"Code": code, "Message": f"{code} says the server"},
         "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutObject",
    )  # fmt: skip
    translated: BaseException = s3fs_errors.translate_boto_error(error)
    return translated


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("SlowDown", 503, TransientBackendError),
        ("Throttling", 400, TransientBackendError),
        ("RequestTimeout", 400, TransientBackendError),
        ("ServiceUnavailable", 503, TransientBackendError),
        ("InternalError", 500, TransientBackendError),
        ("SomethingNew", 502, TransientBackendError),
        ("AccessDenied", 403, PermanentBackendError),
        ("NoSuchBucket", 404, PermanentBackendError),
        ("InvalidAccessKeyId", 403, PermanentBackendError),
        ("SignatureDoesNotMatch", 403, PermanentBackendError),
        ("SomethingElse", 400, PermanentBackendError),
        ("EntityTooLarge", 400, RecordError),
        ("KeyTooLongError", 400, RecordError),
    ],
)
def test_map_s3_error_codes(code: str, status: int, kind: type[BackendError]) -> None:
    mapped = map_error(s3_client_error(code, status), "write of b/k")
    assert type(mapped) is kind
    assert "write of b/k" in str(mapped) and code in str(mapped)


def test_map_connection_and_timeout_errors() -> None:
    botocore_exceptions = pytest.importorskip("botocore.exceptions")
    aiohttp = pytest.importorskip("aiohttp")
    transient = [
        botocore_exceptions.EndpointConnectionError(endpoint_url="http://x"),
        botocore_exceptions.ConnectTimeoutError(endpoint_url="http://x"),
        botocore_exceptions.ReadTimeoutError(endpoint_url="http://x"),
        botocore_exceptions.ConnectionClosedError(endpoint_url="http://x"),
        aiohttp.ServerDisconnectedError(),
        aiohttp.ClientPayloadError("cut"),
        ConnectionResetError(errno.ECONNRESET, "reset"),
        TimeoutError("slow"),
        OSError(errno.ENOENT, "gone", "/x/.tmp"),
        FileNotFoundError("/memory/path"),
    ]
    for exc in transient:
        assert isinstance(map_error(exc, "w"), TransientBackendError), exc


def test_map_unknown_errors_keep_the_records() -> None:
    botocore_exceptions = pytest.importorskip("botocore.exceptions")
    for exc in [
        ValueError("something odd"),
        KeyError("k"),
        OSError(errno.EINVAL, "invalid"),
        botocore_exceptions.NoCredentialsError(),
        PermissionError("no errno"),
    ]:
        mapped = map_error(exc, "w")
        assert type(mapped) is PermanentBackendError, exc  # never a RecordError


def test_map_exception_groups_into_one_error() -> None:
    transient = OSError(errno.ECONNRESET, "reset")
    store = OSError(errno.ENOSPC, "full")
    record = OSError(errno.ENAMETOOLONG, "long")
    group = ExceptionGroup("flush", [store, ExceptionGroup("inner", [transient])])
    assert type(map_error(group, "w")) is TransientBackendError
    assert type(map_error(ExceptionGroup("f", [store, record]), "w")) is PermanentBackendError
    both = map_error(ExceptionGroup("f", [record, record]), "w")
    assert type(both) is RecordError and both.refused is None
    mapped = map_error(BaseExceptionGroup("f", [RecordError("a", 1), RecordError("b", 2)]), "w")
    assert isinstance(mapped, RecordError) and mapped.refused == 3
    already = TransientBackendError("mine")
    assert map_error(already, "w") is already
