"""Interactive charts from a sandboxed cell: the figure crosses as data, the library that
draws it comes from the kernel's own environment.

A plotly figure (`application/vnd.plotly.v1+json`) is drawn inside the same isolated frame
as a sandbox's HTML (opaque origin, a CSP that fetches nothing). What may run there is
pinned by hash: plotly.js read here from the kernel environment's `plotly` package, never
a script the sandbox sent, and our start-up script. The figure itself is JSON in a data
block no browser runs, escaped so that nothing in it can close that block. Why the kernel's
environment: it is already trusted (the kernel imports its code), it works with no network,
and no sandbox writes it (`policy/write_protected.py` keeps it read-only even inside a
writable root). Each chart carries
its own copy of plotly.js (about 5 MB in the notebook), as plotly's own offline output does:
a frame with an opaque origin shares nothing, not even a cache.

What the frame cannot do, the chart cannot do: load map tiles or topojson (no fetch), open
a link or download a PNG (no popups, no downloads); a click on a link does nothing.
"""

from __future__ import annotations

import base64
import hashlib
import html
import importlib.util
import json
import threading
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["PLOTLY_MIME", "TrustedScript", "trusted_script", "plotly_parts", "library_bytes",
           "CHART_NOTES"]

PLOTLY_MIME = "application/vnd.plotly.v1+json"

# Formats a chart library sends that have no isolated renderer here: the line that says why
# the chart shows as text, and what shows it instead.
CHART_NOTES = {
    "application/vnd.vegalite.": (
        "[sandbox] a Vega-Lite chart (Altair) shows as text here: it has no isolated renderer "
        "yet; alt.renderers.enable('png') (with vl-convert-python) shows it as an image"),
    "application/vnd.vega.": (
        "[sandbox] a Vega chart shows as text here: it has no isolated renderer yet"),
    "application/vnd.bokehjs_": (
        "[sandbox] a Bokeh plot shows as text here: it has no isolated renderer yet; "
        "bokeh.io.export_png shows it as an image"),
}
PLOTLY_MISSING_NOTE = ("[sandbox] a plotly figure shows as text here: the kernel's environment "
                       "has no plotly package whose plotly.js could draw it (pip install plotly "
                       "there)")

# Config keys a sandbox may set: how the chart behaves in its frame. The others could point
# plotly at a server (plotlyServerURL, topojsonURL) or carry keys (mapboxAccessToken).
_CONFIG_KEYS = frozenset({"scrollZoom", "displayModeBar", "staticPlot", "editable",
                          "doubleClick", "showAxisDragHandles", "showTips", "displaylogo",
                          "modeBarButtonsToRemove", "locale", "responsive", "autosizable"})

# Our start-up script: no link in the frame does anything when clicked (plotly draws links
# from the figure's text, and a `target="_self"` one would navigate the frame), then the
# figure is read from its data block and drawn.
_START = ("document.addEventListener('click',function(e){var t=e.target;"
          "if(t&&t.closest&&t.closest('a'))e.preventDefault();},true);"
          "var f=JSON.parse(document.getElementById('figure').textContent);"
          "Plotly.newPlot(document.getElementById('plot'),f.data,f.layout,f.config);")


class TrustedScript(NamedTuple):
    """A script an isolated frame may run: its CSP hash source, and its element escaped
    once for a frame's srcdoc attribute (plotly.js is megabytes; escaping is per character,
    so the pieces of a document can be escaped apart)."""

    text: str
    source: str
    element: str


def trusted_script(text: str) -> TrustedScript:
    digest = base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode()
    return TrustedScript(text, f"'sha256-{digest}'",
                         html.escape(f"<script>{text}</script>", quote=True))


START_SCRIPT = trusted_script(_START)
_cache: dict[tuple[str, int, int], TrustedScript] = {}
_cache_lock = threading.Lock()


def _plotly_js() -> TrustedScript | None:
    """plotly.js from the kernel environment's plotly package (found without importing it),
    read again only when the file changes; None without one, or with one that could not
    sit inline in a page."""
    try:
        spec = importlib.util.find_spec("plotly")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / "package_data" / "plotly.min.js"
    try:
        stat = path.stat()
        key = (str(path), stat.st_mtime_ns, stat.st_size)
        with _cache_lock:
            if key in _cache:
                return _cache[key]
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if "</script" in text.lower():
        return None
    script = trusted_script(text)
    with _cache_lock:
        _cache.clear()
        _cache[key] = script
    return script


def _data_block(value: Any) -> str:
    """JSON that cannot end its <script type="application/json"> element early: no `<`,
    `>` or `&` in it at all (JSON.parse reads the escapes back)."""
    text = json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def plotly_parts(figure: Any) -> tuple[str, tuple[TrustedScript, ...]] | str:
    """The frame's markup and scripts for a plotly figure, or the line saying why it shows
    as text instead."""
    if not isinstance(figure, dict) or not isinstance(figure.get("data", []), list) or (
            not isinstance(figure.get("layout", {}), dict)):
        return "[sandbox] a plotly figure shows as text here: its data is not a figure"
    library = _plotly_js()
    if library is None:
        return PLOTLY_MISSING_NOTE
    config = figure.get("config")
    kept = {k: v for k, v in config.items() if k in _CONFIG_KEYS} if isinstance(
        config, dict) else {}
    kept.setdefault("responsive", True)
    kept["displaylogo"] = False
    try:
        block = _data_block({"data": figure.get("data", []), "layout": figure.get("layout", {}),
                             "config": kept})
    except (TypeError, ValueError, RecursionError):
        return "[sandbox] a plotly figure shows as text here: its data is not plain JSON"
    markup = ("<div id=\"plot\" style=\"width:100%\"></div>"
              f"<script type=\"application/json\" id=\"figure\">{block}</script>")
    return markup, (library, START_SCRIPT)


def library_bytes(frame_html: str) -> int:
    """How much of an isolated frame's HTML is a chart library (the same few MB in every
    chart, not the sandbox's): a cell's display cap counts only the rest. Found by the
    library's escaped element, whose escaped `<script>` tag a sandbox's markup never yields
    (`inert_html` writes no script element, and escapes every `<` in text)."""
    with _cache_lock:
        libraries = list(_cache.values())
    return sum(len(library.element) for library in libraries
               if library.element[:4096] in frame_html)
