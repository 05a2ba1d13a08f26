"""The local dashboard: ``async-tracker ui`` (needs ``pip install 'async-tracker[ui]'``).

A small ASGI app (Starlette, served by uvicorn) over a store's read API, with a page of
plain HTML, CSS and JavaScript and the vendored uPlot chart library: the runs table, their
curves overlaid, a run's details, following live runs. See docs/ui.md.
"""

from __future__ import annotations

from async_tracker.ui.server import serve

__all__ = ["serve"]
