"""The run index of the fsspec store (``backend/fsspec/index.py``) on local disk: a listing
through the index says what a listing of every summary file says, on a store of every kind of
run; compaction races, crashes between its steps, deletions, claims, replays after a
compaction, stores of the previous version, a corrupt checkpoint and a read-only store. Time
is injected (``now``) where a status depends on it; no sleeps. Request counts: see
test_index_s3.py."""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from async_tracker import AppRun
from async_tracker.backend.fsspec import (
    INDEX_PREFIX,
    LEGACY_SUMMARY_PREFIX,
    SUMMARY_PREFIX,
    AsyncFsspecTracker,
    SummaryFileCache,
    encode_run_id,
    index,
    summary_path,
)
from async_tracker.backend.fsspec.indexcheckpoint import Checkpoint
from async_tracker.backend.fsspec.reader import FsspecReader
from async_tracker.backend.fsspec.summaries import run_summaries
from async_tracker.errors import BackendUnavailableError
from async_tracker.init_run import open_store
from async_tracker.records import Batch, TrackerMetric
from async_tracker.runtime.process import runtime
from async_tracker.settings import CRASHED_AFTER_BEATS
from async_tracker.store.runs import select
from async_tracker.store.summary import RunSummary

# The readers' compaction alone: writers' folds (indexfold.py) would compact first.
pytestmark = pytest.mark.usefixtures("no_writer_folds")

TOKEN = "1795000000000000000xabc123"
OTHER = "1795000000000000001xdef456"


def backend(root: Path | str) -> AsyncFsspecTracker:
    store = open_store(str(root))
    assert isinstance(store, AsyncFsspecTracker)
    return store


def listing(
    root: Path | str, now: float | None = None, cache: SummaryFileCache | None = None
) -> dict[str, RunSummary]:
    store = backend(root)
    found = runtime().loop.call(functools.partial(store.run_summaries, now, cache=cache))
    assert len(found) == len({r.run_id for r in found}), "a run listed twice"
    return {r.run_id: r for r in found}


def index_files(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(INDEX_PREFIX))


def checkpoints(root: Path) -> list[str]:
    return [n for n in index_files(root) if n.startswith(index.CHECKPOINT_PREFIX)]


def keyed_batch(
    token: str, seq: int, steps: range, end: str | None = None, **metadata: object
) -> Batch:
    """A batch as a pipeline cuts it: its key names its writer and number."""
    ns = time.time_ns()
    key = f"{ns:019d}-{token}-{seq:012d}"
    points = [TrackerMetric("loss", float(s), s, 1000.0 + s) for s in steps]
    return Batch(
        seq, metadata=dict(metadata), metadata_ns={k: ns for k in metadata}, metrics=points,
        records=len(points) + len(metadata), first=seq - len(points) + 1, key=key,
        end=end, end_time=1000.0 + steps.stop if end else 0.0,  # type: ignore[arg-type]
    )  # fmt: skip


def write(root: Path | str, run_id: str, *batches: Batch) -> None:
    store = backend(root)
    for batch in batches:
        runtime().loop.call(store.write_batch, run_id, batch)


def finished(root: Path | str, run_id: str, points: int = 10, token: str = TOKEN) -> None:
    write(root, run_id, keyed_batch(token, points, range(points), "finished", lr=0.1))


def comparable(params: Any) -> dict[str, object]:
    """Params to compare: NaN (never equal to itself) as text."""
    return {k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in params.items()}


def same(a: dict[str, RunSummary], b: dict[str, RunSummary]) -> None:
    """Two listings alike, run by run."""
    assert a.keys() == b.keys()
    for run_id in a:
        x, y = a[run_id], b[run_id]
        assert comparable(x.params) == comparable(y.params), run_id
        assert dict(x.metrics) == dict(y.metrics), run_id
        assert (x.status, x.start, x.end, x.heartbeat, x.tags, x.note) == (
            y.status, y.start, y.end, y.heartbeat, y.tags, y.note,
        ), run_id  # fmt: skip


