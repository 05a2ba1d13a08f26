"""How a run ends: the one rule (``runtime/ending.py``) that maps what ended a run to its
reason, the evidence each close passes it (a ``with`` block's exception, the exception a
``close()`` runs under, an integration's report), and where the exception's type and message
go: the reserved metadata key ``async_tracker.ending``, sealed with the end record, read back
as the run summary's ``ending``/``cause`` by ``Store``, ``list jobs`` and the dashboard.

The exits of whole processes (Ctrl-C, SIGTERM, an uncaught exception, a pool's workers) are
in test_endings_exit.py."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import async_tracker
from async_tracker import AppRun, Store
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.cli.main import main
from async_tracker.runtime.ending import (
    FINISHED,
    MAX_MESSAGE_CHARS,
    SIGTERM,
    Ending,
    decide,
    ending_of,
)
from async_tracker.tags import ENDING_KEY

MakeRun = Callable[..., AppRun]


class Stop(Exception):
    """An exception of the test's own: its type is named with its module."""


def raised(exc: BaseException) -> BaseException:
    """``exc`` as Python leaves it once raised and caught (its context set as it would be)."""
    try:
        raise exc
    except BaseException as caught:
        return caught


def exit_while_handling(handled: BaseException, code: object) -> BaseException:
    """The SystemExit of ``sys.exit(code)`` called in an ``except`` clause handling
    ``handled`` (what Lightning does on Ctrl-C)."""
    try:
        try:
            raise handled
        except BaseException:
            sys.exit(code)  # type: ignore[arg-type]
    except SystemExit as exc:
        return exc
    raise AssertionError("sys.exit returned")


# -- the rule ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (None, FINISHED),
        (SystemExit(0), FINISHED),
        (SystemExit(None), FINISHED),
        (SystemExit(), FINISHED),
        (GeneratorExit(), FINISHED),
        (KeyboardInterrupt(), Ending("killed", "KeyboardInterrupt", "")),
        (asyncio.CancelledError(), Ending("killed", "asyncio.exceptions.CancelledError", "")),
        (SystemExit(1), Ending("failed", "SystemExit", "1")),
        (SystemExit("no data"), Ending("failed", "SystemExit", "no data")),
        (ValueError("bad lr"), Ending("failed", "ValueError", "bad lr")),
        (Stop("early"), Ending("failed", f"{__name__}.Stop", "early")),
    ],
)  # fmt: skip
def test_what_ended_a_run_maps_to_one_ending(
    exc: BaseException | None, expected: Ending
) -> None:
    assert ending_of(exc) == expected


def test_an_exit_while_handling_an_exception_ends_as_that_exception() -> None:
    # Lightning's Ctrl-C: sys.exit(1) in its `except KeyboardInterrupt`.
    assert ending_of(exit_while_handling(KeyboardInterrupt(), 1)) == Ending(
        "killed", "KeyboardInterrupt", ""
    )
    # Ctrl-C caught and turned into a clean exit: the Ctrl-C still ended the run.
    assert ending_of(exit_while_handling(KeyboardInterrupt(), 0)).reason == "killed"
    # A script that exits 1 on an error: the error is what ended it.
    assert ending_of(exit_while_handling(ValueError("bad"), 1)) == Ending(
        "failed", "ValueError", "bad"
    )
    # ... and a clean exit after an error it handled is the program's choice.
    assert ending_of(exit_while_handling(ValueError("bad"), 0)) == FINISHED
    # `raise SystemExit(1) from None` says the context is not the cause.
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise SystemExit(1) from None
    except SystemExit as exc:
        assert ending_of(exc) == Ending("failed", "SystemExit", "1")


def test_a_message_is_kept_whole_up_to_its_bound_and_stored_whatever_it_holds() -> None:
    long = ending_of(ValueError("x" * (MAX_MESSAGE_CHARS * 3)))
    assert long.message is not None and len(long.message) == MAX_MESSAGE_CHARS
    assert long.message.endswith("...")
    # A lone surrogate (which no backend stores) is escaped, not a reason to fail the close.
    assert ending_of(ValueError("bad \udc80 byte")).message == "bad \\udc80 byte"

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    unprintable = ending_of(Unprintable())
    assert unprintable.reason == "failed" and unprintable.message is not None


def test_the_evidence_is_weighed_in_one_order() -> None:
    failed = Ending("failed", None, "the training raised")
    # A reason the caller names wins; the exception says more of it when it agrees.
    assert decide("finished", ValueError("x"), failed) == FINISHED
    assert decide("failed", ValueError("x")) == Ending("failed", "ValueError", "x")
    assert decide("killed", ValueError("x")) == Ending("killed")
    assert decide(SIGTERM, ValueError("x")) == SIGTERM  # an Ending is taken as it is
    # Then the exception at hand, then what a framework reported, then finished.
    assert decide(None, KeyboardInterrupt(), failed).reason == "killed"
    assert decide(None, None, failed) == failed
    assert decide() == FINISHED


