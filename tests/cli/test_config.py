"""Which trackers: ``.torchxconfig`` files, ``TORCHX_*`` and ``ASYNC_TRACKER_FACTORY_*``
variables, and the variables a launched job gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from async_tracker.config import (
    TrackerSpec,
    config_files,
    configured_trackers,
    factory_env_var_name,
    job_environ,
    resolve_tracker,
)
from async_tracker.errors import TrackerConfigError

CONFIG = """\
[torchx:tracker]
fsspec =
mine = pkg.trackers:create   # a value names the factory

[tracker:fsspec]
config = /etc/fsspec.cfg

[tracker:mine]
config = mine.cfg
"""


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    (tmp_path / ".torchxconfig").write_text(CONFIG)
    return tmp_path


def test_files_in_order(tmp_path: Path) -> None:
    home, here = tmp_path / "h", tmp_path / "w"
    home.mkdir()
    here.mkdir()
    assert config_files(here, {"HOME": str(home)}) == []
    (home / ".torchxconfig").write_text("")
    (here / ".torchxconfig").write_text("")
    assert config_files(here, {"HOME": str(home)}) == [
        home / ".torchxconfig",
        here / ".torchxconfig",
    ]
    assert config_files(here, {"HOME": str(home), "TORCHXCONFIG": "/x/cfg"}) == [Path("/x/cfg")]


def test_from_the_file(cwd: Path) -> None:
    assert configured_trackers(cwd, {"HOME": str(cwd)}) == [
        TrackerSpec("fsspec", "fsspec", "/etc/fsspec.cfg"),
        TrackerSpec("mine", "pkg.trackers:create", "mine.cfg"),
    ]


def test_environment_names_and_configs_win(cwd: Path) -> None:
    env = {
        "HOME": str(cwd),
        "TORCHX_TRACKERS": "mine,other",
        "TORCHX_TRACKER_MINE_CONFIG": "env.cfg",
        "TORCHX_TRACKER_OTHER_CONFIG": "other.cfg",
    }
    assert configured_trackers(cwd, env) == [
        TrackerSpec("mine", "pkg.trackers:create", "env.cfg"),
        TrackerSpec("other", "other", "other.cfg"),
    ]


def test_config_variable_without_names(cwd: Path) -> None:
    env = {"HOME": str(cwd), "TORCHX_TRACKER_FSSPEC_CONFIG": "env.cfg"}
    assert configured_trackers(cwd, env)[0] == TrackerSpec("fsspec", "fsspec", "env.cfg")


def test_factory_variable(cwd: Path) -> None:
    env = {
        "HOME": str(cwd),
        "TORCHX_TRACKERS": "mine",
        factory_env_var_name("mine"): "other.pkg:make",
    }
    assert factory_env_var_name("mine") == "ASYNC_TRACKER_FACTORY_MINE"
    assert configured_trackers(cwd, env) == [TrackerSpec("mine", "other.pkg:make", "mine.cfg")]


def test_resolve_flag(cwd: Path) -> None:
    env = {"HOME": str(cwd)}
    assert resolve_tracker("mine", None, cwd, env) == TrackerSpec(
        "mine", "pkg.trackers:create", "mine.cfg"
    )
    assert resolve_tracker("mine", "x.cfg", cwd, env).config == "x.cfg"
    assert resolve_tracker("pkg:make", "y", cwd, env) == TrackerSpec("pkg:make", "pkg:make", "y")


def test_malformed_file(tmp_path: Path) -> None:
    (tmp_path / ".torchxconfig").write_text("[torchx:tracker\nfsspec=\n")
    with pytest.raises(TrackerConfigError, match="cannot read"):
        configured_trackers(tmp_path, {"HOME": str(tmp_path)})


def test_job_environ() -> None:
    env = job_environ(
        [
            TrackerSpec("fsspec", "fsspec", "/etc/fsspec.cfg"),
            TrackerSpec("mine", "pkg.trackers:create", None),
        ]
    )
    assert env == {
        "TORCHX_TRACKERS": "fsspec,mine",
        "TORCHX_TRACKER_FSSPEC_CONFIG": "/etc/fsspec.cfg",
        "ASYNC_TRACKER_FACTORY_MINE": "pkg.trackers:create",
    }


@pytest.mark.parametrize("names", [["a,b"], [" a"], ["a", "A"]])
def test_job_environ_refuses_names(names: list[str]) -> None:
    with pytest.raises(TrackerConfigError):
        job_environ([TrackerSpec(n, n, None) for n in names])
