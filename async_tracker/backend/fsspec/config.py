"""torchx's tracker config file for the fsspec backend: ``key=value`` lines, dotted keys nest."""

from __future__ import annotations

import re
from typing import Any

import fsspec

from async_tracker.errors import TrackerConfigError


def _put_config(config: dict[str, Any], key: str, value: object, where: str) -> None:
    parts = key.split(".")
    if any(not p for p in parts):
        raise TrackerConfigError(f"{where}: malformed key {key!r}")
    node = config
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise TrackerConfigError(f"{where}: key {key!r} conflicts with a value set earlier")
        node = child
    node[parts[-1]] = value


_INT = re.compile(r"[+-]?(0|[1-9][0-9]*)")
# A number with a leading zero ("007", "01.5") stays text: it may be an id or a secret.
_FLOAT = re.compile(r"[+-]?(0|[1-9][0-9]*)(\.[0-9]*)?([eE][+-]?[0-9]+)?|[+-]?\.[0-9]+")
# Keys whose values stay text even when they look like numbers: credentials, and names.
_TEXT_KEYS = re.compile(r"key|secret|token|password|passwd|profile|name|path|url|bucket")


def _config_value(key: str, raw: str) -> object:
    """``raw`` as fsspec's options want it: booleans and numbers parsed (``timeout=30``,
    ``config_kwargs.retries.max_attempts=5``), text otherwise. Numbers with a leading zero
    and values of credential- or name-like keys stay text: ``0123`` may be a secret."""
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    if _TEXT_KEYS.search(key.rsplit(".", 1)[-1].lower()):
        return raw
    if _INT.fullmatch(raw):
        return int(raw)
    if _FLOAT.fullmatch(raw):
        return float(raw)
    return raw


def read_config(config_file: str) -> dict[str, Any]:
    """Reads torchx's ``key=value`` tracker config: ``#`` comments, dotted keys nest.

    Values are never logged nor put in error messages: configs hold credentials.
    """
    try:
        with fsspec.open(config_file, "rt", encoding="utf-8") as f:
            text = f.read()
    except (OSError, ValueError) as exc:
        raise TrackerConfigError(f"cannot read tracker config {config_file!r}: {exc}") from exc
    config: dict[str, Any] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ";")):
            continue
        key, sep, value = stripped.partition("=")
        where = f"{config_file}, line {lineno}"
        if not sep or not key.strip():
            raise TrackerConfigError(f"{where}: expected key=value")
        _put_config(config, key.strip(), _config_value(key.strip(), value.strip()), where)
    return config
