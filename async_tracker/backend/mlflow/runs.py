"""The MLflow runs of one tracker: found, created once across processes, ended by the last
process that wrote to them.

Every method blocks on the MLflow client: call them from worker threads only.

**Finding.** A run id maps to one MLflow run of the tracker's experiment, tagged
``async_tracker.run_key = sha1(run id)`` (searches use the hash: any run id is safe in a
filter). A run torchx's own tracker made (named after the run id, without our tags) is
adopted. Several runs named after the run id and none tagged is an
:class:`AmbiguousRunError`: we do not pick one for the user.

**Creating.** Ranks starting together create the run once: MLflow has no conditional create
for runs, but experiment names are unique, so the process that creates the (then deleted)
experiment ``async_tracker.locks/<experiment id>/<sha1(run id)>/<n>`` creates the run and the
others wait for it (see :meth:`RunBook.create_once`).

**Ending.** Each process that writes to a run tags it ``async_tracker.writer.<token>`` (one
tag per process and tracker) and removes its tag when it ends the run:

* ``finished``: the run becomes FINISHED when no other writer's tag is left, so the last rank
  to close ends it. Each process removes its tag before it looks at the others', so of ranks
  closing together at least the last one sees none left.
* ``failed`` / ``killed``: the run becomes FAILED / KILLED at once, whatever the other ranks
  do: the job failed.
* A run already FAILED or KILLED keeps that status: a rank ending well, or killed after
  another failed, does not hide the first failure.
* A process that dies without ending (SIGKILL, a power cut) leaves its tag, and the run stays
  RUNNING until someone ends it (``MlflowClient.set_terminated``).
* The ending is the run's end record, delivered like any record: when the server was down at
  close, ``async-tracker sync`` delivers it later (the syncing process writes as a writer of
  its own, then ends the run with the job's reason and time).

A process writing again to a FINISHED run (a resumed job) makes it RUNNING again, as
``mlflow.start_run(run_id=...)`` does; a FAILED or KILLED run keeps its status.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid as uuid_lib
from dataclasses import dataclass, field
from typing import Any, Literal

from mlflow.entities import ViewType

from async_tracker.backend.mlflow.errors import (
    AmbiguousRunError,
    error_code,
    map_error,
)
from async_tracker.backend.mlflow.mapping import (
    TAG_RUN_ID,
    TAG_RUN_KEY,
    TAG_SUMMARIES,
    TAG_SUMMARY_PREFIX,
    TAG_WRITER_PREFIX,
    dumps,
    run_key,
    sha1,
)
from async_tracker.base import CloseReason
from async_tracker.errors import BackendUnavailableError, TransientBackendError

logger = logging.getLogger("async_tracker.backend.mlflow")

RunStatus = Literal["FINISHED", "FAILED", "KILLED"]
STATUS_OF_REASON: dict[CloseReason, RunStatus] = {
    "finished": "FINISHED",
    "failed": "FAILED",
    "killed": "KILLED",
}
FAILED_STATUSES = frozenset({"FAILED", "KILLED"})

LOCK_EXPERIMENT_PREFIX = "async_tracker.locks/"
# How long a process waits for another to create the run it holds the creation lock of.
CREATION_WAIT_S = 10.0
CREATION_POLL_S = 0.05
SEARCH_PAGE_SIZE = 1000


@dataclass
class RunRef:
    """What this process knows of one run id's MLflow run."""

    uuid: str
    status: str = "RUNNING"  # as last seen
    writer_tag: str | None = None  # our writer tag, while this process writes to the run
    writer_pid: int = 0  # the process that set it (a forked child is another writer)
    params: dict[str, str] | None = None  # the run's params as known; None: not read yet
    # The run's summary tags and whether it held metrics when this process looked it up (a
    # search result: no request of its own). A writer's summary starts from them: its own
    # earlier summary (a replay continues it), or a note that the run holds points it cannot
    # count (see summaries.py). The other tags are not kept: a process may write many runs.
    tags: dict[str, str] = field(default_factory=dict)
    had_metrics: bool = False

    def writing(self) -> bool:
        return self.writer_tag is not None and self.writer_pid == os.getpid()


def start_order(run: Any) -> tuple[int, str]:
    """The oldest run first, then the smallest MLflow id: every process picks the same."""
    return (run.info.start_time or 0, run.info.run_id)