def test_only_an_ending_that_did_not_finish_is_recorded() -> None:
    assert FINISHED.record() is None and FINISHED.metadata() == {}
    assert SIGTERM.record() == {"reason": "killed", "message": "SIGTERM"}
    assert SIGTERM.cause == "SIGTERM"
    ending = Ending("failed", "ValueError", "bad lr")
    assert ending.metadata() == {
        ENDING_KEY: {"reason": "failed", "type": "ValueError", "message": "bad lr"}
    }
    assert ending.cause == "ValueError: bad lr"
    assert Ending("killed", "KeyboardInterrupt", "").cause == "KeyboardInterrupt"


# -- AppRun: what each close passes the rule --------------------------------------------------


def test_ctrl_c_through_a_with_block_ends_the_run_killed(make_run: MakeRun) -> None:
    backend = InMemoryTracker(name="m")
    with pytest.raises(KeyboardInterrupt), make_run("r", [backend]) as run:
        run.log_metric("loss", 1.0, step=0)
        raise KeyboardInterrupt
    assert backend.ended("r") == "killed"
    assert backend.runs["r"].metadata[ENDING_KEY] == {
        "reason": "killed", "type": "KeyboardInterrupt", "message": ""
    }  # fmt: skip


def test_an_exception_through_a_with_block_records_its_type_and_message(
    make_run: MakeRun,
) -> None:
    backend = InMemoryTracker(name="m")
    with pytest.raises(Stop), make_run("r", [backend]) as run:
        run.log_metric("loss", 1.0, step=0)
        raise Stop("loss went to NaN")
    assert backend.ended("r") == "failed"
    assert backend.runs["r"].metadata[ENDING_KEY] == {
        "reason": "failed", "type": f"{__name__}.Stop", "message": "loss went to NaN"
    }  # fmt: skip
    # The user's params stay the user's: the reserved key is not one of them.
    assert ENDING_KEY not in run.metadata()


@pytest.mark.parametrize(("code", "reason"), [(0, "finished"), (None, "finished"), (3, "failed")])
def test_sys_exit_through_a_with_block_ends_as_its_code_says(
    make_run: MakeRun, code: int | None, reason: str
) -> None:
    backend = InMemoryTracker(name="m")
    with pytest.raises(SystemExit), make_run("r", [backend]) as run:
        run.log_metric("loss", 1.0, step=0)
        sys.exit(code)
    assert backend.ended("r") == reason
    stored = backend.runs["r"].metadata.get(ENDING_KEY)
    assert stored == (None if reason == "finished" else
                      {"reason": "failed", "type": "SystemExit", "message": "3"})  # fmt: skip


def test_a_cancelled_task_ends_its_async_with_block_killed(make_run: MakeRun) -> None:
    # asyncio.run() cancels its main task on Ctrl-C: the block sees CancelledError.
    backend = InMemoryTracker(name="m")

    async def job(started: asyncio.Event) -> None:
        async with make_run("r", [backend]) as run:
            run.log_metric("loss", 1.0, step=0)
            started.set()
            await asyncio.Event().wait()  # until cancelled

    async def main_task() -> None:
        started = asyncio.Event()
        task = asyncio.create_task(job(started))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main_task())
    assert backend.ended("r") == "killed"


def test_close_in_an_except_clause_ends_with_that_exception(make_run: MakeRun) -> None:
    backend = InMemoryTracker(name="m")
    run = make_run("r", [backend])
    run.log_metric("loss", 1.0, step=0)
    try:
        raise ValueError("bad batch")
    except ValueError:
        run.close(timeout=30)
    assert backend.ended("r") == "failed"
    assert backend.runs["r"].metadata[ENDING_KEY]["type"] == "ValueError"  # type: ignore[index]


def test_a_with_block_inside_an_except_clause_ends_as_the_block_did(
    make_run: MakeRun,
) -> None:
    # The block ended normally: the exception the enclosing clause handles is not its own.
    backend = InMemoryTracker(name="m")
    try:
        raise ValueError("the first attempt")
    except ValueError:
        with make_run("r", [backend]) as run:
            run.log_metric("loss", 1.0, step=0)
    assert backend.ended("r") == "finished"
    assert ENDING_KEY not in backend.runs["r"].metadata


