"""A matplotlib backend for confined sessions: figures render with Agg and show as PNGs.

Selected through `MPLBACKEND=module://sandbox_kernel_ext.runner.child.figures` in a Python
child's environment. `plt.show()` shows every open figure now; figures still open when a
cell ends are shown then (`display.flush_figures`), as `%matplotlib inline` does.
"""

from __future__ import annotations

from typing import Any

from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg

from .display import flush_figures

FigureCanvas = FigureCanvasAgg
FigureManager = FigureManagerBase


def show(*args: Any, **kwargs: Any) -> None:
    flush_figures()
