"""A run's tags and note: ``AppRun.add_tags``, ``remove_tags``, ``set_note``, ``tags()``,
``note()``, ``init(tags=, note=)``, on the memory and local fsspec backends, with many
processes tagging one run; and the reserved ``async_tracker.*`` metadata keys that carry
them (refused to users, hidden from ``metadata()``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

import async_tracker
from async_tracker import AppRun
from async_tracker.backend.fsspec import FsspecTracker
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.init_run import open_store
from async_tracker.tags import (
    NOTE_KEY,
    TAG_KEY_PREFIX,
    check_tag,
    split_metadata,
    tag_metadata,
)
from tests.core.helpers import Child


def test_tag_names_every_backend_stores_and_those_refused() -> None:
    for good in ("baseline", "v1.2", "lr-sweep", "_wip", "3rd", "ablation_2", "übung", "a" * 100):
        assert check_tag(good) == good
    for bad in ("", "two words", "a/b", "a:b", "-x", "+x", ".x", "..", "tab\there", "nl\n",
                "nul\x00", "a" * 101, "😀"):  # fmt: skip
        with pytest.raises(ValueError) as info:
            check_tag(bad)
        if bad:
            assert repr(bad[:40]) in str(info.value)
    with pytest.raises(TypeError, match="got int"):
        check_tag(3)


def test_tag_metadata_and_split_metadata() -> None:
    md = tag_metadata(["a", "b"], ["c"])
    assert md == {
        TAG_KEY_PREFIX + "a": True,
        TAG_KEY_PREFIX + "b": True,
        TAG_KEY_PREFIX + "c": False,
    }
    with pytest.raises(ValueError, match="'a' is both added and removed"):
        tag_metadata(["a"], ["a"])
    params, tags, note = split_metadata(
        {"lr": 0.1, **md, NOTE_KEY: "the note", "async_tracker.future": 1, "z": None}
    )
    assert params == {"lr": 0.1, "z": None}
    assert tags == {"a", "b"} and note == "the note"
    assert split_metadata({}) == ({}, frozenset(), "")


@pytest.fixture(params=["memory", "fsspec"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> object:
    if request.param == "memory":
        return InMemoryTracker()
    return FsspecTracker(LocalFileSystem(), str(tmp_path / "runs"))


def test_tags_and_the_note_round_trip(backend: object, tmp_path: Path) -> None:
    with AppRun("r", [backend], spool_dir=str(tmp_path / "spool")) as run:  # type: ignore[list-item]
        run.add_metadata(lr=0.1)
        run.add_tags("baseline", "v2", "draft")
        run.remove_tags("draft", "never-there")
        run.set_note("first try")
        assert run.tags() == {"baseline", "v2"}
        assert run.note() == "first try"
        run.remove_tags("baseline")  # a removal after an add, in another flush
        run.add_tags("v2")  # already there: stays
        run.set_note("second try")
    reader = AppRun("r", [backend], spool_dir=str(tmp_path / "spool"))  # type: ignore[list-item]
    assert reader.tags() == {"v2"}
    assert reader.note() == "second try"
    # metadata() shows the user's own keys only.
    assert reader.metadata() == {"lr": 0.1}
    # A note can be cleared; a tag removed can come back.
    with AppRun("r", [backend], spool_dir=str(tmp_path / "spool")) as run:  # type: ignore[list-item]
        run.set_note("")
        run.add_tags("baseline")
    assert reader.note() == "" and reader.tags() == {"v2", "baseline"}


def test_the_async_reads(tmp_path: Path) -> None:
    mem = InMemoryTracker()

    async def main() -> tuple[object, ...]:
        async with AppRun("r", [mem]) as run:
            run.add_metadata(x=1)
            run.add_tags("a")
            run.set_note("n")
            return await run.ametadata(), await run.atags(), await run.anote()

    assert asyncio.run(main()) == ({"x": 1}, {"a"}, "n")


def test_a_bad_tag_raises_naming_it_and_loses_nothing_else() -> None:
    mem = InMemoryTracker()
    with AppRun("r", [mem]) as run:
        run.add_tags("kept")
        with pytest.raises(ValueError, match="'no spaces please'"):
            run.add_tags("fine", "no spaces please")
        with pytest.raises(ValueError, match="'a/b'"):
            run.remove_tags("kept", "a/b")
        with pytest.raises(TypeError, match="got list"):
            run.add_tags(["in", "a", "list"])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="note must be a str"):
            run.set_note(None)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="lone surrogate"):
            run.set_note("bad \ud800")
        run.log_metric("loss", 1.0, step=0)
        assert run.tags() == {"kept"}  # nothing of the refused calls; the earlier tag stays
        assert run.note() == ""
    assert [p.value for p in mem.points("r", "loss")] == [1.0]
    assert mem.runs["r"].metadata == {TAG_KEY_PREFIX + "kept": True}


def test_users_cannot_write_the_reserved_keys(tmp_path: Path) -> None:
    store = FsspecTracker(LocalFileSystem(), str(tmp_path / "runs"))
    for run_backends in ([InMemoryTracker()], [store]):
        with AppRun("r", run_backends) as run:
            with pytest.raises(ValueError, match=r"'async_tracker\.tag\.x'.*reserved"):
                run.add_metadata(ok=1, **{"async_tracker.tag.x": True})
            with pytest.raises(ValueError, match=r"'async_tracker\.note'.*reserved"):
                run.add_metadata(**{"async_tracker.note": "sneaky"})
            run.add_metadata(**{"async_trackerX": 1, "my.async_tracker.tag.y": 2})
            assert run.tags() == frozenset() and run.note() == ""
            assert run.metadata() == {"async_trackerX": 1, "my.async_tracker.tag.y": 2}
    # The torchx face of a backend checks too.
    with pytest.raises(ValueError, match="reserved"):
        store.add_metadata("r", **{"async_tracker.run": 1})


def test_init_takes_tags_and_a_note(tmp_path: Path) -> None:
    store = str(tmp_path / "runs")
    with async_tracker.init("p", dir=store, tags=["baseline", "v1"], note="why") as run:
        run.log_metric("loss", 1.0)
    reader = AppRun(run.id, [open_store(store)])
    assert reader.tags() == {"baseline", "v1"} and reader.note() == "why"
    assert reader.metadata() == {"project": "p"}
    # Resumed with more tags: the old ones stay.
    with async_tracker.init("p", dir=store, id=run.id, tags=["resumed"]):
        pass
    assert reader.tags() == {"baseline", "v1", "resumed"} and reader.note() == "why"
    # None, as W&B takes it: no tags added.
    with async_tracker.init("p", dir=store, id=run.id, tags=None):
        pass
    assert reader.tags() == {"baseline", "v1", "resumed"}


def test_init_refuses_a_bad_tag_before_it_claims_a_run(tmp_path: Path) -> None:
    store = tmp_path / "runs"
    with pytest.raises(ValueError, match="'bad/tag'"):
        async_tracker.init("p", dir=store, tags=["good", "bad/tag"])
    with pytest.raises(TypeError, match="the str 'baseline'"):
        async_tracker.init("p", dir=store, tags="baseline")
    with pytest.raises(TypeError, match="note"):
        async_tracker.init("p", dir=store, note=3)  # type: ignore[arg-type]
    assert not store.exists() or not list(store.iterdir())


# A writer of run "shared" in a store (argv[1]) named argv[2]: for each line "round k" on
# stdin, adds its tag "<name>-k" and removes "<name>-(k-1)", flushes, then says "done k".
# The test releases both writers of a round at once, so their writes race.
WRITER = """
import sys
from async_tracker import AppRun
from async_tracker.init_run import open_store
root, name = sys.argv[1:3]
with AppRun("shared", [open_store(root)], spool_dir=sys.argv[3], heartbeat_s=0) as run:
    print("ready", flush=True)
    for line in sys.stdin:
        k = int(line.split()[1])
        run.add_tags(f"{name}-{k}")
        if k:
            run.remove_tags(f"{name}-{k - 1}")
        assert run.flush(60).ok
        print(f"done {k}", flush=True)
"""

ROUNDS = 12


def test_processes_tagging_one_run_at_once_keep_each_others_tags(tmp_path: Path) -> None:
    root = str(tmp_path / "runs")
    names = ["alpha", "beta", "gamma"]
    children = [Child(WRITER, root, n, str(tmp_path / f"spool-{n}")) for n in names]
    reader = AppRun("shared", [open_store(root)], spool_dir=str(tmp_path / "spool-reader"))
    try:
        for c in children:
            assert c.readline(60) == "ready"
        for k in range(ROUNDS):
            for c in children:  # every writer gets the round before any answers
                assert c.proc.stdin is not None
                c.proc.stdin.write(f"round {k}\n".encode())
                c.proc.stdin.flush()
            for c in children:
                assert c.readline(60) == f"done {k}"
            # After each round: every writer's latest tag, none of the earlier ones.
            assert reader.tags() == {f"{n}-{k}" for n in names}, k
        for c in children:
            assert c.proc.stdin is not None
            c.proc.stdin.close()
            assert c.wait(60) == 0
    finally:
        for c in children:
            c.close()
    assert reader.tags() == {f"{n}-{ROUNDS - 1}" for n in names}
