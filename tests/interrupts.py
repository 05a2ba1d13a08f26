"""Exceptions injected between two bytecodes, as a signal handler raises them."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any


class Interrupt(KeyboardInterrupt):
    """What the tracer raises: a KeyboardInterrupt, as Ctrl-C raises it."""


def interrupted_at(k: int, call: Callable[[], object]) -> bool:
    """Runs ``call``, raising :class:`Interrupt` at its ``k``-th opcode (counting every frame
    it runs); True if the interrupt happened, False if the call ran to its end first."""
    count = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        frame.f_trace_opcodes = True
        if event == "opcode":
            count += 1
            if count == k:
                raise Interrupt
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        call()
    except Interrupt:
        return True
    finally:
        sys.settrace(previous)
    return False