def run_id_of(run: Any) -> str:
    """The run id an MLflow run belongs to: our tag, else its name (torchx's runs)."""
    return str(run.data.tags.get(TAG_RUN_ID) or run.info.run_name or run.info.run_id)


class RunBook:
    """The runs one tracker has looked up, created or written to, and the experiment."""

    def __init__(
        self, client: Any, experiment_name: str, artifact_location: str | None
    ) -> None:
        self.client = client
        self.experiment_name = experiment_name
        self.artifact_location = artifact_location
        self.creation_wait_s = CREATION_WAIT_S
        self.locks_unavailable = False
        # Touched from worker threads, under these locks.
        self._experiment: Any = None
        self._experiment_lock = threading.Lock()
        self._runs: dict[str, RunRef] = {}
        self._run_locks: dict[str, threading.Lock] = {}
        self._run_locks_lock = threading.Lock()

    # -- the experiment ---------------------------------------------------------------------
    def experiment(self) -> Any:
        """The MLflow ``Experiment``, created if missing (by whichever process is first)."""
        with self._experiment_lock:
            if self._experiment is not None:
                return self._experiment
            exp = self.client.get_experiment_by_name(self.experiment_name)
            if exp is None:
                try:
                    exp_id = self.client.create_experiment(
                        self.experiment_name, artifact_location=self.artifact_location
                    )
                except Exception as exc:
                    # Another process created it between our lookup and our create.
                    if error_code(exc) != "RESOURCE_ALREADY_EXISTS":
                        raise
                    exp = self.client.get_experiment_by_name(self.experiment_name)
                else:
                    exp = self.client.get_experiment(exp_id)
                if exp is None:
                    raise TransientBackendError(
                        f"MLflow experiment {self.experiment_name!r} vanished while created"
                    )
            if exp.lifecycle_stage != "active":
                raise BackendUnavailableError(
                    f"MLflow experiment {self.experiment_name!r} is deleted: restore it "
                    "(mlflow experiments restore) or choose another experiment_name"
                )
            self._experiment = exp
            return exp

    def search(self, filter_string: str, view: int = ViewType.ACTIVE_ONLY) -> list[Any]:
        """Every run of the experiment matching ``filter_string``, all pages."""
        exp_id = self.experiment().experiment_id
        found: list[Any] = []
        token: str | None = None
        while True:
            page = self.client.search_runs(
                [exp_id],
                filter_string=filter_string,
                run_view_type=view,
                max_results=SEARCH_PAGE_SIZE,
                page_token=token,
            )
            found.extend(page)
            token = page.token
            if not token:
                return found

    # -- finding ----------------------------------------------------------------------------
    def _lock(self, run_id: str) -> threading.Lock:
        with self._run_locks_lock:
            return self._run_locks.setdefault(run_id, threading.Lock())

    def candidates(self, run_id: str) -> list[Any]:
        """The live MLflow runs tagged with ``run_id``'s key, the winner first.

        More than one exists only for a moment, while processes race to create the run
        without lock experiments (the losers delete theirs): every process picks the same.
        """
        return sorted(
            self.search(f"tags.`{TAG_RUN_KEY}` = '{run_key(run_id)}'"), key=start_order
        )

    def named(self, run_id: str) -> Any | None:
        """The one run torchx's own tracker made for ``run_id`` (named after it, without our
        tags), or None. Several: :class:`AmbiguousRunError`. Only for ids safe in a filter."""
        if any(c in run_id for c in "'\"`\\"):
            return None
        runs = self.search(f"attributes.run_name = '{run_id}'")
        if len(runs) > 1:
            raise AmbiguousRunError(
                f"{len(runs)} MLflow runs of experiment {self.experiment_name!r} are named "
                f"{run_id!r} (MLflow ids {', '.join(sorted(r.info.run_id for r in runs))}), "
                "and none was made by async_tracker: delete or rename all but one (or tag "
                f"the one to use {TAG_RUN_KEY}={run_key(run_id)!r}), or use another run id"
            )
        return runs[0] if runs else None

    def resolve(self, run_id: str, create: bool) -> RunRef | None:
        """What we know of ``run_id``'s run, looked up once per process; created (once
        across processes) if ``create`` and none exists, else None.

        Looked up by tag; a run torchx's own tracker made for the id is adopted; else created
        under the creation lock (see :meth:`create_once`). A run created here has this process
        as a writer: it ends it.
        """
        ref = self._runs.get(run_id)
        if ref is not None:
            return ref
        with self._lock(run_id):  # one lookup per run id in this process at a time
            ref = self._runs.get(run_id)
            if ref is not None:
                return ref
            runs = self.candidates(run_id)
            if not runs:
                adopted = self.named(run_id)
                if adopted is not None:
                    self.client.set_tag(adopted.info.run_id, TAG_RUN_ID, run_id)
                    self.client.set_tag(adopted.info.run_id, TAG_RUN_KEY, run_key(run_id))
                    runs = self.candidates(run_id)
            if runs:
                found = runs[0]
                kept = {
                    k: v for k, v in found.data.tags.items()
                    if k == TAG_SUMMARIES or k.startswith(TAG_SUMMARY_PREFIX)
                }  # fmt: skip
                ref = RunRef(
                    str(found.info.run_id),
                    status=str(found.info.status),
                    tags=kept,
                    had_metrics=bool(found.data.metrics),
                )
            elif create:
                # Made by this version (here or by a rank that won the creation lock): its
                # creation tags, summaries kept, and no point yet.
                ref = RunRef(self.create_once(run_id), params={}, tags={TAG_SUMMARIES: "1"})
                self._add_writer(ref)
            else:
                return None
            self._runs[run_id] = ref
            return ref

    def forget(self, run_id: str, uuid: str) -> None:
        """Our run was deleted (by hand, or as the loser of a creation race): the next
        write looks it up, or creates it, again."""
        with self._lock(run_id):
            ref = self._runs.get(run_id)
            if ref is not None and ref.uuid == uuid:
                del self._runs[run_id]

    # -- creating ---------------------------------------------------------------------------
    def _create(self, run_id: str) -> str:
        run = self.client.create_run(
            self.experiment().experiment_id,
            start_time=int(time.time() * 1000),
            tags={TAG_RUN_ID: run_id, TAG_RUN_KEY: run_key(run_id), TAG_SUMMARIES: "1"},
            run_name=run_id,
        )
        return str(run.info.run_id)

    def create_once(self, run_id: str) -> str:
        """Creates the MLflow run of ``run_id`` when several processes (ranks) may be trying
        at the same moment; returns its MLflow id.

        "Search, create, search again, keep the oldest" is not enough: a run stamped earlier
        can become visible after another process has already chosen. Experiment names,
        though, are unique: creating the experiment
        ``async_tracker.locks/<experiment id>/<sha1(run id)>/<generation>`` succeeds for one
        process only. That process creates the run, then deletes the lock experiment (deleted
        experiments keep their name, so the lock stays taken and out of sight). The others
        wait, polling, for the run to appear. The generation counts the deleted runs of the
        id, so that a run deleted by hand can be created again.

        Fallback, when the store refuses lock experiments (permissions, naming rules) or the
        lock holder died before creating the run: create, search again, keep the oldest (start
        time, then id), delete ours if it lost.
        """
        held = self.acquire_creation_lock(run_id)
        if held is False:
            deadline = time.monotonic() + self.creation_wait_s
            while time.monotonic() < deadline:
                runs = self.candidates(run_id)
                if runs:
                    return str(runs[0].info.run_id)
                # Polling the server for another process's create: bounded, and short.
                time.sleep(CREATION_POLL_S)
            logger.warning(
                "async_tracker: the process that took the creation lock of MLflow run %r did "
                "not create it within %.0f s; creating it here", run_id, self.creation_wait_s,
            )
        mine = self._create(run_id)
        if isinstance(held, str):
            try:
                self.client.delete_experiment(held)
            except Exception as exc:
                logger.warning("async_tracker: could not delete MLflow lock experiment: %s", exc)
        runs = self.candidates(run_id)
        winner = str(runs[0].info.run_id) if runs else mine
        if winner != mine:
            logger.info(
                "async_tracker: MLflow run for %r was created concurrently by another "
                "process; using %s and deleting ours (%s)", run_id, winner, mine,
            )
            try:
                self.client.delete_run(mine)
            except Exception as exc:
                # Harmless for correctness: every process picks the older winner.
                logger.warning(
                    "async_tracker: could not delete duplicate MLflow run %s of %r: %s",
                    mine, run_id, exc,
                )
        return winner

    def acquire_creation_lock(self, run_id: str) -> str | bool | None:
        """The lock experiment's id if we took it; False if another process holds it; None if
        the store refuses lock experiments (then: the fallback)."""
        if self.locks_unavailable:
            return None
        exp_id = self.experiment().experiment_id
        deleted = self.search(
            f"tags.`{TAG_RUN_KEY}` = '{run_key(run_id)}'", view=ViewType.DELETED_ONLY
        )
        name = f"{LOCK_EXPERIMENT_PREFIX}{exp_id}/{run_key(run_id)}/{len(deleted)}"
        try:
            return str(self.client.create_experiment(name))
        except Exception as exc:
            if error_code(exc) == "RESOURCE_ALREADY_EXISTS":
                return False
            error = map_error(exc, "create_experiment (creation lock)")
            if isinstance(error, TransientBackendError):
                raise error from exc
            logger.warning(
                "async_tracker: the MLflow store refuses lock experiments (%s); runs created "
                "by several processes at once may be duplicated, then resolved", exc,
            )
            self.locks_unavailable = True
            return None

    # -- writers and ending -----------------------------------------------------------------
    def _add_writer(self, ref: RunRef) -> None:
        """Tags the run with this process as one of its writers (see the module's doc)."""
        token = sha1(f"{socket.gethostname()}:{os.getpid()}:{uuid_lib.uuid4().hex}")[:20]
        tag = TAG_WRITER_PREFIX + token
        self.client.set_tag(
            ref.uuid, tag, dumps({"host": socket.gethostname(), "pid": os.getpid()})
        )
        ref.writer_tag, ref.writer_pid = tag, os.getpid()
        if ref.status == "FINISHED":
            # A resumed run: running again, as mlflow.start_run(run_id=...) makes it.
            self.client.update_run(ref.uuid, status="RUNNING")
            ref.status = "RUNNING"

    def for_writing(self, run_id: str) -> RunRef:
        """``run_id``'s run, created if missing, with this process as one of its writers."""
        ref = self.resolve(run_id, create=True)
        assert ref is not None
        if not ref.writing():
            with self._lock(run_id):
                if not ref.writing():
                    self._add_writer(ref)
        return ref

    def known(self, run_id: str) -> RunRef | None:
        """``run_id``'s run if this process has looked it up already, else None. No request
        and no lock: one read of a dict, which the tracker loop's thread may make."""
        return self._runs.get(run_id)

    def writing(self) -> list[str]:
        """The run ids this process writes to and has not ended."""
        return [run_id for run_id, ref in list(self._runs.items()) if ref.writing()]

    def end(self, run_id: str, reason: CloseReason, end_time: float | None = None) -> None:
        """This process is done with ``run_id``'s run (see the module's doc for the status it
        then gets), which ended at ``end_time`` (seconds since the epoch; default: now).
        Nothing for a run this process did not write to."""
        ref = self._runs.get(run_id)
        if ref is None or not ref.writing():
            return
        with self._lock(run_id):
            if not ref.writing():
                return
            assert ref.writer_tag is not None
            status = STATUS_OF_REASON[reason]
            try:
                self.client.delete_tag(ref.uuid, ref.writer_tag)
            except Exception as exc:
                # Gone already: removed by an earlier attempt of this end, or by hand.
                if error_code(exc) != "RESOURCE_DOES_NOT_EXIST":
                    raise
            run = self.client.get_run(ref.uuid)
            current = str(run.info.status)
            others = [k for k in run.data.tags if k.startswith(TAG_WRITER_PREFIX)]
            if current in FAILED_STATUSES:
                ref.status = current  # the first failure stays
            elif status == "FINISHED" and others:
                logger.debug(
                    "async_tracker: MLflow run %s of %r left RUNNING for %d other writers",
                    ref.uuid, run_id, len(others),
                )
            elif current != status:
                end_ms = None if end_time is None else int(end_time * 1000)
                self.client.set_terminated(ref.uuid, status=status, end_time=end_ms)
                ref.status = status
            # Only now: an end that failed half-way is tried again by aclose().
            ref.writer_tag = None