# -- what a listing says ------------------------------------------------------------------------

NOW = 1_000_100.0


def mixed_store(root: Path) -> dict[str, str]:
    """A store holding a run of each kind; the status each has at NOW."""
    store = backend(root)
    loop = runtime().loop
    finished(root, "mix/finished")
    write(root, "mix/failed", keyed_batch(TOKEN, 5, range(5), "failed", lr=0.2))
    # Two writers of one run, one of which killed it: the run is killed.
    write(root, "mix/ranks", keyed_batch(TOKEN, 5, range(5), lr=0.3))
    write(root, "mix/ranks", keyed_batch(OTHER, 5, range(5, 10), "killed", rank=1))
    # Beats (interval 10 s) at NOW - 1000: crashed at NOW; one beat at NOW: running.
    for run_id in ("mix/crashed", "mix/live"):
        write(root, run_id, keyed_batch(TOKEN, 5, range(5), lr=0.4))
        loop.call(store.heartbeat, run_id, 10.0)
    beats = {"mix/crashed": NOW - 1000, "mix/live": NOW - 1}
    for run_id, when in beats.items():
        for path in (root / encode_run_id(run_id) / "heartbeat").iterdir():
            path.write_text(json.dumps({"time": when, "interval_s": 10.0}))
        summary = Path(summary_path(str(root), run_id, TOKEN))
        content = json.loads(summary.read_text())
        content["beat"] = [when, 10.0]
        summary.write_text(json.dumps(content))
    # Written by torchx: files and no summary (a metadata file named its way).
    meta = root / encode_run_id("mix/torchx") / "metadata"
    meta.mkdir(parents=True)
    (meta / "1700000000").write_text(json.dumps({"metadata": {"kind": "torchx"}}))
    # Written by the previous version: its summary at the root.
    finished(root, "mix/legacy", points=7)
    for p in root.glob(Path(summary_path(str(root), "mix/legacy", "*")).name):
        p.rename(root / (LEGACY_SUMMARY_PREFIX + p.name.removeprefix(SUMMARY_PREFIX)))
    # Claimed, nothing written yet.
    assert loop.call(store.claim_run, "mix/claimed", {"host": "here"})
    # NaN and infinities in params (what a run may hold).
    write(root, "mix/nan", keyed_batch(TOKEN, 3, range(3), "finished", lr=math.nan, top=math.inf))
    return {
        "mix/finished": "finished", "mix/failed": "failed", "mix/ranks": "killed",
        "mix/crashed": "crashed", "mix/live": "running", "mix/torchx": "running",
        "mix/legacy": "finished", "mix/claimed": "running", "mix/nan": "finished",
    }  # fmt: skip


