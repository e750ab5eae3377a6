"""Closing a widget with everything it holds, once a static record has taken its place.

ipywidgets' `close()` closes one model: a box's children, and every widget's own `layout`
and `style` models, stay open in the kernel (and in the page's widget manager) for its life.
"""

from __future__ import annotations

import ipywidgets as widgets

__all__ = ["close_tree"]


def close_tree(widget: widgets.Widget) -> None:
    """Close `widget`, the widgets inside it, and their layouts and styles."""
    for inner in getattr(widget, "children", ()):
        close_tree(inner)
    for part in (getattr(widget, "layout", None), getattr(widget, "style", None)):
        if isinstance(part, widgets.Widget):
            part.close()
    widget.close()
