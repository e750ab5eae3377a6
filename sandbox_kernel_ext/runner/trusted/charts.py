"""Interactive charts from a sandboxed cell: the chart crosses as data, the library that
draws it comes from the kernel's own environment.

A plotly figure (`application/vnd.plotly.v1+json`) or a Vega/Vega-Lite spec (Altair's) is
drawn inside the same isolated frame as a sandbox's HTML (opaque origin, a CSP that fetches
nothing). What may run there is pinned by hash: the library, read here from a package
installed in the kernel's environment (plotly.js from `plotly`; Vega, Vega-Lite and
Vega-Embed from `vl-convert-python`'s bundle), never a script the sandbox sent, and our
start-up script. The chart itself is JSON in a data block no browser runs, escaped so that
nothing in it can close that block. Why the kernel's environment: it is already trusted
(the kernel imports its code), it works with no network, and no sandbox writes it
(`policy/write_protected.py` keeps it read-only even inside a writable root); a package the
kernel would find anywhere else on its path is not used (`installed_package`). Each chart
carries its own copy of its library (megabytes, in the notebook too), as offline HTML does:
a frame with an opaque origin shares nothing, not even a cache.

What the frame cannot do, the chart cannot do: load data, map tiles or topojson from a URL
(no fetch), open a link or download a PNG (no popups, no downloads); a click on a link does
nothing.
"""

from __future__ import annotations

import base64
import hashlib
import html
import importlib.metadata
import importlib.util
import json
import os
import re
import site
import threading
from pathlib import Path
from typing import Any, NamedTuple

from ..wire import BOKEH_ITEM_MIME
from .crossing_text import line_text

__all__ = ["PLOTLY_MIME", "VEGA_MIME", "BOKEH_ITEM_MIME", "TrustedScript", "trusted_script",
           "plotly_parts", "vega_parts", "bokeh_parts", "CHART_NOTES"]

PLOTLY_MIME = "application/vnd.plotly.v1+json"

# Formats a chart library sends that have no isolated renderer here: the line that says why
# the chart shows as text, and what shows it instead.
CHART_NOTES = {
    "application/vnd.bokehjs_": (
        "[sandbox] a Bokeh page script shows as text here: a sandbox's script never runs; "
        "bokeh's output_notebook() and show(plot) draw the plot from its data"),
}
# Vega and Vega-Lite specs (Altair's), as JupyterLab names their types (`+json`, and `.json`
# from Vega-Lite 6 on).
VEGA_MIME = re.compile(r"application/vnd\.vega(?:lite)?\.v\d+(?:\.\d+)*[.+]json\Z")
VEGA_MISSING_NOTE = ("[sandbox] a Vega-Lite chart (Altair) shows as text here: the kernel's "
                     "environment has no vl-convert-python whose Vega could draw it (pip "
                     "install vl-convert-python there)")
PLOTLY_MISSING_NOTE = ("[sandbox] a plotly figure shows as text here: the kernel's environment "
                       "has no plotly package whose plotly.js could draw it (pip install plotly "
                       "there)")

BOKEH_MISSING_NOTE = ("[sandbox] a Bokeh plot shows as text here: the kernel's environment has "
                      "no bokeh package whose BokehJS could draw it (pip install bokeh there)")

# Config keys a sandbox may set: how the chart behaves in its frame. The others could point
# plotly at a server (plotlyServerURL, topojsonURL) or carry keys (mapboxAccessToken).
_CONFIG_KEYS = frozenset({"scrollZoom", "displayModeBar", "staticPlot", "editable",
                          "doubleClick", "showAxisDragHandles", "showTips", "displaylogo",
                          "modeBarButtonsToRemove", "locale", "responsive", "autosizable"})