def test_the_index_lists_what_the_files_say(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    statuses = mixed_store(root)
    # The first listing reads every summary (and the root: runs that no summary names),
    # then compacts the index; the next ones read its checkpoint.
    first = listing(root, NOW)
    assert {r: s.status for r, s in first.items()} == statuses
    assert checkpoints(root) == [f"{index.CHECKPOINT_PREFIX}{1:020d}.json"]
    # What each run's files say, read in full.
    store = backend(root)
    for run_id, summary in first.items():
        metrics = runtime().loop.call(store.metrics, run_id)
        assert {n: len(p) for n, p in metrics.items()} == {
            n: m.count for n, m in summary.metrics.items()
        }, run_id
        meta = runtime().loop.call(store.metadata, run_id)
        assert comparable(summary.params) == comparable(meta), run_id
    assert first["mix/ranks"].params == {"lr": 0.3, "rank": 1}
    assert first["mix/ranks"].metrics["loss"].count == 10
    assert math.isnan(first["mix/nan"].params["lr"])  # type: ignore[arg-type]
    assert first["mix/nan"].params["top"] == math.inf
    assert first["mix/claimed"].start is None and not first["mix/claimed"].metrics
    # The same from the checkpoint, with or without a cache, listed again and again.
    cache = SummaryFileCache()
    for _ in range(3):
        same(listing(root, NOW), first)
        same(listing(root, NOW, cache), first)
    # The previous version's summary was folded in, then removed (its writer had ended).
    assert not list(root.glob(f"{LEGACY_SUMMARY_PREFIX}*"))
    # A later listing: what became of the live run (its beat is old by then).
    later = listing(root, NOW + 1000)
    assert later["mix/live"].status == "crashed" and later["mix/crashed"].status == "crashed"
    # An earlier one (a crash judged at NOW does not hold before its beats were old).
    earlier = listing(root, NOW - 990)
    assert earlier["mix/crashed"].status == "running"


def test_summaries_of_ended_writers_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    for i in range(3):
        finished(root, f"done/{i}")
    write(root, "live/0", keyed_batch(TOKEN, 5, range(5), lr=0.5))
    before = listing(root)
    # The ended writers' summaries are in the checkpoint; the live writer's file stays.
    assert index_files(root) == sorted(
        [checkpoints(root)[0], Path(summary_path(str(root), "live/0", TOKEN)).name]
    )
    write(root, "live/0", keyed_batch(TOKEN, 10, range(5, 10), "finished"))
    after = listing(root)
    assert after["live/0"].metrics["loss"].count == 10 and after["live/0"].status == "finished"
    same({k: v for k, v in after.items() if k != "live/0"},
         {k: v for k, v in before.items() if k != "live/0"})  # fmt: skip


# -- compaction ---------------------------------------------------------------------------------


def test_of_two_compactors_at_once_one_checkpoint_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "runs"
    for i in range(4):
        finished(root, f"r/{i}", points=i + 1)
    real_create = index._create
    raced: list[int | None] = []

    async def create_after_another(storage: Any, path: str, data: bytes) -> bool:
        if not raced:
            # Another reader lists the store now, between this compactor's listing and
            # its checkpoint: it compacts too, and creates the same checkpoint first.
            raced.append(None)
            other = backend(root)
            found = await run_summaries(other._reader)
            raced.append(len(found))
        return await real_create(storage, path, data)

    monkeypatch.setattr(index, "_create", create_after_another)
    outcome: list[int | None] = []
    real_compact = index.compact

    async def compact(*args: Any, **kwargs: Any) -> int | None:
        n = await real_compact(*args, **kwargs)
        outcome.append(n)
        return n

    monkeypatch.setattr(index, "compact", compact)
    found = listing(root)
    # The inner reader's compaction won checkpoint 1; this one's create found it there.
    assert raced == [None, 4] and outcome == [1, None]
    assert checkpoints(root) == [f"{index.CHECKPOINT_PREFIX}{1:020d}.json"]
    monkeypatch.undo()
    again = listing(root)
    same(again, found)
    assert {r: s.metrics["loss"].count for r, s in again.items()} == {
        f"r/{i}": i + 1 for i in range(4)
    }


@pytest.mark.parametrize("removed", [0, 2])
def test_a_crash_between_the_checkpoint_and_its_removals_loses_and_doubles_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, removed: int
) -> None:
    root = tmp_path / "runs"
    for i in range(4):
        finished(root, f"r/{i}", points=i + 1)
    real_remove = index._remove

    async def crash(storage: Any, paths: Any) -> None:
        # The compactor dies after its checkpoint is there, having removed ``removed`` of
        # the files it folded (a crash mid-way).
        await real_remove(storage, list(paths)[:removed])
        raise BackendUnavailableError("the compactor died")

    monkeypatch.setattr(index, "_remove", crash)
    first = listing(root)
    monkeypatch.undo()
    assert len(checkpoints(root)) == 1
    left = [n for n in index_files(root) if n.startswith(SUMMARY_PREFIX)]
    assert len(left) == 4 - removed  # folded in the checkpoint, and still there
    # Each run once, each point once: the checkpoint's entry and the file are one writer's.
    for _ in range(2):
        again = listing(root)
        same(again, first)
        assert {r: s.metrics["loss"].count for r, s in again.items()} == {
            f"r/{i}": i + 1 for i in range(4)
        }
    # The next compaction removes what the crash left.
    monkeypatch.setattr(index, "COMPACT_AFTER_FILES", 1)
    finished(root, "r/4", points=5)
    assert listing(root)["r/4"].metrics["loss"].count == 5
    assert index_files(root) == checkpoints(root) and len(checkpoints(root)) == 2


