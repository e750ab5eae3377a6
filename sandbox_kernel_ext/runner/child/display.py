"""Rich output from inside a confined session: objects to MIME bundles, `display()`, figures.

Runs in the confined child. It plays the part IPython's display machinery plays in a kernel,
without loading IPython: objects become MIME bundles through their `_repr_*_` methods, and
`display`, `update_display`, `clear_output` (the builtins, and IPython's own functions once
user code imports them) send frames to the trusted side instead of printing reprs. Nothing
here is trusted: the trusted side checks and renders every frame (`trusted/display.py`).

Markdown is made HTML here (`markdown_as_html`), not on the trusted side: the conversion has
no time bound (mistune takes seconds on some inputs of a few hundred KB), and here its time
is the sandbox's own, counted against the cell's budget, not the kernel's.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import importlib.abc
import importlib.machinery
import io
import sys
import uuid
from collections.abc import Callable
from typing import Any

from ..wire import BOKEH_ITEM_MIME

try:
    import mistune
except ImportError:  # then Markdown crosses as it is, and the trusted side shows it as text
    mistune = None

__all__ = ["install", "mime_bundle", "json_safe", "markdown_as_html", "publish",
           "flush_figures"]

# `_repr_*_` methods in the order IPython's DisplayFormatter knows them.
_REPR_METHODS = (
    ("text/html", "_repr_html_"), ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"), ("image/png", "_repr_png_"), ("image/jpeg", "_repr_jpeg_"),
    ("text/latex", "_repr_latex_"), ("application/json", "_repr_json_"),
    ("application/javascript", "_repr_javascript_"), ("application/pdf", "_repr_pdf_"),
)
_BINARY = ("image/png", "image/jpeg", "application/pdf")
_MAX_REPR_CHARS = 1 << 20

# Markdown as HTML: tables and strike-through as GitHub's Markdown has them; no autolinks.
# Made once, in the launcher that forks every child (this module is loaded there).
_MARKDOWN = (mistune.create_markdown(escape=False, plugins=["table", "strikethrough"])
             if mistune is not None else None)
# HTML longer than this stays Markdown (shown as text): the frame would pass the trusted
# side's cap for one display (8 MiB of JSON), which ends the session.
_MAX_HTML_CHARS = 4 << 20

_send: Callable[[dict[str, Any]], None] | None = None
_flush_streams: Callable[[], None] = lambda: None


def _text(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # noqa: BLE001 - a broken __repr__ shows, as IPython shows it
        text = f"<{type(value).__name__} object (repr failed: {type(exc).__name__})>"
    return text if len(text) <= _MAX_REPR_CHARS else text[:_MAX_REPR_CHARS] + "…"


def _figure_png(figure: Any) -> str | None:
    """A matplotlib figure as base64 PNG (as the inline backend renders it), else None."""
    if type(figure).__module__ != "matplotlib.figure" or not hasattr(figure, "savefig"):
        return None
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


# Altair renderers whose output is HTML that loads Vega from a CDN (an empty box here: the
# trusted side runs no script a sandbox sends); its "mimetype" renderer gives the spec itself,
# which the trusted side draws (`trusted/charts.py`). A renderer the user chose stays.
_ALTAIR_HTML_RENDERERS = ("default", "html", "jupyterlab", "notebook", "colab", "kaggle")


def _chart_as_data(obj: Any) -> Any:
    """A context in which an Altair chart represents itself as its Vega-Lite spec."""
    altair = sys.modules.get("altair")
    if (altair is None or not type(obj).__module__.startswith("altair.")
            or getattr(altair.renderers, "active", None) not in _ALTAIR_HTML_RENDERERS):
        return contextlib.nullcontext()
    try:
        return altair.renderers.enable("mimetype")
    except Exception:  # noqa: BLE001 - an Altair without it: its own output, as it is
        return contextlib.nullcontext()


def mime_bundle(obj: Any, include: Any = None, exclude: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(data, metadata) for `obj`, the way IPython's formatter builds them: its
    `_repr_mimebundle_` first, then each `_repr_*_` for what is still missing, and `repr()`
    as text/plain. A method that fails is skipped (its error is no reason to lose the rest)."""
    data: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    method = getattr(type(obj), "_repr_mimebundle_", None)
    if method is not None:
        try:
            with _chart_as_data(obj):
                found = obj._repr_mimebundle_(include=include, exclude=exclude)
            if isinstance(found, tuple) and len(found) == 2:
                found, meta = found
                if isinstance(meta, dict):
                    metadata.update(meta)
            if isinstance(found, dict):
                data.update(found)
        except Exception:  # noqa: BLE001
            pass
    for mime, name in _REPR_METHODS:
        if mime in data or getattr(type(obj), name, None) is None:
            continue
        try:
            value = getattr(obj, name)()
        except Exception:  # noqa: BLE001
            continue
        if isinstance(value, tuple) and len(value) == 2:
            value, meta = value
            if isinstance(meta, dict):
                metadata[mime] = meta
        if value is None:
            continue
        if mime in _BINARY and isinstance(value, (bytes, bytearray)):
            value = base64.b64encode(bytes(value)).decode("ascii")
        data[mime] = value
    if "image/png" not in data:
        png = _figure_png(obj)
        if png is not None:
            data["image/png"] = png
    data.setdefault("text/plain", _text(obj))
    if include:
        data = {k: v for k, v in data.items() if k in include}
    if exclude:
        data = {k: v for k, v in data.items() if k not in exclude}
    return data, metadata


