"""Backends from names: entry points, ``module:attr`` paths, and the ``TORCHX_*`` environment.

A factory is ``factory(config: str | None)`` returning a ``TrackerBase``, an
``AsyncTrackerBase``, or any object with ``TrackerBase``'s eight methods: torchx's own
factories (``torchx.tracker.backend.fsspec:create``, ``torchx.tracker.mlflow:create_tracker``)
and plug-ins return subclasses of torchx's ``TrackerBase``, which run like ours. A name is looked
up in the entry-point group ``async_tracker.tracker``, then ``torchx.tracker`` (so torchx's own
plug-ins keep working), then as a ``module:attr`` path. Unlike torchx, which warns and tracks
nothing, a name that resolves to nothing is an error.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import entry_points

from async_tracker.adapters import TrackerLike, tracker_problem
from async_tracker.base import AsyncTrackerBase, TrackerBase
from async_tracker.errors import TrackerConfigError

logger = logging.getLogger(__name__)

ENV_TORCHX_TRACKERS = "TORCHX_TRACKERS"
ENV_TORCHX_PARENT_RUN_ID = "TORCHX_PARENT_RUN_ID"
ENV_TORCHX_JOB_ID = "TORCHX_JOB_ID"
UNDEFINED_JOB_ID = "<UNDEFINED>"
ENTRY_POINT_GROUPS = ("async_tracker.tracker", "torchx.tracker")

AnyTracker = TrackerBase | AsyncTrackerBase | TrackerLike
Factory = Callable[[str | None], AnyTracker]


def tracker_config_env_var_name(entrypoint_key: str) -> str:
    """``TORCHX_TRACKER_<NAME>_CONFIG``: where the config string of tracker ``NAME`` lives."""
    return f"TORCHX_TRACKER_{entrypoint_key.upper()}_CONFIG"


ENV_FACTORY_PREFIX = "ASYNC_TRACKER_FACTORY_"


def tracker_factory_env_var_name(name: str) -> str:
    """``ASYNC_TRACKER_FACTORY_<NAME>``: the factory of tracker ``NAME`` when it is not the
    name itself (``[torchx:tracker] name=module:factory``, set by ``async-tracker run``)."""
    return f"{ENV_FACTORY_PREFIX}{name.upper()}"


def load_factory(name: str) -> Factory:
    """The factory called ``name``, or :class:`TrackerConfigError` saying what was tried."""
    tried: list[str] = []
    for group in ENTRY_POINT_GROUPS:
        for ep in entry_points(group=group):
            if ep.name == name:
                try:
                    obj = ep.load()
                except Exception as exc:
                    raise TrackerConfigError(
                        f"tracker {name!r}: entry point {ep.value!r} in group {group!r} "
                        f"failed to load: {exc}"
                    ) from exc
                return _callable(name, obj, f"entry point {ep.value!r}")
        tried.append(f"entry point group {group!r}")
    module_path, _, attr = name.partition(":")
    try:
        obj = importlib.import_module(module_path)
        for part in filter(None, attr.split(".")):
            obj = getattr(obj, part)
        return _callable(name, obj, f"module path {name!r}")
    except (ImportError, AttributeError, ValueError, TypeError) as exc:
        tried.append(f"module path {name!r} ({type(exc).__name__}: {exc})")
    raise TrackerConfigError(
        f"no tracker factory named {name!r}; tried: " + "; ".join(tried)
    )


def registered_factories() -> list[str]:
    """The names of the factories installed as entry points (``fsspec``, ``mlflow``,
    ``tensorboard``, and plug-ins'), in lookup order."""
    names = [ep.name for group in ENTRY_POINT_GROUPS for ep in entry_points(group=group)]
    return list(dict.fromkeys(names))


def _callable(name: str, obj: object, where: str) -> Factory:
    if not callable(obj):
        raise TrackerConfigError(f"tracker {name!r}: {where} is not callable ({obj!r})")
    return obj


def build_tracker(name: str, factory: str, config: str | None) -> AnyTracker:
    """Calls the factory named ``factory`` with ``config`` (the string, as torchx passes it)
    and checks what it returns; every failure is a :class:`TrackerConfigError` naming
    ``name``."""
    make = load_factory(factory)
    try:
        tracker = make(config)
    except TrackerConfigError:
        raise
    except Exception as exc:
        raise TrackerConfigError(
            f"tracker {name!r}: factory {factory!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    problem = tracker_problem(tracker)
    if problem is not None:
        raise TrackerConfigError(f"tracker {name!r}: factory {factory!r} returned {problem}")
    return tracker


def build_named_trackers(
    factory_and_config: Mapping[str, str | None],
    factories: Mapping[str, str] | None = None,
) -> list[tuple[str, AnyTracker]]:
    """Builds each tracker and keeps the name it was built under (the spool key).
    ``factories`` maps a name to its factory where the two differ."""
    return [
        (name, build_tracker(name, (factories or {}).get(name) or name, config))
        for name, config in factory_and_config.items()
    ]


def build_trackers(factory_and_config: Mapping[str, str | None]) -> list[AnyTracker]:
    """torchx's ``build_trackers``: one tracker per ``{factory_name: config}`` entry."""
    return [t for _, t in build_named_trackers(factory_and_config)]


def trackers_config_from_environ(
    environ: Mapping[str, str] | None = None,
) -> dict[str, str | None]:
    """``{name: config}`` from ``TORCHX_TRACKERS`` and ``TORCHX_TRACKER_<NAME>_CONFIG``."""
    env = os.environ if environ is None else environ
    names = [n.strip() for n in env.get(ENV_TORCHX_TRACKERS, "").split(",") if n.strip()]
    return {n: env.get(tracker_config_env_var_name(n)) for n in names}


def factories_from_environ(
    names: Iterable[str], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``{name: factory}`` from ``ASYNC_TRACKER_FACTORY_<NAME>`` variables."""
    env = os.environ if environ is None else environ
    return {n: env[v] for n in names if env.get(v := tracker_factory_env_var_name(n))}


def trackers_from_environ() -> list[AnyTracker]:
    """torchx's ``trackers_from_environ``: the trackers ``TORCHX_TRACKERS`` names, built."""
    config = trackers_config_from_environ()
    return [t for _, t in build_named_trackers(config, factories_from_environ(config))]
