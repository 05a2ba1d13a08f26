"""``run.config``: a run's params, read and added to as W&B's ``run.config`` is.

Reading flushes the run's own writes and reads its metadata from the first backend (so it
sees what every process of the run recorded); ``update`` and item assignment are
``add_metadata``: they return at once and the value is checked at the call site.

Example::

    with async_tracker.init("mnist", config={"lr": 0.1}) as run:
        run.config.update({"batch_size": 64})
        run.config["optimizer"] = "adam"
        assert run.config["lr"] == 0.1
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any


class RunConfig(Mapping[str, object]):
    """A run's metadata as a mapping that also takes new keys (``update``, ``config[k] = v``).
    Keys are never removed: a later value replaces an earlier one."""

    def __init__(
        self, read: Callable[[], Mapping[str, object]], write: Callable[..., None]
    ) -> None:
        self._read = read
        self._write = write

    def __getitem__(self, key: str) -> object:
        return self._read()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(dict(self._read()))

    def __len__(self) -> int:
        return len(self._read())

    def __contains__(self, key: object) -> bool:
        return key in self._read()

    def __setitem__(self, key: str, value: object) -> None:
        self.update({key: value})

    def update(self, values: Mapping[str, Any] | None = None, /, **more: Any) -> None:
        """Adds (or replaces) these keys of the run's metadata; all are checked before any is
        kept (a bad value raises naming its key)."""
        merged = {**(values or {}), **more}
        bad = [k for k in merged if not isinstance(k, str)]
        if bad:
            raise TypeError(f"config keys must be str, got {bad[0]!r}")
        if merged:
            self._write(**merged)

    def __repr__(self) -> str:
        return f"RunConfig({dict(self._read())!r})"


__all__ = ["RunConfig"]
