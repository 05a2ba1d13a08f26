"""Which trackers to use, the torchx way: ``.torchxconfig`` and ``TORCHX_*`` variables.

``.torchxconfig`` is read from the home directory, then the working directory (which wins),
or only from the file ``TORCHXCONFIG`` names::

    [torchx:tracker]
    fsspec =                                  # the name is the factory (torchx reads only keys)
    mine = my_package.trackers:create         # unlike torchx, a value names the factory

    [tracker:fsspec]
    config = /path/to/fsspec.cfg

``TORCHX_TRACKERS`` and ``TORCHX_TRACKER_<NAME>_CONFIG`` override the files.
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from async_tracker.errors import TrackerConfigError
from async_tracker.factory import (
    AnyTracker,
    load_factory,
    tracker_config_env_var_name,
    trackers_config_from_environ,
)

TORCHXCONFIG_ENV = "TORCHXCONFIG"
CONFIG_FILE = ".torchxconfig"


@dataclass(frozen=True)
class TrackerSpec:
    """A tracker to build: its name (the spool key), its factory, and its config string."""

    name: str
    factory: str
    config: str | None

    def build(self) -> AnyTracker:
        try:
            tracker = load_factory(self.factory)(self.config)
        except TrackerConfigError:
            raise
        except Exception as exc:
            raise TrackerConfigError(
                f"tracker {self.name!r}: factory {self.factory!r} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return tracker


def config_files(cwd: Path | None = None, environ: Mapping[str, str] | None = None) -> list[Path]:
    env = os.environ if environ is None else environ
    if env.get(TORCHXCONFIG_ENV):
        return [Path(env[TORCHXCONFIG_ENV])]
    home = Path(env.get("HOME", str(Path.home()))) / CONFIG_FILE
    here = (cwd or Path.cwd()) / CONFIG_FILE
    return [p for p in dict.fromkeys([home, here]) if p.exists()]


def read_torchxconfig(paths: list[Path]) -> list[TrackerSpec]:
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
    """The trackers the environment names, else those of ``.torchxconfig``."""
    env = os.environ if environ is None else environ
    from_env = trackers_config_from_environ(env)
    from_files = {s.name: s for s in read_torchxconfig(config_files(cwd, env))}
    if from_env:
        return [
            TrackerSpec(
                name,
                from_files[name].factory if name in from_files else name,
                config if config is not None else (
                    from_files[name].config if name in from_files else None
                ),
            )
            for name, config in from_env.items()
        ]
    return [
        TrackerSpec(s.name, s.factory, env.get(tracker_config_env_var_name(s.name), s.config))
        for s in from_files.values()
    ]