# Our start-up scripts (each in a function of its own: a library's top-level names are
# global): the chart is read from its data block and drawn. No link in the frame opens
# anything: the frame's first script (`display._SIZER`) sees to that in every frame; plotly
# draws links from the figure's text, and a `target="_self"` one would navigate the frame.
# Vega gets a loader of ours, frozen, that refuses every URL (data, images, and a mark's
# `href`, which would navigate the frame); `ast` has Vega interpret expressions instead of
# compiling them with `Function`, which the frame's CSP refuses.
_START = ("(function(){"
          "var f=JSON.parse(document.getElementById('figure').textContent);"
          "Plotly.newPlot(document.getElementById('plot'),f.data,f.layout,f.config);})();")
_BOKEH_START = (
    "(function(){"
    "var i=JSON.parse(document.getElementById('item').textContent),c=document."
    "getElementById('chart');Bokeh.embed.embed_item(i,'chart').catch(function(e){"
    "c.textContent='[sandbox] the chart could not be drawn: '+e.message;});})();")
_VEGA_START = (
    "(function(){"
    "var s=JSON.parse(document.getElementById('spec').textContent),c=document."
    "getElementById('chart'),n=function(){return Promise.reject(new Error("
    "'nothing is loaded or opened from a sandboxed chart'));},"
    "l=Object.freeze({load:n,sanitize:n,http:n,file:n});"
    "vegaEmbed(c,s,{ast:true,actions:false,loader:l}).catch(function(e){c.textContent="
    "'[sandbox] the chart could not be drawn: '+e.message;});})();")


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
VEGA_START_SCRIPT = trusted_script(_VEGA_START)
BOKEH_START_SCRIPT = trusted_script(_BOKEH_START)
_cache: dict[tuple[str, int, int], TrustedScript] = {}
_cache_lock = threading.Lock()
_vega: dict[str, TrustedScript] = {}  # by vl-convert's version, under _vega_lock
_vega_lock = threading.Lock()


