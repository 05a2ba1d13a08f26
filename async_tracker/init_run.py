"""``async_tracker.init()``: a run in a local store in one call, without torchx's environment.

The store is an fsspec URL or path (default ``$ASYNC_TRACKER_DIR``, else ``./tracker_runs``),
written in torchx's layout by the fsspec backend, so the CLI (``async-tracker list jobs``) and
torchx's own reader find the runs. A run id is ``<project>/<name>-<6 hex digits>``, readable and
unique; ``id=`` opens a given run instead, resumed by default.

The start is bounded (``timeout``, default 1 s): the store is asked about this run alone,
the new id is claimed by an atomic create, and a store that cannot answer in time means the
run starts and spools (see :func:`init`).

Inside a job (``$TORCHX_JOB_ID`` set, as torchx's runner and ``async-tracker run`` set it),
one run per ``init()`` still holds: an ``init()`` that names no run (no ``name``, no ``id``),
or names the job's run by id, is the job's run, as ``AppRun.run_from_env()`` is (torchx's
contract); one that names its own run opens it, recorded as a child of the job's run (a
source edge from it to the job's run). A named run's id is drawn from the job id, the project,
the name and how many runs of that name this process opened before, so that the processes
(ranks) of one job share each named run and a job started again under its id resumes it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import errno
import hashlib
import itertools
import logging
import os
import random
import shlex
import socket
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import anyio
from fsspec.implementations.local import LocalFileSystem

from async_tracker.adapters import as_async
from async_tracker.backend.errors import chain
from async_tracker.backend.fsspec import AsyncFsspecTracker
from async_tracker.base import backend_name
from async_tracker.config import configured_trackers
from async_tracker.errors import BackendError, TrackerConfigError
from async_tracker.factory import (
    ENV_TORCHX_JOB_ID,
    ENV_TORCHX_PARENT_RUN_ID,
    ENV_TORCHX_TRACKERS,
    UNDEFINED_JOB_ID,
    AnyTracker,
    build_tracker,
    factories_from_environ,
)
from async_tracker.records import check_name
from async_tracker.run import AppRun
from async_tracker.runtime.process import runtime
from async_tracker.settings import CLOSE_SLACK_S, RunOptions, init_timeout, silent
from async_tracker.spool import check_run_id, default_spool_dir, has_spool, spooled_last_steps
from async_tracker.store.open import DEFAULT_DIR, ENV_DIR, open_store, store_dir
from async_tracker.tags import check_note, tag_metadata

logger = logging.getLogger(__name__)


Resume = Literal["allow", "never", "must"]

_ADJECTIVES = (
    "amber", "brave", "calm", "clever", "crisp", "eager", "fancy", "gentle", "golden", "happy",
    "humble", "jolly", "keen", "lively", "lucky", "mellow", "misty", "noble", "quiet", "rapid",
    "silver", "snowy", "sunny", "swift", "tidy", "vivid", "warm", "wise", "young", "zesty",
)
_NOUNS = (
    "badger", "breeze", "brook", "cedar", "comet", "dawn", "delta", "falcon", "fern", "forest",
    "galaxy", "harbor", "heron", "lake", "lynx", "maple", "meadow", "moon", "otter", "pine",
    "planet", "river", "sparrow", "star", "storm", "summit", "thunder", "tiger", "valley", "wave",
)


def init(
    project: str,
    name: str | None = None,
    config: object = None,
    dir: str | os.PathLike[str] | None = None,
    *,
    id: str | None = None,
    resume: Resume = "allow",
    timeout: float | None = None,
    backends: Sequence[AnyTracker | str] = (),
    tags: Sequence[str] | None = (),
    note: str | None = None,
    quiet: bool | None = None,
    **options: Any,
) -> AppRun:
    """A new run of ``project`` in a local store, ready for ``with``.

    Starting never waits on the store longer than ``timeout``: a store that is down means
    spooling, as for any write. The start check is about the run alone (one request for
    whether it exists, one to claim a new id, and a resumed run's metrics), never a listing
    of the store. A new run id is claimed by an atomic create in the store (``claim.json`` in
    the run's directory: an exclusive create on local and POSIX filesystems, a conditional
    PUT on S3), so of several processes creating one id exactly one succeeds.

    Args:
        project: groups runs; the first part of the run id.
        name: a readable name (default: an adjective and a noun); the id is
            ``<project>/<name>-<6 hex digits>``. Inside a job, a named run is a run of its
            own (even when ``name`` is the job's name), a child of the job's run: its
            source. Its digits come from the job id, the project, the name and how many
            runs of that name this process opened before (:func:`child_run_id`), so the
            processes of the job share it, and a job started again under its id resumes it
            (``resume`` applies as to a given id).
        config: recorded as the run's metadata: a mapping, a dataclass or any object with
            attributes (``argparse.Namespace``).
        dir: the store, a path or an fsspec URL. By default, the trackers configured the
            torchx way (``TORCHX_TRACKERS`` and ``TORCHX_TRACKER_<NAME>_CONFIG``, else
            ``.torchxconfig``), which the CLI also reads, if any; else ``$ASYNC_TRACKER_DIR``,
            else ``./tracker_runs`` (which a job with no tracker configured says once). A
            path that cannot hold runs (a file where a directory should be, a folder that
            cannot be made) or an unknown protocol raises :class:`TrackerConfigError`
            naming it.
        id: open this run id instead of making one (default, with no ``name``:
            ``$TORCHX_JOB_ID`` when set, as in a job torchx or ``async-tracker run``
            launched, the job's run, whose ``$TORCHX_PARENT_RUN_ID`` then becomes a source
            of the run, as with ``AppRun.run_from_env()``). Inside a job, any other id is a
            child of the job's run.
            ``resume="allow"`` (the default) resumes a run that exists and creates one that
            does not; ``resume="never"`` refuses a run that exists or that another process
            is creating; ``resume="must"`` refuses
            a run found neither in the store (records, or the claim of a run open in
            another process) nor in this machine's spool. A resumed run's step-less points
            continue after the last step of each metric stored or still spooled here.
        timeout: seconds the start waits for the store (default
            ``$ASYNC_TRACKER_INIT_TIMEOUT``, else 1). Without an answer by then (or with an
            error from a remote store), a new run starts anyway with one warning and its
            records wait in the spool; so does ``resume="allow"`` or ``"must"``, continuing
            step-less points after the steps in this machine's spool only. ``"never"``
            raises :class:`TrackerConfigError` instead: that no other process holds the id
            can only be known from the store.
        backends: more backends beside the store: objects, or factory names (``"tensorboard"``,
            ``"mlflow"``, ``module:attr``) built with no config.
        tags: tags the run gets (``AppRun.add_tags``; None: none); a resumed run keeps the tags
            it had.
        note: the run's note (``AppRun.set_note``), when given.
        quiet: True: print nothing. By default the start prints one line on stderr: the run
            id, its store, and the commands that show it (``$ASYNC_TRACKER_SILENT=1``: none).
        options: ``AppRun`` options (``flush_interval``, ``durable``, ``close_timeout`` ...).

    Example::

        with async_tracker.init("mnist", id="mnist/long-job", resume="allow") as run:
            run.log_metric("loss", 0.5)  # after the last step stored or spooled
    """
    check_name(project, "project")
    if name is not None:
        check_name(name, "name")
    if resume not in ("allow", "never", "must"):
        raise ValueError(f"resume must be 'allow', 'never' or 'must', got {resume!r}")
    # Checked before the store is asked: a bad tag must not leave a claimed, empty run.
    if isinstance(tags, str):
        raise TypeError(f"tags must be a sequence of str, got the str {tags!r}")
    tags = tags or ()
    tag_metadata(add=tags)
    if note is not None:
        check_note(note)
    bound = init_timeout(timeout)
    # The job's environment, as torchx's runner (or `async-tracker run`) sets it: the job id
    # is the run of an init() that names none, and the trackers configured the torchx way
    # (TORCHX_TRACKERS, else .torchxconfig) the backends, unless the call says otherwise.
    from_env = _env_trackers() if dir is None else []
    job_id = job_run_id()
    if job_id is not None and id is None and name is None:
        id = job_id
    if job_id is not None and dir is None and not from_env and not os.environ.get(ENV_DIR):
        _warn_no_trackers(job_id, store_dir())
    url = store_dir(dir)
    store: AsyncFsspecTracker | None = None
    if from_env:
        # The start checks (claim, resume) ask the job's fsspec store, if it has one.
        store = next(
            (b for _, t in from_env if isinstance(b := as_async(t), AsyncFsspecTracker)), None
        )
        url = store.url if store is not None else ""
    else:
        store = open_store(url)
    # ASYNC_TRACKER_<OPTION> variables apply as with run_from_env(); keyword options win.
    options.setdefault("options", RunOptions.from_env())
    spool_dir = Path(
        options.get("spool_dir") or options["options"].spool_dir or default_spool_dir()
    )
    new_id: Callable[[], str] | None = None
    child: _JobChild | None = None
    if job_id is not None and id is None and name is not None:
        # Counted here, after every check that can refuse the call: the ranks of a job,
        # which make the same calls, count alike.
        child = _JobChild(job_id, project, name, _next_ordinal(job_id, project, name))
        id = child.run_id(0)
    elif id is None:
        label = name or f"{random.choice(_ADJECTIVES)}-{random.choice(_NOUNS)}"

        def new_id() -> str:
            return f"{project}/{label}-{uuid.uuid4().hex[:6]}"

        id = new_id()
    else:
        check_name(id, "id")
        check_run_id(id)
    started = time.time()
    answer = _Answer(id, exists=False)
    resumed = False
    if store is not None:
        answer, resumed = _start(store, url, project, id, new_id, child, resume, bound, spool_dir)
        id = answer.run_id
    extra = [_backend_named(b, project) if isinstance(b, str) else b for b in backends]
    names: list[str] | None = None
    stores: list[AnyTracker] = [store] if store is not None and not from_env else []
    if from_env:
        # Spooled under their TORCHX_TRACKERS names, as run_from_env() does: `async-tracker
        # sync` with the same configuration finds them.
        stores = [t for _, t in from_env]
        names = [n for n, _ in from_env] + [backend_name(as_async(b)) for b in extra]
    # A run's first life is 1; a resumed run joins its latest life while that has not ended
    # (ranks of one job), else begins the next (a counter the store holds, not a clock): its
    # ending takes over the endings of earlier lives (a job killed, then requeued, that
    # finishes is finished), and while it beats the run is running. Its metadata is stamped
    # after everything stored before, whatever the clocks did. (0 is a writer that did not
    # look its life up: a rank opened by AppRun.)
    run = AppRun(
        id, [*stores, *extra], _last_steps=answer.steps,
        _life_start=started if resumed else 0.0,
        _life=answer.life,
        _stamp_floor=answer.stamp_ns, _backend_names=names, **options,
    )  # fmt: skip
    parent = os.environ.get(ENV_TORCHX_PARENT_RUN_ID)
    if job_id is not None and id == job_id:
        if parent:
            run.add_source(parent, None)
    elif job_id is not None:
        # Any other run this job opens (by name, or by an id of its own) is a child of the
        # job's run, recorded as lineage is everywhere: a source edge to its parent.
        run.add_source(job_id, None)
    metadata: dict[str, object] = {"project": project}
    if config is not None:
        metadata.update(_as_mapping(config))
    run.add_metadata(**metadata)
    if tags:
        run.add_tags(*tags)
    if note is not None:
        run.set_note(note)
    if not (silent() if quiet is None else quiet):
        line = _started_line(id, store, url, dir, from_env, job_id if id != job_id else None)
        print(line, file=sys.stderr, flush=True)
    return run


def job_run_id() -> str | None:
    """The run of the job this process belongs to: ``$TORCHX_JOB_ID``, None when it is
    unset or ``<UNDEFINED>`` (not launched as a job)."""
    job_id = os.environ.get(ENV_TORCHX_JOB_ID)
    return job_id if job_id and job_id != UNDEFINED_JOB_ID else None


def child_run_id(job_id: str, project: str, name: str, ordinal: int, draw: int = 0) -> str:
    """The id of the ``ordinal``-th run named ``name`` (counting from 1) that a process of
    job ``job_id`` opens in ``project``: ``<project>/<name>-<6 hex digits>``, as outside a
    job, the digits drawn from all of these instead of at random, so that every process of
    the job gets the same id. ``draw`` counts the ids passed over because another run of
    the store holds them."""
    key = "\0".join([job_id, project, name, str(ordinal), str(draw)])
    return f"{project}/{name}-{hashlib.sha256(key.encode()).hexdigest()[:6]}"


@dataclasses.dataclass(frozen=True)
class _JobChild:
    """A run that ``init(name=...)`` opens inside a job: what names it, and marks its claim
    as this job's (so that an id the store holds for another run is told apart)."""

    job_id: str
    project: str
    name: str
    ordinal: int

    def run_id(self, draw: int) -> str:
        return child_run_id(self.job_id, self.project, self.name, self.ordinal, draw)

    def claim(self) -> dict[str, object]:
        return {"job": self.job_id, "name": self.name, "ordinal": self.ordinal}

    def holds(self, claim: Mapping[str, object] | None) -> bool:
        """Whether the run claimed with ``claim`` is this one (made by another process of
        this job, or by this job before it was started again), not another run of the store
        whose id came out the same."""
        if not claim or not ("job" in claim or "project" in claim):
            # No claim, one being created (read empty), or one a heartbeat made for a run
            # whose init() could not reach the store (it names no project): ours, since
            # another run with the same 6 hex digits and no init() claim is not plausible.
            return True
        return all(claim.get(k) == v for k, v in self.claim().items())


# How many runs of each (job, project, name) this process opened, per process: a forked
# child counts from the start, as a process the job started would. setdefault and a
# count's next() are each atomic under the GIL: threads opening runs at once count apart.
_ordinals: dict[int, dict[tuple[str, str, str], itertools.count[int]]] = {}


def _next_ordinal(job_id: str, project: str, name: str) -> int:
    counts = _ordinals.setdefault(os.getpid(), {})
    return next(counts.setdefault((job_id, project, name), itertools.count(1)))


_warned_no_trackers = False


def _warn_no_trackers(job_id: str, default: str) -> None:
    """Says once per process that a job with no tracker configured records ``init()``'s
    runs in the default store (``AppRun.run_from_env()`` says it records nothing)."""
    global _warned_no_trackers
    if _warned_no_trackers:
        return
    _warned_no_trackers = True
    logger.warning(
        "async_tracker: %s is set (%s) but no tracker is configured, so init() records into "
        "the default store %s; set %s (and TORCHX_TRACKER_<NAME>_CONFIG), or [torchx:tracker] "
        "in .torchxconfig where the job is launched, for the job's trackers, or %s (or dir=) "
        "for a store of your choice",
        ENV_TORCHX_JOB_ID, job_id, os.path.abspath(default), ENV_TORCHX_TRACKERS, ENV_DIR,
    )  # fmt: skip


def _env_trackers() -> list[tuple[str, AnyTracker]]:
    """The trackers configured the torchx way, built, by name: ``TORCHX_TRACKERS`` (with
    their ``TORCHX_TRACKER_<NAME>_CONFIG``), else ``.torchxconfig``'s; none when neither
    names any. The same ones the CLI reads when given no ``--store``: the two agree."""
    return [(spec.name, spec.build()) for spec in configured_trackers()]


def _started_line(
    run_id: str,
    store: AsyncFsspecTracker | None,
    url: str,
    dir: str | os.PathLike[str] | None,
    from_env: Sequence[tuple[str, AnyTracker]],
    job_id: str | None = None,
) -> str:
    """What ``init()`` says on stderr: the run (and the job's run it is a child of), where
    it is stored, how to look at it (with ``--store`` when the CLI would not read that store
    by itself)."""
    run = f"run {run_id} (a child of the job's run {job_id})" if job_id else f"run {run_id}"
    if store is None:
        names = ", ".join(n for n, _ in from_env)
        return f"async_tracker: {run} recorded by the configured trackers {names}"
    where = store.root_dir if isinstance(store.fs, LocalFileSystem) else url
    store_arg = ""
    default = store_dir()
    if (dir is not None or from_env) and where not in (default, os.path.abspath(default)):
        store_arg = f" --store {shlex.quote(where)}"
    return (
        f"async_tracker: {run} stored in {where}; view it: "
        f"async-tracker{store_arg} list jobs, async-tracker{store_arg} ui"
    )


# How often a generated id is drawn again when its claim finds it taken (6 hex digits: one
# chance in 16 million per run in the store; a store that refuses every claim is broken).
MAX_ID_DRAWS = 5
# errno values that say a local store's path cannot hold runs: raised at once, not spooled.
_BAD_PATH_ERRNOS = frozenset(
    {
        errno.ENOTDIR, errno.ENOENT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR,
        errno.EEXIST, errno.ENAMETOOLONG, errno.ELOOP,
    }
)  # fmt: skip


@dataclasses.dataclass
class _Answer:
    """What the store said about a run at its start."""

    run_id: str
    exists: bool  # claimed (open elsewhere, or created earlier) or holding records
    steps: dict[str, int] = dataclasses.field(default_factory=dict)
    # The life of the run this process lives (see FsspecReader.life_state; a new run's
    # first is 1) and the run's latest metadata stamp (ns).
    life: int = 1
    stamp_ns: int = 0



def _backend_named(name: str, project: str) -> AnyTracker:
    """A backend ``init(backends=[name])`` builds by its factory's name, with no config.
    The package's own MLflow factory is told the project, so that the runs land in the
    experiment named by it (not torchx's default, named after the user and host)."""
    if name == "mlflow" and not factories_from_environ([name]):
        try:
            from async_tracker.backend.mlflow import create_tracker
        except ImportError:
            pass  # build_tracker says which extra is missing
        else:
            return create_tracker(None, project=project)
    return build_tracker(name, name, None)


def _start(
    store: AsyncFsspecTracker,
    url: str,
    project: str,
    run_id: str,
    new_id: Callable[[], str] | None,
    child: _JobChild | None,
    resume: Resume,
    bound: float,
    spool_dir: Path,
) -> tuple[_Answer, bool]:
    """The store's answer (the run id to open, the last step of each of its metrics, its
    lives and stamps) and whether the run existed (in the store or this machine's spool),
    after asking the store for at most ``bound`` seconds; raises what ``resume`` refuses.
    ``new_id`` draws a generated id; ``child`` names a job's named run (see
    :func:`child_run_id`), whose ``run_id`` is its first draw; else ``run_id`` was given."""
    spooled = new_id is None and has_spool(spool_dir, run_id)
    claim: dict[str, object] = {
        "run_id": run_id, "project": project, "host": socket.gethostname(),
        "pid": os.getpid(), "time": time.time(),
    }  # fmt: skip

    async def ask() -> _Answer | None:
        # The deadline is on the tracker loop, where cancelling the store's calls is safe
        # (an async filesystem's request is cancelled on its own loop; a worker thread's
        # call is abandoned, its thread freed when the call returns).
        with anyio.move_on_after(bound):
            if child is not None:
                return await _ask_child(store, child, resume, claim)
            return await _ask(store, run_id, new_id, resume, spooled, claim)
        return None

    future = runtime().loop.submit(ask)
    answer: _Answer | None = None
    why = f"no answer within {bound:g} s"
    try:
        # A backstop beyond the loop's own deadline: a loop that is stuck (a blocking call in
        # a backend) must not hold the caller either.
        answer = future.result(bound + CLOSE_SLACK_S)
    except concurrent.futures.TimeoutError:
        future.cancel()
    except BackendError as exc:
        bad = _bad_path(store, url, exc)
        if bad is not None:
            raise bad from None
        why = str(exc).splitlines()[0][:300]
    if answer is None:
        # A job's named run starts under its first draw, as every process of the job that
        # cannot reach the store does: they still share it.
        run_id, steps = _unanswered(url, run_id, new_id, resume, why, spool_dir)
        return _Answer(run_id, spooled, steps), spooled
    if answer.run_id != run_id and new_id is None:
        run_id = answer.run_id  # a job's named run, at a later draw
        spooled = has_spool(spool_dir, run_id)
    if answer.exists and resume == "never" and new_id is None:
        raise TrackerConfigError(
            f"run {run_id!r} already exists in the store {url!r} or another process is "
            "creating it (resume='never'); pick another id, or resume='allow' to continue it"
        )
    if not answer.exists and not spooled and resume == "must" and new_id is None:
        raise TrackerConfigError(
            f"run {run_id!r} is not in the store {url!r}, nor in this machine's spool "
            "(resume='must')"
        )
    steps = answer.steps
    if new_id is None:
        steps = _later(steps, spooled_last_steps(spool_dir, run_id))
    return dataclasses.replace(answer, steps=steps), answer.exists or spooled


async def _ask(
    store: AsyncFsspecTracker,
    run_id: str,
    new_id: Callable[[], str] | None,
    resume: Resume,
    spooled: bool,
    claim: dict[str, object],
) -> _Answer:
    if new_id is not None:
        # A generated id needs no lookup: its claim says whether it is free.
        for _ in range(MAX_ID_DRAWS):
            if await store.claim_run(run_id, {**claim, "run_id": run_id}):
                return _Answer(run_id, exists=False)
            run_id = new_id()
        raise TrackerConfigError(
            f"the store refused the claim of {MAX_ID_DRAWS} new run ids in a row: "
            "does it honour exclusive creates?"
        )
    if await store.run_exists(run_id):
        return await _existing(store, run_id, resume)
    if resume == "must" and not spooled:
        return _Answer(run_id, exists=False)  # refused: claim nothing
    # Claimed even by "allow" and "must": another process's resume="never" of this id must
    # now be refused. Losing the claim means another process created the run meanwhile:
    # resume="never" is refused, the others join it (it has no steps yet).
    created = await store.claim_run(run_id, claim)
    return _Answer(run_id, exists=not created)


async def _ask_child(
    store: AsyncFsspecTracker, child: _JobChild, resume: Resume, claim: dict[str, object]
) -> _Answer:
    """The store's answer for a job's named run: the first of its draws that is free (then
    claimed, as this job's) or this job's already (claimed by another of its processes, or
    by this job before it was started again: then resumed). An id the store holds for
    another run is passed over; every process of the job passes over the same ones."""
    for draw in range(MAX_ID_DRAWS):
        run_id = child.run_id(draw)
        mine = {**claim, "run_id": run_id, **child.claim()}
        # "must" claims nothing: a run found nowhere is refused, and leaves no trace.
        if resume != "must" and await store.claim_run(run_id, mine):
            return _Answer(run_id, exists=False)
        held = await store.run_claim(run_id)
        if held is None and not await store.run_exists(run_id):
            return _Answer(run_id, exists=False)  # "must": refused unless spooled here
        if child.holds(held):
            return await _existing(store, run_id, resume)
    raise TrackerConfigError(
        f"each of the {MAX_ID_DRAWS} ids of run {child.name!r} of job {child.job_id!r} is "
        "held by another run of the store; give the run another name"
    )


async def _existing(store: AsyncFsspecTracker, run_id: str, resume: Resume) -> _Answer:
    """The answer for a run the store holds: refused by ``"never"``, else resumed (the last
    step of each metric, the life it joins or begins, its latest stamp)."""
    if resume == "never":
        return _Answer(run_id, exists=True)
    metrics = await store.metrics(run_id)
    steps = {k: max(p.step for p in pts) for k, pts in metrics.items() if pts}
    life, stamp_ns = await store.life_state(run_id)
    return _Answer(run_id, exists=True, steps=steps, life=life, stamp_ns=stamp_ns)


def _unanswered(
    url: str,
    run_id: str,
    new_id: Callable[[], str] | None,
    resume: Resume,
    why: str,
    spool_dir: Path,
) -> tuple[str, dict[str, int]]:
    """The start without the store's answer (see :func:`init`'s ``timeout``)."""
    if new_id is not None:
        logger.warning(
            "async_tracker: the store %s did not answer (%s); run %r starts anyway and its "
            "records wait in the spool until the store takes them",
            url, why, run_id,
        )
        return run_id, {}
    if resume == "never":
        raise TrackerConfigError(
            f"cannot start run {run_id!r} with resume='never': the store {url!r} did not "
            f"answer ({why}), and only the store can tell that no other process holds the id "
            "(retry, give a longer timeout=, or use resume='allow')"
        )
    logger.warning(
        "async_tracker: the store %s did not answer (%s); run %r starts anyway "
        "(resume=%r unchecked): step-less points continue after the steps in this machine's "
        "spool, and records wait in the spool until the store takes them",
        url, why, run_id, resume,
    )
    return run_id, spooled_last_steps(spool_dir, run_id)


def _later(*steps: Mapping[str, int]) -> dict[str, int]:
    """The last step of each metric across ``steps``."""
    out: dict[str, int] = {}
    for one in steps:
        for name, step in one.items():
            out[name] = max(step, out.get(name, step))
    return out


def _bad_path(
    store: AsyncFsspecTracker, url: str, exc: BaseException
) -> TrackerConfigError | None:
    """A one-line error naming the path, when ``exc`` says a local store's path cannot hold
    runs (a remote store's errors are its being down: the run spools)."""
    if not isinstance(store.fs, LocalFileSystem):
        return None
    for cause in chain(exc):
        if isinstance(cause, OSError) and cause.errno in _BAD_PATH_ERRNOS:
            where = f" ({cause.filename})" if cause.filename else ""
            return TrackerConfigError(
                f"the store {url!r} cannot hold runs: {cause.strerror}{where}"
            )
    return None


def _as_mapping(config: object) -> Mapping[str, object]:
    if isinstance(config, Mapping):
        return config
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if hasattr(config, "__dict__"):
        return dict(vars(config))
    raise TypeError(
        f"config must be a mapping, a dataclass or an object with attributes, "
        f"got {type(config).__name__}"
    )


__all__ = ["DEFAULT_DIR", "ENV_DIR", "init", "open_store", "store_dir"]