def test_a_summary_rewritten_while_its_compaction_runs_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay rewrites an ended writer's summary after the compactor read it: the
    compactor removes only files at the version it folded, so the rewrite is kept."""
    root = tmp_path / "runs"
    write(root, "r/0", keyed_batch(TOKEN, 9, range(10), "finished"))
    real_create = index._create

    async def create_then_replay(storage: Any, path: str, data: bytes) -> bool:
        created = await real_create(storage, path, data)
        # Between the checkpoint and the removals: `async-tracker sync` writes a batch of
        # that writer that had not reached the store.
        await backend(root).write_batch("r/0", keyed_batch(TOKEN, 19, range(10, 20)))
        return created

    monkeypatch.setattr(index, "_create", create_then_replay)
    assert listing(root)["r/0"].metrics["loss"].count == 10  # as listed before the replay
    monkeypatch.undo()
    assert Path(summary_path(str(root), "r/0", TOKEN)).exists()
    assert listing(root)["r/0"].metrics["loss"].count == 20


def test_a_listing_that_meets_a_compaction_lists_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "runs"
    for i in range(5):
        finished(root, f"r/{i}")
    real_read = index._read
    calls: list[int] = []

    async def read_after_a_compaction(reader: Any, names: Any, *args: Any) -> Any:
        if not calls and names and str(names[0]).startswith(SUMMARY_PREFIX):
            # Another reader compacts between this listing and its reads: the summaries
            # this one listed are gone, folded into a checkpoint it did not list.
            calls.append(0)
            calls[0] = len(await run_summaries(backend(root)._reader))
        return await real_read(reader, names, *args)

    monkeypatch.setattr(index, "_read", read_after_a_compaction)
    found = listing(root)
    assert calls == [5] and len(found) == 5
    assert all(r.metrics["loss"].count == 10 for r in found.values())


def test_short_lived_writers_leave_a_bounded_index(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    ids = ["short/a", "short/b", "short/c"]
    rounds = 12
    for cycle in range(rounds):
        for run_id in ids:  # each cycle a new process's writer: a summary file of its own
            with AppRun(run_id, [open_store(str(root))], spool_dir=str(tmp_path / "spool"),
                        heartbeat_s=0) as run:  # fmt: skip
                run.log_metric("loss", float(cycle), step=cycle)
        if cycle % 4 == 3:
            found = listing(root)
            assert {r: s.metrics["loss"].count for r, s in found.items()} == {
                r: cycle + 1 for r in ids
            }
            # At most two checkpoints, and fewer summaries of ended writers than make a
            # compaction: 36 writers came and went.
            assert len(checkpoints(root)) <= 2
            assert len(index_files(root)) < 2 + index.COMPACT_AFTER_FILES
    assert len(checkpoints(root)) == 2  # compacted more than once


# -- the writers' side --------------------------------------------------------------------------


def test_a_deleted_run_leaves_the_list_at_once_and_the_index_at_its_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "runs"
    for i in range(3):
        finished(root, f"r/{i}")
    write(root, "new/0", keyed_batch(TOKEN, 5, range(5)))  # not compacted yet: a file
    listing(root)
    finished(root, "new/1")  # not compacted either
    store = backend(root)
    for run_id in ("r/1", "new/0", "new/1"):
        assert runtime().loop.call(store.delete_run, run_id)
    found = listing(root)
    assert set(found) == {"r/0", "r/2"}
    tombstones = [n for n in index_files(root) if n.startswith(index.REMOVED_PREFIX)]
    assert len(tombstones) == 3
    assert not [n for n in index_files(root) if n.startswith(SUMMARY_PREFIX)]
    # Compacted: the tombstones folded in, then removed; the runs stay gone.
    monkeypatch.setattr(index, "COMPACT_AFTER_FILES", 1)
    same(listing(root), found)
    assert index_files(root) == checkpoints(root)
    monkeypatch.undo()
    same(listing(root), found)
    # The same id again: a new run, with its own records alone.
    finished(root, "r/1", points=3, token=OTHER)
    assert listing(root)["r/1"].metrics["loss"].count == 3


def test_a_crash_in_delete_run_after_its_tombstone_leaves_the_run_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """delete_run dies after its tombstone, before removing the run's summaries: they stay,
    at the versions the tombstone names, void; the next compaction removes them."""
    root = tmp_path / "runs"
    finished(root, "r/0")
    write(root, "r/1", keyed_batch(TOKEN, 5, range(5)))
    listing(root)
    real_remove = index._remove

    async def keep_summaries(storage: Any, paths: Any) -> None:
        await real_remove(storage, [p for p in paths if SUMMARY_PREFIX not in p])

    monkeypatch.setattr(index, "_remove", keep_summaries)
    runtime().loop.call(backend(root).delete_run, "r/1")
    monkeypatch.undo()
    left = Path(summary_path(str(root), "r/1", TOKEN))
    assert left.exists()
    assert set(listing(root)) == {"r/0"}
    monkeypatch.setattr(index, "COMPACT_AFTER_FILES", 1)
    assert set(listing(root)) == {"r/0"}
    assert not left.exists() and index_files(root) == checkpoints(root)


def test_a_replay_after_a_compaction_continues_from_the_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    first = keyed_batch(TOKEN, 9, range(10))
    second = keyed_batch(TOKEN, 19, range(10, 20), "finished")
    write(root, "r/0", first, second)
    assert listing(root)["r/0"].metrics["loss"].count == 20
    # Compacted: the ended writer's summary is in the checkpoint alone.
    assert not Path(summary_path(str(root), "r/0", TOKEN)).exists()
    # `async-tracker sync` replays the second batch from a spool (its ack was lost): another
    # process's writer, whose summary continues the checkpoint's (counted once, not from 0).
    write(root, "r/0", second.for_lane())
    found = listing(root)["r/0"]
    assert found.metrics["loss"].count == 20 and found.metrics["loss"].last_step == 19
    stored = json.loads(Path(summary_path(str(root), "r/0", TOKEN)).read_text())
    assert stored["prior"] is False  # no rebuild of the run's files


def test_a_claimed_run_is_listed_before_its_first_summary(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    finished(root, "r/0")
    listing(root)
    assert runtime().loop.call(backend(root).claim_run, "r/new", {"host": "here"})
    found = listing(root)
    assert found["r/new"].status == "running" and found["r/new"].start is None
    write(root, "r/new", keyed_batch(TOKEN, 5, range(5), "finished"))
    assert listing(root)["r/new"].metrics["loss"].count == 5


# -- stores as they are -----------------------------------------------------------------------


def test_a_store_of_the_previous_version_is_folded_in_once(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    for i in range(3):
        finished(root, f"r/{i}", points=i + 1)
    write(root, "r/live", keyed_batch(TOKEN, 5, range(5)))
    for p in root.glob(f"{SUMMARY_PREFIX}*"):  # as the previous version named them
        p.rename(root / (LEGACY_SUMMARY_PREFIX + p.name.removeprefix(SUMMARY_PREFIX)))
    found = listing(root)
    assert {r: s.metrics["loss"].count for r, s in found.items()} == {
        "r/0": 1, "r/1": 2, "r/2": 3, "r/live": 5,
    }  # fmt: skip
    # The ended writers' files went; the live one's stays where its writer writes it.
    assert [p.name for p in root.glob(f"{LEGACY_SUMMARY_PREFIX}*")] == [
        LEGACY_SUMMARY_PREFIX + Path(summary_path(str(root), "r/live", TOKEN)).name.removeprefix(
            SUMMARY_PREFIX
        )
    ]
    same(listing(root), found)
    # Its writer, of this version now, continues it in the index.
    write(root, "r/live", keyed_batch(TOKEN, 10, range(5, 10), "finished"))
    assert listing(root)["r/live"].metrics["loss"].count == 10


def test_a_corrupt_newest_checkpoint_is_passed_over(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    for i in range(3):
        finished(root, f"r/{i}")
    found = listing(root)
    (root / f"{index.CHECKPOINT_PREFIX}{2:020d}.json").write_bytes(b'{"v": 1, "n": 2')
    same(listing(root), found)
    # The next compaction takes the next number.
    for i in range(3, 3 + index.COMPACT_AFTER_FILES):
        finished(root, f"r/{i}")
    assert len(listing(root)) == 3 + index.COMPACT_AFTER_FILES
    assert checkpoints(root)[-1] == f"{index.CHECKPOINT_PREFIX}{3:020d}.json"


class ReadOnlyMemory(MemoryFileSystem):  # type: ignore[misc]  # fsspec is untyped
    """The memory filesystem's files (shared by its instances), refusing every write."""

    def pipe_file(self, *args: Any, **kwargs: Any) -> None:
        raise PermissionError("read-only")

    def rm_file(self, *args: Any, **kwargs: Any) -> None:
        raise PermissionError("read-only")

    def mv(self, *args: Any, **kwargs: Any) -> None:
        raise PermissionError("read-only")