def test_a_reported_ending_decides_a_close_that_nothing_else_decides(
    make_run: MakeRun,
) -> None:
    # What an integration does with a run that is not its own: the last training raised.
    reported = Ending("failed", "RuntimeError", "the training step failed")
    first, second, third = (InMemoryTracker(name=n) for n in ("a", "b", "c"))
    with make_run("a", [first]) as run:
        run.log_metric("loss", 1.0, step=0)
        run.report_ending(reported)
    assert first.ended("a") == "failed"
    assert first.runs["a"].metadata[ENDING_KEY]["message"] == "the training step failed"  # type: ignore[index]
    # A later training that ended well is the last word.
    with make_run("b", [second]) as run:
        run.log_metric("loss", 1.0, step=0)
        run.report_ending(reported)
        run.report_ending(FINISHED)
    assert second.ended("b") == "finished"
    # A reason named, or the exception at hand, outweighs it.
    with pytest.raises(KeyboardInterrupt), make_run("c", [third]) as run:
        run.log_metric("loss", 1.0, step=0)
        run.report_ending(reported)
        raise KeyboardInterrupt
    assert third.ended("c") == "killed"


def test_an_explicit_reason_is_recorded_with_the_exception_that_agrees(
    make_run: MakeRun,
) -> None:
    backend = InMemoryTracker(name="m")
    run = make_run("r", [backend])
    run.log_metric("loss", 1.0, step=0)
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        run.close(timeout=30, reason="killed")
    assert backend.runs["r"].metadata[ENDING_KEY] == {
        "reason": "killed", "type": "KeyboardInterrupt", "message": ""
    }  # fmt: skip


def test_the_ending_is_no_record_of_the_users(make_run: MakeRun) -> None:
    # Counted apart, as the end record is: the report adds up to what was logged.
    backend = InMemoryTracker(name="m")
    run = make_run("r", [backend], batch_size=2)
    for step in range(5):
        run.log_metric("loss", float(step), step=step)
    report = run.close(timeout=30, reason=Ending("failed", "ValueError", "x"))
    assert report.ok and report.delivered == 5, report
    assert backend.ended("r") == "failed"


# -- where the ending is shown ------------------------------------------------------------------


def failed_run(root: Path, message: str = "loss went to NaN") -> str:
    with pytest.raises(Stop), async_tracker.init("job", dir=root, quiet=True) as run:
        run.log(({"loss": 1.0}), step=0)
        raise Stop(message)
    return run.id


def test_a_store_lists_what_ended_a_run_before_and_after_its_index_is_compacted(
    tmp_path: Path,
) -> None:
    root = tmp_path / "runs"
    failed = failed_run(root)
    with async_tracker.init("job", dir=root, quiet=True) as run:
        run.log({"loss": 0.5}, step=0)
    finished = run.id
    # The first listing reads the writers' summaries (and compacts the index); the next
    # reads the index's checkpoint: both say the same.
    for _ in range(2):
        by_id = {r.run_id: r for r in Store(str(root)).runs()}
        assert by_id[failed].status == "failed"
        assert by_id[failed].cause == f"{__name__}.Stop: loss went to NaN"
        assert dict(by_id[failed].ending)["type"] == f"{__name__}.Stop"
        assert by_id[failed].params == {"project": "job"}
        assert by_id[finished].status == "finished" and by_id[finished].cause == ""
        assert not by_id[finished].ending
    assert list(root.glob(".index-checkpoint-*"))  # compacted
    # The dashboard's summary of the run says it too (where the ui extra is installed: CI's
    # other Pythons run this file with [test] alone).
    if importlib.util.find_spec("starlette") is not None:
        from async_tracker.ui.app import run_json

        summary = run_json(Store(str(root)).run(failed))
        assert summary["cause"] == f"{__name__}.Stop: loss went to NaN"


def test_an_earlier_lifes_ending_is_not_shown_for_a_later_one(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    run_id = failed_run(root)
    # Requeued: the same run, resumed, ends well this time.
    with async_tracker.init("job", dir=root, id=run_id, quiet=True) as run:
        run.log({"loss": 0.25})
    (summary,) = Store(str(root)).runs()
    assert summary.status == "finished" and summary.cause == "" and not summary.ending


def test_list_jobs_shows_what_ended_a_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "runs"
    run_id = failed_run(root, "bad lr")
    assert main(["--store", str(root), "list", "jobs"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if run_id in line)
    assert f"failed ({__name__}.Stop: bad lr)" in row
    assert main(["--store", str(root), "list", "jobs", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["status"] == "failed"
    assert listed["ending"] == {"reason": "failed", "type": f"{__name__}.Stop", "message": "bad lr"}
    # A run's params, as list metadata shows them, stay the user's.
    assert main(["--store", str(root), "list", "metadata", run_id]) == 0
    assert ENDING_KEY not in capsys.readouterr().out