def json_safe(value: Any, depth: int = 0) -> Any:
    """What JSON can carry of a bundle value; the rest as its text (the trusted side checks
    every value again)."""
    if depth > 32:
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [json_safe(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {str(k): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    return _text(value)


def markdown_as_html(data: Any) -> Any:
    """A bundle with its `text/markdown` made `text/html` (the trusted side renders no
    Markdown: it rewrites this HTML and isolates it as any other). Unchanged if it has HTML
    already, or no Markdown text, or the conversion fails or makes too much HTML: the
    trusted side then shows the Markdown as text, with a line saying why."""
    if (not isinstance(data, dict) or _MARKDOWN is None
            or not isinstance(data.get("text/markdown"), str)
            or isinstance(data.get("text/html"), str)):
        return data
    try:
        markup = _MARKDOWN(data["text/markdown"])
    except Exception:  # noqa: BLE001 - (RecursionError, MemoryError) the text still shows
        return data
    if not isinstance(markup, str) or len(markup) > _MAX_HTML_CHARS:
        return data
    converted = {mime: value for mime, value in data.items() if mime != "text/markdown"}
    converted["text/html"] = markup
    return converted


def publish(data: dict[str, Any], metadata: dict[str, Any] | None = None, *,
            display_id: str | None = None, update: bool = False) -> None:
    """Send one display to the trusted side (after the text printed before it)."""
    if _send is None:
        return
    _flush_streams()
    _send({"type": "display", "data": json_safe(markdown_as_html(data)),
           "metadata": json_safe(metadata or {}), "display_id": display_id, "update": update})


class DisplayHandle:
    """An updatable display, as IPython's `DisplayHandle` (used when IPython is not loaded)."""

    def __init__(self, display_id: str | None = None) -> None:
        self.display_id = display_id or uuid.uuid4().hex

    def __repr__(self) -> str:
        return f"<DisplayHandle display_id={self.display_id}>"

    def display(self, obj: Any, **kwargs: Any) -> None:
        display(obj, display_id=self.display_id, **kwargs)

    def update(self, obj: Any, **kwargs: Any) -> None:
        update_display(obj, display_id=self.display_id, **kwargs)


def display(*objs: Any, include: Any = None, exclude: Any = None, metadata: Any = None,
            transient: Any = None, display_id: Any = None, raw: bool = False,
            clear: bool = False, **kwargs: Any) -> Any:
    """IPython's `display()`, sending each object's bundle to the trusted side."""
    if transient and isinstance(transient, dict) and "display_id" in transient:
        display_id = transient["display_id"]
    if display_id is True:
        display_id = uuid.uuid4().hex
    if clear:
        clear_output(wait=True)
    update = bool(kwargs.get("update"))
    for obj in objs:
        if raw and isinstance(obj, dict):
            data, meta = obj, dict(metadata or {})
        else:
            data, meta = mime_bundle(obj, include, exclude)
            if metadata:
                meta.update(metadata)
        publish(data, meta, display_id=display_id, update=update)
    if display_id and not update:
        return _handle_class()(display_id)
    return None


def update_display(obj: Any, *, display_id: str, **kwargs: Any) -> None:
    kwargs["update"] = True
    display(obj, display_id=display_id, **kwargs)


def clear_output(wait: bool = False) -> None:
    if _send is not None:
        _flush_streams()
        _send({"type": "clear_output", "wait": bool(wait)})


def _handle_class() -> type:
    module = sys.modules.get("IPython.core.display_functions")
    return getattr(module, "DisplayHandle", DisplayHandle) if module else DisplayHandle


def flush_figures() -> None:
    """Show every open matplotlib figure as a PNG and close it (the inline backend's end of
    cell): only when the cell's code loaded pyplot."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    try:
        for number in pyplot.get_fignums():
            display(pyplot.figure(number))
    finally:
        pyplot.close("all")


# -- Bokeh: `output_notebook()` and `show(plot)` ------------------------------------------------
def _bokeh_load(*args: Any, **kwargs: Any) -> None:
    """`output_notebook()`: nothing to load (the trusted side brings BokehJS with each plot,
    from the kernel's own environment), and nothing shown."""


def _bokeh_show(obj: Any, state: Any, notebook_handle: Any = None) -> None:
    """`show(plot)` in a notebook: the plot crosses as its JSON item, never as the script
    Bokeh writes for a page (which a sandbox's display may not run). `push_notebook` has
    no handle to push through: the plot is drawn once."""
    from bokeh.embed import json_item

    publish({BOKEH_ITEM_MIME: json_item(obj), "text/plain": _text(obj)})


def _bokeh_app(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("a Bokeh server application cannot be shown from a sandboxed cell: it "
                       "needs a server the notebook page connects to; show a plot instead")


def _patch_bokeh(module: Any) -> None:
    """Bokeh's "jupyter" notebook hooks replaced by ours, once `bokeh.io` has installed its
    own (it refuses a second install of a name, so not earlier)."""
    install = getattr(sys.modules.get("bokeh.io.notebook"), "install_notebook_hook", None)
    if install is not None:
        install("jupyter", _bokeh_load, _bokeh_show, _bokeh_app, overwrite=True)


# -- IPython's own functions, once user code imports them ---------------------------------------
def _patch_ipython(module: Any) -> None:
    """IPython's display functions replaced by ours, wherever user code reaches them."""
    for name in ("display", "update_display", "clear_output"):
        if hasattr(module, name):
            setattr(module, name, globals()[name])


# Each module whose names are replaced, and what replaces them once it has loaded.
_PATCHED: dict[str, Callable[[Any], None]] = {
    "IPython.core.display_functions": _patch_ipython, "IPython.display": _patch_ipython,
    "bokeh.io": _patch_bokeh}


def _patch(module: Any) -> None:
    _PATCHED[module.__name__](module)


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        _patch(module)


class _PatchingFinder(importlib.abc.MetaPathFinder):
    """Finds IPython's display modules the usual way and patches them once loaded."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in _PATCHED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def install(send: Callable[[dict[str, Any]], None], flush_streams: Callable[[], None]) -> None:
    """Route displays to `send`; `flush_streams` runs first, so text printed before a
    display stays before it."""
    global _send, _flush_streams
    _send, _flush_streams = send, flush_streams
    builtins.display = display  # type: ignore[attr-defined] - as IPython puts it there
    sys.meta_path.insert(0, _PatchingFinder())
    for name in _PATCHED:
        if name in sys.modules:
            _patch(sys.modules[name])