@pytest.fixture
def memory_root() -> Iterator[str]:
    root = f"/index-{time.time_ns()}"
    yield root
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


def test_a_read_only_store_is_listed_and_never_compacted(memory_root: str) -> None:
    writable = AsyncFsspecTracker(fsspec.filesystem("memory"), memory_root)
    for i in range(3):
        runtime().loop.call(
            writable.write_batch, f"r/{i}", keyed_batch(TOKEN, i + 1, range(i + 1), "finished")
        )
    readonly = AsyncFsspecTracker(ReadOnlyMemory(skip_instance_cache=True), memory_root)
    for _ in range(2):
        found = {r.run_id: r for r in runtime().loop.call(readonly.run_summaries)}
        assert {r: s.metrics["loss"].count for r, s in found.items()} == {
            "r/0": 1, "r/1": 2, "r/2": 3,
        }  # fmt: skip
    fs = fsspec.filesystem("memory")
    assert not [p for p in fs.ls(memory_root, detail=False) if "checkpoint" in p]
    # The same store writable: compacted at its first listing.
    found = {r.run_id: r for r in runtime().loop.call(writable.run_summaries)}
    assert len(found) == 3
    assert [p for p in fs.ls(memory_root, detail=False) if "checkpoint" in p]


def test_a_cache_reads_an_unchanged_index_once(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    for i in range(3):
        finished(root, f"r/{i}")
    write(root, "live/0", keyed_batch(TOKEN, 5, range(5)))
    cache = SummaryFileCache()
    first = listing(root, cache=cache)
    assert cache.reads == 4  # the summaries (no checkpoint yet); the compaction's is kept
    same(listing(root, cache=cache), first)
    assert cache.reads == 4  # nothing read: its own checkpoint, the live file folded in
    write(root, "live/0", keyed_batch(TOKEN, 10, range(5, 10)))
    assert listing(root, cache=cache)["live/0"].metrics["loss"].count == 10
    assert cache.reads == 5  # the one summary rewritten
    # Another reader's compaction: its checkpoint read once, then kept.
    for i in range(3, 3 + index.COMPACT_AFTER_FILES):
        finished(root, f"r/{i}")
    listing(root)
    listing(root, cache=cache)
    reads = cache.reads
    listing(root, cache=cache)
    assert cache.reads == reads


def test_a_crash_once_compacted_is_not_judged_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose every beat is old is crashed from its status and heartbeat files; once a
    checkpoint holds it crashed, later listings take that (no status read)."""
    root = tmp_path / "runs"
    store = backend(root)
    write(root, "r/0", keyed_batch(TOKEN, 5, range(5)))
    runtime().loop.call(store.heartbeat, "r/0", 1.0)
    assert listing(root)["r/0"].status == "running"  # and the first checkpoint
    later = time.time() + 10 * CRASHED_AFTER_BEATS
    judged: list[str] = []
    real = FsspecReader.run_status

    async def run_status(self: FsspecReader, run_id: str, *args: Any, **kwargs: Any) -> Any:
        judged.append(run_id)
        return await real(self, run_id, *args, **kwargs)

    monkeypatch.setattr(FsspecReader, "run_status", run_status)
    assert listing(root, later)["r/0"].status == "crashed"
    assert judged == ["r/0"]
    # A compaction, called for by other runs, keeps it crashed as judged at ``later``.
    for i in range(index.COMPACT_AFTER_FILES):
        finished(root, f"done/{i}")
    assert listing(root, later)["r/0"].status == "crashed"
    assert len(checkpoints(root)) == 2
    judged.clear()
    for _ in range(2):
        crashed = listing(root, later + 1)["r/0"]
        assert crashed.status == "crashed" and crashed.metrics["loss"].count == 5
    assert judged == []
    # Before ``later``, the checkpoint's judgement does not hold: judged again.
    listing(root, later - 10 * CRASHED_AFTER_BEATS)
    assert judged == ["r/0"]


# -- the newest runs (list jobs's default) ------------------------------------------------------


def test_the_newest_runs_are_the_lists_first_and_only_theirs_are_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``newest_runs`` orders the runs by the starts that the checkpoint's rows keep and
    makes the summaries of the runs it returns alone (a list of 100,000 runs that shows 20
    makes 20); it gives what ``select`` of every summary gives: runs of equal start in the
    list's order, runs with no start last by id, runs the checkpoint does not give as they
    are (live, claimed, torchx's) among them."""
    root = tmp_path / "runs"
    mixed_store(root)  # most start at 1000.0 (see keyed_batch): ties
    for k in range(1, 4):  # and some later
        write(root, f"later/{k}", keyed_batch(TOKEN, 3, range(10 * k, 10 * k + 3), "finished"))
    listing(root, NOW)  # the first listing compacts the index: a checkpoint
    loop = runtime().loop
    every = loop.call(backend(root).reader().run_summaries)
    assert any(r.start is None for r in every) and len({r.start for r in every}) < len(every)
    made: list[str] = []
    real = Checkpoint.summary

    def summary(self: Checkpoint, run_id: str) -> RunSummary:
        made.append(run_id)
        return real(self, run_id)

    monkeypatch.setattr(Checkpoint, "summary", summary)
    some = {r.run_id for r in every[::2]}
    for run_ids in (None, some):
        runs = every if run_ids is None else [r for r in every if r.run_id in run_ids]
        for limit in range(len(runs) + 2):
            reader = backend(root).reader()  # its own cache: no summary made before
            made.clear()
            shown, left_out = loop.call(reader.newest_runs, limit, run_ids)
            want, want_left_out = select(runs, limit=limit)
            assert [r.run_id for r in shown] == [r.run_id for r in want], limit
            same({r.run_id: r for r in shown}, {r.run_id: r for r in want})
            assert left_out == want_left_out, limit
            assert len(made) <= len(shown), (limit, made)
            if limit == 0:  # all: most come from the checkpoint's rows
                assert len(made) > len(runs) // 2, made
            # Listed again by the same reader (its checkpoint kept, decoded): the same.
            again, _ = loop.call(reader.newest_runs, limit, run_ids)
            assert [r.run_id for r in again] == [r.run_id for r in want], limit
