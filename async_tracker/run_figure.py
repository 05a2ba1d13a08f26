"""The ``Figure`` that ``AppRun.plot()`` returns: a plain matplotlib ``Figure`` that a notebook
shows as an image by itself.

A bare ``Figure`` (drawn without pyplot, as :mod:`async_tracker.plotting` does) has no rich
display until pyplot's inline backend registers one, so a fresh kernel would print
``<Figure size 800x620 with 2 Axes>``. ``_repr_png_`` is IPython's hook for an image: the
figure renders itself, whatever backend (if any) the kernel has loaded. Imported only where
matplotlib is (the ``plot`` extra).
"""

from __future__ import annotations

import io

from matplotlib.figure import Figure

# The resolution of the image a notebook shows: matplotlib's savefig default.
NOTEBOOK_DPI = 100


class RunFigure(Figure):
    """A matplotlib ``Figure`` (``savefig``, ``axes`` ...) that Jupyter and IPython display
    as a PNG image."""

    def _repr_png_(self) -> bytes:
        out = io.BytesIO()
        self.savefig(out, format="png", dpi=NOTEBOOK_DPI)
        return out.getvalue()


__all__ = ["RunFigure"]
