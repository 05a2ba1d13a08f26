"""Where the MLflow backend writes by default, how its HTTP client is tuned, and the
``[tracker:mlflow]`` section of a ``.torchxconfig`` that the ``mlflow`` factory reads."""

from __future__ import annotations

import configparser
import getpass
import os
import socket
from pathlib import Path

from async_tracker.errors import TrackerConfigError

__all__ = [
    "CONFIG_FILE_NAME",
    "CONFIG_KEYS",
    "CONFIG_SECTION",
    "DEFAULT_HTTP_MAX_RETRIES",
    "DEFAULT_HTTP_TIMEOUT_S",
    "DEFAULT_REQUEST_CONCURRENCY",
    "DEFAULT_TRACKING_DIR",
    "ENV_EXPERIMENT_NAME",
    "ENV_MLFLOW_TRACKING_URI",
    "configure_http_client",
    "default_experiment_name",
    "default_store_dir",
    "default_tracking_uri",
    "read_config",
]

CONFIG_FILE_NAME = ".torchxconfig"
CONFIG_SECTION = "tracker:mlflow"
CONFIG_KEYS = ("experiment_name", "tracking_uri", "artifact_location")
ENV_EXPERIMENT_NAME = "TORCHX_TRACKING_EXPERIMENT_NAME"
ENV_MLFLOW_TRACKING_URI = "MLFLOW_TRACKING_URI"
# The folder of the local store used when no tracking URI is given; None: the working
# directory, as MLflow's own default (``sqlite:///mlflow.db``, artifacts in ``./mlruns``), so
# that `mlflow ui` started there shows the runs, and a user finds them again (tests point it
# elsewhere: read it through default_store_dir(), never by importing the name).
DEFAULT_TRACKING_DIR: Path | None = None

# MLflow's HTTP client retries 7 times with exponential backoff by default (minutes while a
# server restarts) and waits 120 s per request. Our lane retries with its own backoff and
# close() has a deadline, so the client should fail fast and let the lane decide: one retry
# (urllib3 makes the first at once: it covers a pooled connection the server has just
# closed, so that a blocking read does not fail for that), and 20 s per request. These are set
# with os.environ.setdefault when a tracker is built: a value the user exported wins.
# (MLflow reads them at each request; it has no per-client setting.)
DEFAULT_HTTP_MAX_RETRIES = 1
DEFAULT_HTTP_TIMEOUT_S = 20
# log_batch requests of one flush sent at once: the server overlaps JSON parsing with the
# database write of the other request. More gains nothing against a SQLite store.
DEFAULT_REQUEST_CONCURRENCY = 2


def default_experiment_name() -> str:
    """torchx's default: ``default-experiment/<user>/<host>``."""
    try:
        user = getpass.getuser()
    except Exception:  # no user entry (some containers)
        user = "unknown"
    return f"default-experiment/{user}/{socket.getfqdn()}"


def default_store_dir() -> Path:
    """The directory of the default local store (``mlflow.db`` and ``mlruns/`` for the
    artifacts): the working directory, as for MLflow itself."""
    return DEFAULT_TRACKING_DIR if DEFAULT_TRACKING_DIR is not None else Path.cwd()


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else MLflow's own default, ``mlflow.db`` in the
    working directory (as an absolute ``sqlite:///`` URI).

    torchx defaulted to a ``file://`` store, which MLflow 3 no longer accepts by default.
    """
    env = os.environ.get(ENV_MLFLOW_TRACKING_URI)
    if env:
        return env
    return f"sqlite:///{default_store_dir() / 'mlflow.db'}"


def configure_http_client() -> None:
    """Fail fast, unless the user chose otherwise (see ``DEFAULT_HTTP_MAX_RETRIES``)."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(DEFAULT_HTTP_MAX_RETRIES))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(DEFAULT_HTTP_TIMEOUT_S))


def read_config(config: str | None) -> dict[str, str | None]:
    """The ``[tracker:mlflow]`` section of a ``.torchxconfig``: ``config`` is a directory
    holding one, or the file's path. ``None`` or empty: no config (defaults). Anything that
    cannot be read is a :class:`TrackerConfigError` saying why."""
    if config is None or not config.strip():
        return {}
    path = Path(config).expanduser()
    if path.is_dir():
        file = path / CONFIG_FILE_NAME
        if not file.is_file():
            raise TrackerConfigError(
                f"mlflow tracker config: directory {str(path)!r} has no {CONFIG_FILE_NAME} file"
            )
    elif path.is_file():
        file = path
    else:
        raise TrackerConfigError(
            f"mlflow tracker config {config!r} is neither a directory holding "
            f"{CONFIG_FILE_NAME} nor a config file"
        )
    # No interpolation: a '%' in a URI (an encoded password) must stay as written.
    parser = configparser.ConfigParser(interpolation=None)
    try:
        with open(file, encoding="utf-8") as f:
            parser.read_file(f)
    except (OSError, UnicodeDecodeError, configparser.Error) as exc:
        raise TrackerConfigError(
            f"mlflow tracker config {str(file)!r} cannot be read: {type(exc).__name__}: {exc}"
        ) from exc
    if not parser.has_section(CONFIG_SECTION):
        raise TrackerConfigError(
            f"mlflow tracker config {str(file)!r} has no [{CONFIG_SECTION}] section "
            f"(sections: {', '.join(parser.sections()) or 'none'})"
        )
    values = dict(parser.items(CONFIG_SECTION))
    values.pop("config", None)  # reserved by torchx for the tracker's own config string
    unknown = sorted(set(values) - set(CONFIG_KEYS))
    if unknown:
        raise TrackerConfigError(
            f"mlflow tracker config {str(file)!r}: unknown keys {unknown} in "
            f"[{CONFIG_SECTION}] (known: {', '.join(CONFIG_KEYS)})"
        )
    return {k: (v.strip() or None) for k, v in values.items()}