def installed_package(name: str) -> Path | None:
    """The folder of package `name` as the kernel would import it, found without importing
    it, if it is an installed one: in a site-packages folder of the kernel's environment.
    Anywhere else on `sys.path` (the kernel's working folder comes first, and a policy may
    let a sandbox write in it) it is nobody's to trust: None."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    folder = Path(os.path.realpath(spec.origin)).parent
    sites = [*site.getsitepackages(), site.getusersitepackages()]
    if any(folder.is_relative_to(os.path.realpath(s)) for s in sites if s):
        return folder
    return None


def _package_script(package: Path | None, relative: str) -> TrustedScript | None:
    """A script file of an installed package's folder (`installed_package`), read again only
    when the file changes; None without the package, or with a file that could not sit
    inline in a page."""
    if package is None:
        return None
    path = package / relative
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
        for old in [k for k in _cache if k[0] == key[0]]:
            del _cache[old]
        _cache[key] = script
    return script


def _vega_js() -> TrustedScript | None:
    """Vega, Vega-Lite and Vega-Embed as one script, from the kernel environment's
    vl-convert-python (its `javascript_bundle`: built once per kernel, a few seconds);
    None without it."""
    if installed_package("vl_convert") is None:  # imported below: only an installed one
        return None
    with _vega_lock:  # held while building: one build, whoever asks first
        try:
            import vl_convert

            version = str(vl_convert.__version__)
            if version not in _vega:
                text = vl_convert.javascript_bundle()
                if not isinstance(text, str) or "</script" in text.lower():
                    return None
                _vega.clear()
                _vega[version] = trusted_script(text)
            return _vega[version]
        except Exception:  # noqa: BLE001 - any failure of the package: the chart as text
            return None


def vega_parts(spec: Any) -> tuple[str, tuple[TrustedScript, ...]] | str:
    """The frame's markup and scripts for a Vega or Vega-Lite spec, or the line saying why
    it shows as text instead."""
    if not isinstance(spec, dict):
        return "[sandbox] a Vega chart shows as text here: its data is not a spec"
    library = _vega_js()
    if library is None:
        return VEGA_MISSING_NOTE
    usermeta = spec.get("usermeta")
    if isinstance(usermeta, dict) and "embedOptions" in usermeta:
        # Vega-Embed merges these over ours (its loader, `ast`, actions; and through a
        # `constructor` key, into every object of the frame): the spec gets no say.
        spec = {**spec, "usermeta": {k: v for k, v in usermeta.items() if k != "embedOptions"}}
    markup = _chart_body("<div id=\"chart\"></div>", "spec", spec)
    if markup is None:
        return "[sandbox] a Vega chart shows as text here: its spec is not plain JSON"
    return markup, (library, VEGA_START_SCRIPT)


def _chart_body(place: str, data_id: str, value: Any) -> str | None:
    """The frame's body for a chart: the element it is drawn in, then its data block (None
    for data that is not plain JSON)."""
    try:
        block = _data_block(value)
    except (TypeError, ValueError, RecursionError):
        return None
    return f"{place}<script type=\"application/json\" id=\"{data_id}\">{block}</script>"


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
    library = _package_script(installed_package("plotly"), "package_data/plotly.min.js")
    if library is None:
        return PLOTLY_MISSING_NOTE
    config = figure.get("config")
    kept = {k: v for k, v in config.items() if k in _CONFIG_KEYS} if isinstance(
        config, dict) else {}
    kept.setdefault("responsive", True)
    kept["displaylogo"] = False
    markup = _chart_body("<div id=\"plot\" style=\"width:100%\"></div>", "figure", {
        "data": figure.get("data", []), "layout": figure.get("layout", {}), "config": kept})
    if markup is None:
        return "[sandbox] a plotly figure shows as text here: its data is not plain JSON"
    return markup, (library, START_SCRIPT)


# -- Bokeh ------------------------------------------------------------------------------------
# The models a sandbox's Bokeh plot may be made of: plots, layouts, glyphs, data, scales,
# axes, tickers, formatters, annotations, tools. Anything else shows the plot as text, with
# its name: CustomJS and every other model that runs code of its own (compiled with
# `Function`, which the frame's CSP refuses anyway), OpenURL, widgets and Div (HTML), models
# that load from a URL (ImageURL, tile and web data sources), and any model not listed here.
_BOKEH_MODELS = frozenset("""
    Figure Plot GridPlot GridBox Row Column Spacer Tabs TabPanel DocumentConfig Notifications
    GlyphRenderer GraphRenderer StaticLayoutProvider NodesOnly NodesAndLinkedEdges
    EdgesAndLinkedNodes NodesAndAdjacentNodes ColumnDataSource CDSView AllIndices IndexFilter
    BooleanFilter GroupFilter IntersectionFilter UnionFilter DifferenceFilter
    SymmetricDifferenceFilter InversionFilter Selection UnionRenderers IntersectRenderers
    DataRange1d Range1d FactorRange LinearScale LogScale CategoricalScale
    LinearAxis LogAxis CategoricalAxis DatetimeAxis MercatorAxis Grid
    BasicTicker AdaptiveTicker LogTicker CategoricalTicker DatetimeTicker DaysTicker
    MonthsTicker YearsTicker SingleIntervalTicker FixedTicker CompositeTicker MercatorTicker
    BinnedTicker AllLabels NoOverlap
    BasicTickFormatter LogTickFormatter CategoricalTickFormatter DatetimeTickFormatter
    NumeralTickFormatter PrintfTickFormatter MercatorTickFormatter
    LinearColorMapper LogColorMapper EqHistColorMapper CategoricalColorMapper
    CategoricalMarkerMapper CategoricalPatternMapper CumSum Dodge Jitter Stack
    AnnularWedge Annulus Arc Bezier Block Circle Ellipse HArea HAreaStep HBar HSpan HStrip
    HexTile Image ImageRGBA ImageStack Line MultiLine MultiPolygons Patch Patches Quad
    Quadratic Ray Rect Scatter Segment Step Text VArea VAreaStep VBar VSpan VStrip Wedge
    Title Legend LegendItem Label LabelSet Span Band BoxAnnotation PolyAnnotation Whisker
    Arrow NormalHead OpenHead VeeHead TeeHead ColorBar Slope AreaVisuals
    BoxInteractionHandles Node
    Toolbar ToolProxy PanTool WheelZoomTool WheelPanTool BoxZoomTool ZoomInTool ZoomOutTool
    ResetTool SaveTool UndoTool RedoTool HelpTool HoverTool CrosshairTool TapTool
    BoxSelectTool LassoSelectTool PolySelectTool RangeTool
