"""``async_tracker.init()``: a run in a local store in one call, without torchx's environment.

The store is an fsspec URL or path (default ``$ASYNC_TRACKER_DIR``, else ``./tracker_runs``),
written in torchx's layout by the fsspec backend, so the CLI (``async-tracker list jobs``) and
torchx's own reader find the runs. A run id is ``<project>/<name>-<6 hex digits>``, readable and
unique; ``id=`` opens a given run instead, resumed by default.
"""

from __future__ import annotations

import dataclasses
import os
import random
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import fsspec.core

from async_tracker.backend.fsspec import AsyncFsspecTracker
from async_tracker.errors import TrackerConfigError
from async_tracker.factory import AnyTracker, build_tracker
from async_tracker.records import check_name
from async_tracker.run import AppRun
from async_tracker.runtime.process import runtime
from async_tracker.settings import RunOptions

ENV_DIR = "ASYNC_TRACKER_DIR"
DEFAULT_DIR = "./tracker_runs"

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


def store_dir(dir: str | os.PathLike[str] | None = None) -> str:
    """The store ``init`` and the CLI use: ``dir``, else ``$ASYNC_TRACKER_DIR``, else
    ``./tracker_runs``."""
    return os.fspath(dir) if dir is not None else os.environ.get(ENV_DIR) or DEFAULT_DIR


def open_store(dir: str | os.PathLike[str] | None = None) -> AsyncFsspecTracker:
    """The fsspec backend over a store path or URL (``s3://bucket/prefix``, ``memory://x``)."""
    url = store_dir(dir)
    try:
        fs, root = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        raise TrackerConfigError(f"cannot open the store {url!r}: {exc}") from exc
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
    if "file" in protocols:
        root = os.path.abspath(root)  # the same store whatever the working directory becomes
    return AsyncFsspecTracker(fs, root)


def init(
    project: str,
    name: str | None = None,
    config: object = None,
    dir: str | os.PathLike[str] | None = None,
    *,
    id: str | None = None,
    resume: Resume = "allow",
    backends: Sequence[AnyTracker | str] = (),
    **options: Any,
) -> AppRun:
    """A new run of ``project`` in a local store, ready for ``with``.

    Args:
        project: groups runs; the first part of the run id.
        name: a readable name (default: an adjective and a noun); the id is
            ``<project>/<name>-<6 hex digits>``.
        config: recorded as the run's metadata: a mapping, a dataclass or any object with
            attributes (``argparse.Namespace``).
        dir: the store, a path or an fsspec URL (default ``$ASYNC_TRACKER_DIR``, else
            ``./tracker_runs``).
        id: open this run id instead of making one. An existing run is resumed: step-less
            points continue after its last step of each metric (``resume="allow"``, the
            default); ``resume="never"`` refuses an existing run, ``resume="must"`` a new one.
        backends: more backends beside the store: objects, or factory names (``"tensorboard"``,
            ``"mlflow"``, ``module:attr``) built with no config.
        options: ``AppRun`` options (``flush_interval``, ``durable``, ``close_timeout`` ...).
    """
    check_name(project, "project")
    if name is not None:
        check_name(name, "name")
    if resume not in ("allow", "never", "must"):
        raise ValueError(f"resume must be 'allow', 'never' or 'must', got {resume!r}")
    store = open_store(dir)
    if id is None:
        label = name or f"{random.choice(_ADJECTIVES)}-{random.choice(_NOUNS)}"
        id = f"{project}/{label}-{uuid.uuid4().hex[:6]}"
    else:
        check_name(id, "id")
    last_steps = _existing_steps(store, id, resume)
    extra = [build_tracker(b, b, None) if isinstance(b, str) else b for b in backends]
    # ASYNC_TRACKER_<OPTION> variables apply as with run_from_env(); keyword options win.
    options.setdefault("options", RunOptions.from_env())
    run = AppRun(id, [store, *extra], _last_steps=last_steps, **options)
    metadata: dict[str, object] = {"project": project}
    if config is not None:
        metadata.update(_as_mapping(config))
    run.add_metadata(**metadata)
    return run


def _existing_steps(store: AsyncFsspecTracker, run_id: str, resume: Resume) -> dict[str, int]:
    """The last step of each metric of ``run_id`` if the store holds it (as ``resume`` allows);
    {} for a new run."""

    async def read() -> tuple[bool, dict[str, int]]:
        exists = run_id in set(await store.run_ids())
        if not exists:
            return False, {}
        metrics = await store.metrics(run_id)
        return True, {k: max(p.step for p in pts) for k, pts in metrics.items() if pts}

    exists, steps = runtime().loop.call(read)
    if exists and resume == "never":
        raise TrackerConfigError(
            f"run {run_id!r} already exists in the store (resume='never'); "
            "pick another id, or resume='allow' to continue it"
        )
    if not exists and resume == "must":
        raise TrackerConfigError(f"run {run_id!r} is not in the store (resume='must')")
    return steps


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

