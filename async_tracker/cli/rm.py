"""``rm RUN... [--yes]``: deletes runs from every store the command reaches, and their spool.

The stores are those the other commands read (``--tracker``, ``--store``), except that with
trackers configured the torchx way every one of them is a store to delete from, not the first
alone. Each run is deleted by each backend's ``delete_run``, then what it left in this
machine's spool (which would otherwise deliver it again) is removed, unless a live process owns
that spool. One line per run and place: ``deleted``, ``not found`` or ``could not: <why>``; the
exit code is 1 when anything could not be deleted.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

from async_tracker.adapters import as_async
from async_tracker.base import AsyncTrackerBase
from async_tracker.cli.common import (
    EXIT_FAILURE,
    StoreError,
    backend_and_label,
    print_json,
    read_or_fail,
    resolve_run,
)
from async_tracker.config import configured_trackers
from async_tracker.errors import BackendError
from async_tracker.runtime.process import runtime
from async_tracker.settings import CRASHED_AFTER_BEATS
from async_tracker.spool import default_spool_dir, remove_run_spool
from async_tracker.store.open import open_reader
from async_tracker.store.sync_reader import Reader

DELETED = "deleted"
NOT_FOUND = "not found"
COULD_NOT = "could not"


@dataclass
class Place:
    """A store to delete from: its backend and reader, its name in the output, the run ids
    it holds (None when it could not be listed, ``error`` then says why)."""

    backend: AsyncTrackerBase
    reader: Reader
    label: str
    ids: list[str] | None
    error: str = ""


@dataclass
class Outcome:
    run_id: str
    where: str
    result: str
    reason: str = ""

    def line(self) -> str:
        why = f": {self.reason}" if self.reason else ""
        return f"{self.run_id}: {self.where}: {self.result}{why}"


def places(args: argparse.Namespace) -> list[Place]:
    """Every store to delete from, each listed (a store that cannot be listed is kept, with
    its error, so that the runs it may hold are reported as not deleted there)."""
    if args.tracker or args.config or getattr(args, "store", None) is not None:
        backends = [backend_and_label(args)]
    else:
        specs = configured_trackers()
        if specs:
            backends = [(as_async(s.build()), f"tracker {s.name!r}") for s in specs]
        else:
            backends = [backend_and_label(args)]  # the default store
    out = []
    timeout = getattr(args, "timeout", None)
    for backend, label in backends:
        reader = open_reader(backend, timeout=timeout, label=label)
        try:
            with read_or_fail(label):
                out.append(Place(backend, reader, label, reader.run_ids()))
        except StoreError as exc:
            out.append(Place(backend, reader, label, None, str(exc)))
    return out


def live_writers(place: Place, run_id: str, now: float) -> list[str]:
    """The writers of ``run_id`` in ``place`` whose heartbeat is recent (a process still
    writing the run: deleting it under that process would only lose what it writes
    next)."""
    if place.reader.status(run_id)[0] != "running":
        return []
    beats = place.reader.writers(run_id)
    return [w for w, beat in beats.items() if _beating(beat, now)]


def _beating(beat: Mapping[str, object], now: float) -> bool:
    when, every = beat.get("time"), beat.get("interval_s")
    if not isinstance(when, (int, float)) or not isinstance(every, (int, float)):
        return False
    return now - when <= CRASHED_AFTER_BEATS * every


def delete_run(run_id: str, stores: list[Place], force: bool = False) -> list[Outcome]:
    outcomes = []
    for place in stores:
        if place.ids is None:
            outcomes.append(Outcome(run_id, place.label, COULD_NOT, place.error))
            continue
        if run_id not in place.ids:
            outcomes.append(Outcome(run_id, place.label, NOT_FOUND))
            continue
        try:
            with read_or_fail(place.label):
                live = [] if force else live_writers(place, run_id, time.time())
            if live:
                outcomes.append(Outcome(run_id, place.label, COULD_NOT, (
                    f"a live process is writing it ({', '.join(live)}); stop it first, or "
                    "rm --force deletes it anyway (what it writes next makes the run anew)"
                )))  # fmt: skip
                continue
            deleted = bool(runtime().loop.call(place.backend.delete_run, run_id))
        except StoreError as exc:
            outcomes.append(Outcome(run_id, place.label, COULD_NOT, str(exc)))
            continue
        except (BackendError, OSError) as exc:
            reason = " ".join(str(exc).split()) or type(exc).__name__
            outcomes.append(Outcome(run_id, place.label, COULD_NOT, reason))
            continue
        if deleted:
            outcomes.append(Outcome(run_id, place.label, DELETED))
        else:
            outcomes.append(
                Outcome(run_id, place.label, COULD_NOT, "this backend cannot delete runs")
            )
    outcomes.extend(delete_spool(run_id))
    return outcomes


def delete_spool(run_id: str) -> list[Outcome]:
    """What the run left in this machine's spool: undelivered records that a replay (the
    next start of the run, ``async-tracker sync``) would write to the store again."""
    spool_dir = default_spool_dir()
    try:
        path, kept = remove_run_spool(spool_dir, run_id)
    except OSError as exc:
        return [Outcome(run_id, f"spool {spool_dir}", COULD_NOT, str(exc))]
    if path is None:
        return []
    if kept:
        reason = f"a live process is writing it ({', '.join(kept)}); rm again once it ended"
        return [Outcome(run_id, f"spool {path}", COULD_NOT, reason)]
    return [Outcome(run_id, f"spool {path}", DELETED)]


def confirm(run_ids: list[str], stores: list[Place]) -> bool | None:
    """Asks on the terminal: True for yes, False for no, None when nobody can answer (stdin
    is not a terminal, or ends). The list and the question go to stderr: stdout holds the
    results (JSON with --json)."""
    err = sys.stderr
    for run_id in run_ids:
        held = [p.label for p in stores if p.ids is not None and run_id in p.ids]
        print(f"  {run_id}  ({', '.join(held) or 'only in an unreachable store'})", file=err)
    stdin = sys.stdin
    if stdin is None or not stdin.isatty():
        return None
    print(f"delete {len(run_ids)} run{'s' if len(run_ids) != 1 else ''}? [y/N] ",
          end="", file=err, flush=True)  # fmt: skip
    answer = stdin.readline()
    if not answer:
        print(file=err)
        return None
    return answer.strip().lower() in ("y", "yes")


def cmd_rm(args: argparse.Namespace) -> int:
    stores = places(args)
    listed = [p for p in stores if p.ids is not None]
    if not listed:
        raise StoreError("; ".join(p.error for p in stores))
    known = list(dict.fromkeys(i for p in listed for i in p.ids or ()))
    run_ids = list(dict.fromkeys(resolve_run(listed[0].reader, r, known) for r in args.RUN_ID))
    if not args.yes:
        answer = confirm(run_ids, stores)
        if answer is None:
            print("nothing deleted: no answer (stdin is not a terminal); pass --yes to delete "
                  "without asking", file=sys.stderr)  # fmt: skip
            return EXIT_FAILURE
        if not answer:
            print("nothing deleted", file=sys.stderr)
            return 0
    outcomes = [o for r in run_ids for o in delete_run(r, stores, args.force)]
    if args.json:
        print_json([vars(o) for o in outcomes])
    else:
        print("\n".join(o.line() for o in outcomes))
    return EXIT_FAILURE if any(o.result == COULD_NOT for o in outcomes) else 0


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "rm",
        parents=[common],
        help="delete runs from every store it reaches (asks first)",
        description=(
            "Deletes runs from the store (or from every tracker configured the torchx way) "
            "and what they left in this machine's spool, after listing them and asking "
            "(unless --yes). Prints, per run and place: deleted, not found, or could not "
            "(why); exits with 1 if anything could not be deleted. MLflow deletes softly: "
            "the run is hidden from its UI and searches until `mlflow gc`. A process still "
            "writing a run may write it again."
        ),
    )
    p.add_argument("RUN_ID", nargs="+", help="runs to delete (ids or unique prefixes)")
    p.add_argument("-y", "--yes", action="store_true", help="delete without asking")
    p.add_argument(
        "--force",
        action="store_true",
        help="delete a run even while a live process writes it (by default such a run is "
        "left alone, and the command says which process writes it)",
    )
    p.set_defaults(func=cmd_rm)
