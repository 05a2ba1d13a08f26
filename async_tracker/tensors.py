"""Metric values that are tensors and arrays, read without stalling the caller's device.

``float(loss)`` on a CUDA tensor waits until the GPU has computed it: a device sync on every
logged step, which a launch-bound training loop pays in full. Instead, a CUDA value is
copied into pinned host memory with ``non_blocking=True`` and an event is recorded after the
copy on the tensor's current stream; the caller goes on at once. The record carries a
:class:`DeferredValue` through the ingress in its place in the run's order, and the tracker
loop reads the number once ``event.query()`` says the copy is done (see
:func:`settle`, called by the pipeline before a record is numbered): the caller's thread
never synchronises, and no batch, spool line or backend ever sees anything but a float.

Tensors on the CPU, numpy scalars and one-element arrays are read at once (``float()``: no
device to wait for). A tensor on another accelerator (MPS, XPU, XLA) is read with
``float()`` too, on the caller's thread: only CUDA (and ROCm, which torch calls ``cuda``)
has the copy-and-event path.

Neither torch nor numpy is imported here: a value can only be a tensor if torch is already
imported by the caller, so ``sys.modules`` answers without importing anything (numpy may be
there half imported, by another thread: then no value is one of its types yet).
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable
from typing import Any

_second = operator.itemgetter(1)
# What a tensor of several values should have been instead.
_ONE = "log a 0-d or one-element tensor (e.g. loss.detach().mean())"


class DeferredValue:
    """A metric value still on its device: a host copy under way and the event after it.

    ``ready()`` is called on the tracker loop only; it never waits. Once the event has
    completed it reads the host copy (``value``), or keeps why it could not (``error``),
    and lets go of the buffer and the event.
    """

    __slots__ = ("_event", "_host", "error", "value")

    # Set once a process makes its first one: until then the pipeline skips looking for
    # them, so that a run that logs only floats pays nothing for this.
    made = False

    def __init__(self, host: Any, event: Any) -> None:
        self._host = host
        self._event = event
        self.value: float | None = None
        self.error: str | None = None
        DeferredValue.made = True

    def ready(self) -> bool:
        """Whether the value is known (or known to be lost); never blocks."""
        if self._host is None:
            return True
        try:
            if not self._event.query():
                return False
            self.value = float(self._host)
        except Exception as exc:  # a device error (a failed kernel): this point is lost
            self.error = f"the device failed to compute the value: {exc!r}"
        self._host = self._event = None
        return True

    def abandon(self, why: str) -> None:
        """Gives up on a value that is not ready (close's deadline passed)."""
        if self._host is not None:
            self._host = self._event = None
            self.error = why

    def __repr__(self) -> str:
        if self._host is not None:
            return "DeferredValue(pending)"
        return f"DeferredValue({self.value if self.error is None else self.error})"


def copy_after(tensor: Any, event: Any, *, pin: bool, stream: Any = None) -> DeferredValue:
    """Starts the copy of a one-element ``tensor`` into a host buffer (pinned when ``pin``,
    so that the copy is truly asynchronous), then records ``event`` on ``stream`` after it.
    Works on any device: the CUDA path uses it with a CUDA event, tests with a stand-in."""
    torch = sys.modules["torch"]
    source = tensor.detach().reshape(())
    host = torch.empty((), dtype=source.dtype, device="cpu", pin_memory=pin)
    host.copy_(source, non_blocking=True)
    event.record(stream)
    return DeferredValue(host, event)


def _defer_cuda(tensor: Any) -> DeferredValue:
    torch = sys.modules["torch"]
    # copy_ queues a device-to-host copy on the current stream of the tensor's device (not
    # of the current device, which may be another GPU); the event follows it on that same
    # stream, and is created on that stream's device when recorded.
    stream = torch.cuda.current_stream(tensor.device)
    return copy_after(tensor, torch.cuda.Event(), pin=True, stream=stream)


# Device types read without a sync: device type -> the function starting the copy.
DEFERRED_DEVICES: dict[str, Callable[[Any], DeferredValue]] = {"cuda": _defer_cuda}


def scalar_of(name: str, value: object) -> object:
    """What ``float()`` reads for a metric ``value``: a tensor or an array checked to hold
    one value (a 0-d view of it), a :class:`DeferredValue` for a CUDA tensor (not to be read
    now), anything else unchanged. Raises ``TypeError`` naming the metric for a tensor or
    array without exactly one value."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        # The is_* flags and dtype cost a tenth of device.type (this runs at every step).
        if value.is_meta:
            raise TypeError(f"metric {name!r}: a tensor on the meta device has no value")
        if value.numel() != 1:
            raise TypeError(
                f"metric {name!r}: a tensor of shape {tuple(value.shape)} has "
                f"{value.numel()} values; {_ONE}"
            )
        if value.dtype.is_complex:
            raise TypeError(f"metric {name!r}: a complex tensor is not a real number")
        device = "cpu" if value.is_cpu else "cuda" if value.is_cuda else value.device.type
        defer = DEFERRED_DEVICES.get(device)
        if defer is not None:
            return defer(value)
        # float() of a tensor that requires grad warns (a value is all we want here).
        return value.detach() if value.requires_grad else value
    numpy: Any = sys.modules.get("numpy")
    try:
        kinds: tuple[Any, ...] = () if numpy is None else (numpy.ndarray, numpy.generic)
    except AttributeError:
        # numpy half imported by another thread (the fsspec store imports it at its first
        # metric write, on the tracker's thread): no value is one of its types yet.
        kinds = ()
    if isinstance(value, kinds):
        # float() of a complex one keeps the real part and warns: refuse it, as a complex
        # tensor is refused.
        if value.dtype.kind == "c":
            raise TypeError(f"metric {name!r}: a complex value is not a real number")
        if isinstance(value, numpy.generic):
            return value
        if value.size != 1:
            raise TypeError(
                f"metric {name!r}: an array of shape {value.shape} has {value.size} values; "
                "log one value"
            )
        # float() of an array with dimensions is deprecated in numpy: read a 0-d view.
        return value.reshape(())
    return value


def settle(
    records: list[tuple[Any, ...]], give_up: str | None = None
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[str]]:
    """Replaces the deferred values of ``records`` (in call order) by their numbers.

    Returns the records up to the first value not ready yet, the rest from that one on
    (it waits, in order, for a later look), and what was lost: points whose device failed,
    and, with ``give_up`` (close's deadline has passed), points still not ready, which are
    then dropped with that reason instead of waiting. Records without a deferred value go
    through untouched; a list holding none costs one pass in C.
    """
    if DeferredValue not in set(map(type, map(_second, records))):
        return records, [], []
    out: list[tuple[Any, ...]] = []
    lost: list[str] = []
    for i, record in enumerate(records):
        value = record[1]
        if type(value) is DeferredValue:
            if not value.ready():
                if give_up is None:
                    return out, records[i:], lost
                value.abandon(give_up)
            if value.value is None:
                lost.append(f"metric {record[0]!r}: {value.error}")
                continue
            record = (record[0], value.value, *record[2:])
        out.append(record)
    return out, [], lost


