"""Reading a log directory back the way TensorBoard does: its own ``EventAccumulator``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.util import tensor_util


def accumulate(logdir: str | Path) -> EventAccumulator:
    """Every event of a run folder (no sampling: TensorBoard keeps 10 tensors per tag by
    default)."""
    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    return acc


def scalars(acc: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    """(step, value) of each point of ``tag``, in the order TensorBoard read them."""
    return [(e.step, tensor_util.make_ndarray(e.tensor_proto).item()) for e in acc.Tensors(tag)]


def text(acc: EventAccumulator, tag: str) -> list[list[str]]:
    """The last table written under a text tag, as rows of cells."""
    array = tensor_util.make_ndarray(acc.Tensors(tag)[-1].tensor_proto)
    return [[c.decode() if isinstance(c, bytes) else str(c) for c in row] for row in array]


def f32(value: float) -> float:
    """``value`` as TensorBoard shows it: its scalars are float32 (beyond its range, an
    infinity)."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))