""".split())
_HTML_SIGNS = ("<", ">", "&")


def _refused_bokeh_part(node: dict[str, Any]) -> str | None:
    """What makes one serialized node unfit for the frame, if anything."""
    kind = node.get("type")
    if kind == "model":
        return "a model defined by the plot itself"
    if kind != "object":
        return None
    name = node.get("name")
    if not isinstance(name, str) or name not in _BOKEH_MODELS:
        return f"the model {line_text(str(name), 80)}, which is not drawn from a sandbox"
    attributes = node.get("attributes", {})
    if not isinstance(attributes, dict) or "type" in attributes or "id" in attributes:
        # BokehJS would decode a typed value or a reference there (a map is read as the
        # attributes), hiding them from the checks below.
        return f"the model {name} with attributes in a form of their own"
    if name == "HoverTool":
        # A tooltip is rendered as HTML (a string template, and each value of the list
        # form), and a `{safe}` field inserts its value as HTML.
        texts = _strings(attributes.get("tooltips"))
        if any(sign in text for text in texts for sign in _HTML_SIGNS):
            return "a tooltip written as HTML"
        if any("{safe}" in text for text in texts):
            return "a tooltip field shown as HTML ({safe})"
    return None


def _strings(value: Any) -> list[str]:
    """Every string in a JSON value, however deep (no recursion: a hostile depth is fine)."""
    found, pending = [], [value]
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return found


def _bokeh_refusal(item: dict[str, Any]) -> str | None:
    """The first thing in a plot's JSON item that the frame will not draw, if any."""
    pending: list[Any] = [item]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            if "defs" in value and value["defs"]:
                return "models defined by the plot itself"
            refused = _refused_bokeh_part(value)
            if refused is not None:
                return refused
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return None


def bokeh_parts(item: Any) -> tuple[str, tuple[TrustedScript, ...]] | str:
    """The frame's markup and scripts for a Bokeh plot's JSON item (`bokeh.embed.json_item`),
    drawn by the BokehJS of the kernel's environment, or the line saying why it shows as
    text instead."""
    doc = item.get("doc") if isinstance(item, dict) else None
    if not isinstance(doc, dict) or not isinstance(doc.get("roots"), list) or not isinstance(
            item.get("root_id"), str):
        return "[sandbox] a Bokeh plot shows as text here: its data is not a plot"
    package = installed_package("bokeh")
    library = _package_script(package, "server/static/js/bokeh.min.js")
    if package is None or library is None:
        return BOKEH_MISSING_NOTE
    refused = _bokeh_refusal(item)
    if refused is not None:
        return f"[sandbox] a Bokeh plot shows as text here: it has {refused}"
    made_by, have = str(doc.get("version", "")), _bokeh_version(package)
    if made_by.split(".")[:2] != have.split(".")[:2]:
        return (f"[sandbox] a Bokeh plot shows as text here: it was made by Bokeh "
                f"{line_text(made_by, 40)}, and the kernel's environment has Bokeh {have}")
    markup = _chart_body("<div id=\"chart\"></div>", "item",
                         {"target_id": None, "root_id": item["root_id"], "doc": doc})
    if markup is None:
        return "[sandbox] a Bokeh plot shows as text here: its data is not plain JSON"
    return markup, (library, BOKEH_START_SCRIPT)


def _bokeh_version(package: Path) -> str:
    """The version of the installed bokeh whose BokehJS draws, from its own site-packages
    folder (a version found elsewhere on the path could be anyone's)."""
    for found in importlib.metadata.distributions(name="bokeh", path=[str(package.parent)]):
        return str(found.version)
    return "unknown"
