"""Which trackers to use, the torchx way: ``.torchxconfig`` and ``TORCHX_*`` variables.

``.torchxconfig`` is read from the home directory, then the working directory (which wins),
or only from the file ``TORCHXCONFIG`` names::

    [torchx:tracker]
    fsspec =                                  # the name is the factory (torchx reads only keys)
    mine = my_package.trackers:create         # unlike torchx, a value names the factory

    [tracker:fsspec]
    config = /path/to/fsspec.cfg

``TORCHX_TRACKERS`` and ``TORCHX_TRACKER_<NAME>_CONFIG`` override the files, and
``ASYNC_TRACKER_FACTORY_<NAME>=module:factory`` overrides a name's factory: it is how
``async-tracker run`` hands a ``name = module:factory`` value to the job (torchx's variables
have no room for it).
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from async_tracker.errors import TrackerConfigError
from async_tracker.factory import (
    ENV_TORCHX_TRACKERS,
    AnyTracker,
    Factory,
    build_tracker,
    load_factory,
    tracker_config_env_var_name,
    tracker_factory_env_var_name,
    trackers_config_from_environ,
)

TORCHXCONFIG_ENV = "TORCHXCONFIG"
CONFIG_FILE = ".torchxconfig"


factory_env_var_name = tracker_factory_env_var_name


@dataclass(frozen=True)
class TrackerSpec:
    """A tracker to build: its name (the spool key), its factory, and its config string."""

    name: str
    factory: str
    config: str | None

    def load(self) -> Factory:
        """The factory, imported but not called: checks a spec without side effects."""
        return load_factory(self.factory)

    def build(self) -> AnyTracker:
        return build_tracker(self.name, self.factory, self.config)


def config_files(cwd: Path | None = None, environ: Mapping[str, str] | None = None) -> list[Path]:
    """The ``.torchxconfig`` files to read, the later winning: ``$TORCHXCONFIG`` alone, else
    ``~/.torchxconfig`` then ``./.torchxconfig``, those that exist."""
    env = os.environ if environ is None else environ
    if env.get(TORCHXCONFIG_ENV):
        return [Path(env[TORCHXCONFIG_ENV])]
    home = Path(env.get("HOME", str(Path.home()))) / CONFIG_FILE
    here = (cwd or Path.cwd()) / CONFIG_FILE
    return [p for p in dict.fromkeys([home, here]) if p.exists()]


def read_torchxconfig(paths: Sequence[Path]) -> list[TrackerSpec]:
    """The trackers of ``[torchx:tracker]``, with their ``[tracker:<name>] config``."""
    parser = configparser.ConfigParser(inline_comment_prefixes=("#", ";"))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keep names' case
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                parser.read_file(f, str(path))
        except (OSError, configparser.Error) as exc:
            raise TrackerConfigError(f"cannot read {path}: {exc}") from exc
    if not parser.has_section("torchx:tracker"):
        return []
    specs = []
    for name, value in parser.items("torchx:tracker"):
        section = f"tracker:{name}"
        config = parser.get(section, "config", fallback=None) or None
        specs.append(TrackerSpec(name, value.strip() or name, config))
    return specs


def configured_trackers(
    cwd: Path | None = None, environ: Mapping[str, str] | None = None
) -> list[TrackerSpec]:
    """The trackers the environment names, else those of ``.torchxconfig``.

    A name's factory is ``ASYNC_TRACKER_FACTORY_<NAME>``, else its ``.torchxconfig`` value,
    else the name; its config is ``TORCHX_TRACKER_<NAME>_CONFIG``, else ``[tracker:<name>]``.
    """
    env = os.environ if environ is None else environ
    from_env = trackers_config_from_environ(env)
    from_files = {s.name: s for s in read_torchxconfig(config_files(cwd, env))}
    names = list(from_env) if from_env else list(from_files)
    specs = []
    for name in names:
        in_file = from_files.get(name)
        factory = env.get(factory_env_var_name(name)) or (in_file.factory if in_file else name)
        config = env.get(tracker_config_env_var_name(name))
        if config is None and in_file is not None:
            config = in_file.config
        specs.append(TrackerSpec(name, factory, config))
    return specs


def resolve_tracker(
    name: str,
    config: str | None = None,
    cwd: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> TrackerSpec:
    """The tracker ``--tracker NAME [--config CFG]`` means: a configured name keeps its
    factory (and its config unless ``config`` is given); any other name is the factory."""
    for spec in configured_trackers(cwd, environ):
        if spec.name == name:
            return TrackerSpec(name, spec.factory, config if config is not None else spec.config)
    return TrackerSpec(name, name, config)


def job_environ(specs: Sequence[TrackerSpec]) -> dict[str, str]:
    """The variables that give a job these trackers, as torchx's runner sets them:
    ``TORCHX_TRACKERS`` (the names) and ``TORCHX_TRACKER_<NAME>_CONFIG`` (when configured),
    plus ``ASYNC_TRACKER_FACTORY_<NAME>`` for a name whose factory is not the name itself."""
    env: dict[str, str] = {}
    seen: set[str] = set()
    for spec in specs:
        if not spec.name or spec.name != spec.name.strip() or "," in spec.name:
            raise TrackerConfigError(
                f"tracker name {spec.name!r} cannot go in {ENV_TORCHX_TRACKERS} "
                "(it is a comma-separated list)"
            )
        if spec.name.upper() in seen:
            raise TrackerConfigError(
                f"two trackers named {spec.name!r} (names are compared without case in "
                "TORCHX_TRACKER_<NAME>_CONFIG)"
            )
        seen.add(spec.name.upper())
        if spec.config:
            env[tracker_config_env_var_name(spec.name)] = spec.config
        if spec.factory != spec.name:
            env[factory_env_var_name(spec.name)] = spec.factory
    env[ENV_TORCHX_TRACKERS] = ",".join(s.name for s in specs)
    return env
