"""Interactive charts from a sandboxed cell, in a real JupyterLab and Notebook 7 with Chromium.

A plotly figure, an Altair chart and a Bokeh plot made in a `%%sandbox` cell must render as
charts a person can use (points drawn, a hover label on a point, a drag or a wheel that
zooms), while the same isolation proof as for HTML holds in the same run: the page's title
and cookies untouched, nothing written through the contents API, and no request reaching a
loopback server that stands in for the internet, even from hostile charts that point their
library at that server in every way it offers (layout images, topojson, the cloud server's
URL, links with `target="_self"`, data and image URLs, a help tool's page, style sheets,
text that tries to close its data block, code run on a click) and after clicks on their
links. A control from the user's own cell shows the server does see a load when nothing
defends.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from browser_waits import wait_for
from loopback_sink import loopback_sink

from sandbox_kernel_ext.runner.trusted import charts

SETUP = "%load_ext sandbox_kernel_ext\n%config SandboxMagics.policy = ''"
CHART_CELL = """\
%%sandbox --quiet
import plotly.express as px
fig = px.scatter(x=[1, 2, 3], y=[3, 1, 2], title="plotly from a sandbox")
fig
"""
ALTAIR_CELL = """\
%%sandbox --quiet
import altair as alt, pandas as pd
points = pd.DataFrame({"a": [1, 2, 3], "b": [3, 1, 2]})
alt.Chart(points, title="altair from a sandbox").mark_point(size=200).encode(
    x="a", y="b", tooltip=["a", "b"]).interactive()
"""
BOKEH_CELL = """\
%%sandbox --quiet
from bokeh.io import output_notebook, show
from bokeh.plotting import figure
output_notebook()
p = figure(title="bokeh from a sandbox", tooltips=[("a", "@x")], active_scroll="wheel_zoom")
p.scatter([1, 2, 3], [3, 1, 2], size=20)
show(p)
"""
MARK = "PW" + "NED"  # put together at run time, so the cells' source never shows it
# The page's own state: what a script that escaped into the page would change.
WATCH = """() => { window.titleLog = [document.title]; window.pwnedLog = [];
  new MutationObserver(() => window.titleLog.push(document.title))
    .observe(document.head, {subtree: true, childList: true, characterData: true});
  addEventListener('message', e => { if (e.data && e.data.pwned) window.pwnedLog.push(
    String(e.data.pwned)); }); }"""


def hostile_cell(sink: str) -> str:
    """A figure sent as raw data (what a hostile child can send), pointing plotly at the
    sink in every way it offers, with text that tries to end the data block and run."""
    script = "</script><script>top.postMessage({pwned: 'PW'+'NED-script'}, '*')</script>"
    figure = {
        "data": [{"type": "scatter", "x": [1, 2, 3], "y": [1, 3, 2], "name": script,
                  "text": [script, "<img src=x onerror=alert(1)>", "b"],
                  "hovertemplate": f"<a href='{sink}/hover-link' target='_self'>h</a>"},
                 {"type": "scattergeo", "lon": [0], "lat": [0], "geo": "geo"}],
        "layout": {
            "title": {"text": f"<a href='{sink}/title-link' target='_self'>hostile title</a>"},
            "images": [{"source": f"{sink}/layout-image", "xref": "paper", "yref": "paper",
                        "x": 0, "y": 1, "sizex": 0.2, "sizey": 0.2}],
            "annotations": [{"text": "<a href='javascript:top.postMessage({pwned:1},`*`)'>"
                                     "js link</a>", "x": 2, "y": 2}],
            "geo": {"domain": {"x": [0.7, 1], "y": [0.7, 1]}},
        },
        "config": {"topojsonURL": f"{sink}/topojson/", "plotlyServerURL": f"{sink}/cloud",
                   "showLink": True, "showEditInChartStudio": True,
                   "mapboxAccessToken": "secret"},
    }
    return ("%%sandbox --quiet\nfrom IPython.display import display\n"
            f"display({{'application/vnd.plotly.v1+json': {figure!r}, 'text/plain': 'f'}}, "
            "raw=True)\n")


def hostile_vega_cell(sink: str) -> str:
    """A Vega-Lite spec pointing Vega at the sink: data, an image mark, a link on a mark
    (clicked below), a tooltip with markup, an expression reaching for the page."""
    spec = {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "title": "hostile spec",
        # Vega-Embed takes options from the spec: a link opening in the frame itself.
        "usermeta": {"embedOptions": {"loader": {"target": "_self"}, "actions": True,
                                      "constructor": {"prototype": {"polluted": "yes"}}}},
        "layer": [
            {"data": {"url": f"{sink}/vega-data.json"}, "mark": "point",
             "encoding": {"x": {"field": "a", "type": "quantitative"}}},
            {"data": {"values": [{"a": 1, "u": f"{sink}/vega-href",
                                  "t": "<img src=x onerror=alert(1)>"}]},
             "mark": {"type": "point", "size": 4000, "filled": True},
             "encoding": {"x": {"field": "a", "type": "quantitative"},
                          "href": {"field": "u"}, "tooltip": {"field": "t"}}},
            {"data": {"values": [{"a": 2, "img": f"{sink}/vega-image"}]},
             "mark": {"type": "image", "width": 20, "height": 20},
             "encoding": {"x": {"field": "a", "type": "quantitative"},
                          "url": {"field": "img"}}},
        ],
    }
    # An expression that reaches for the page: Vega's interpreter knows no `window`, and
    # the chart says it could not be drawn (shown after the first, which the test clicks).
    reach = {"$schema": spec["$schema"], "data": {"values": [{"a": 3}]}, "mark": "text",
             "encoding": {"text": {"value": {
                 "expr": "toString(window) + toString(parent.document.cookie)"}}}}
    return ("%%sandbox --quiet\nfrom IPython.display import display\n"
            f"for spec in ({spec!r}, {reach!r}):\n"
            "    display({'application/vnd.vegalite.v6.json': spec, 'text/plain': 'v'}, "
            "raw=True)\n")


def hostile_bokeh_cell(sink: str) -> str:
    """Bokeh plots sent as raw items (what a hostile child can send): one of drawing models
    whose help tool, style sheets and title point at the sink or try to end the data block
    (drawn: the frame holds them), and one with code run on a click (shown as text)."""
    script = "</script><script>top.postMessage({pwned: 'PW'+'NED-bokeh'}, '*')</script>"
    sheet = (f"@import url('{sink}/bokeh-import'); "
             f":host {{ background-image: url('{sink}/bokeh-background'); }}")
    return ("%%sandbox --quiet\nfrom IPython.display import display\n"
            "from bokeh.embed import json_item\n"
            "from bokeh.models import CustomJS, HelpTool\n"
            "from bokeh.plotting import figure\n"
            f"p = figure(title={script!r}, tools=[HelpTool(redirect={sink + '/bokeh-help'!r})], "
            f"stylesheets=[{sheet!r}])\n"
            "p.scatter([1, 2], [1, 2])\n"
            "q = figure()\nq.scatter([1], [1])\n"
            "q.js_on_event('tap', CustomJS(code=\"top.postMessage({pwned: 1}, '*')\"))\n"
            "for plot in (p, q):\n"
            f"    display({{{charts.BOKEH_ITEM_MIME!r}: json_item(plot), 'text/plain': 'b'}}, "
            "raw=True)\n")


def control_cell(sink: str) -> str:
    """The user's own cell: a load the sink must see (the detector works)."""
    return ("from IPython.display import HTML, display\n"
            f"display(HTML(\"<img src='{sink}/control-image'>\"))\n")


@pytest.fixture(scope="module")
def sink() -> Iterator[Any]:
    with loopback_sink() as server:
        yield server


def run_all(notebook: Any, count: int) -> None:
    """Run the cells in order; none may show an error."""
    notebook.page.set_viewport_size({"width": 1280, "height": 2400})
    notebook.page.evaluate(WATCH)
    for index in range(count):
        notebook.run_cell(index)
        notebook.wait_cell_done(index)
        text = notebook.output(index).inner_text()
        assert "Traceback" not in text and "Error" not in text, (index, text[:2000])


def chart_frame(notebook: Any, index: int) -> Any:
    cell = notebook.cell(index)
    frame = cell.locator("iframe.sandbox-output")
    assert frame.count() == 1, cell.locator(".jp-OutputArea").inner_text()[:500]
    frame.scroll_into_view_if_needed()
    return frame


def drawn_and_hovered(notebook: Any, index: int, marks: str, title_at: str, title: str,
                      shown: str) -> Any:
    """The chart of cell `index`: its three points drawn, its title, and what a hover on a
    point shows; its frame's document."""
    inner = chart_frame(notebook, index).content_frame
    points = inner.locator(marks)
    wait_for("the chart's three points", lambda: points.count() == 3)
    assert title in inner.locator(title_at).text_content()
    box = points.nth(0).bounding_box()
    notebook.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    wait_for(f"{shown} on a point", lambda: inner.locator(shown).count() > 0)
    return inner


def assert_plotly_is_interactive(notebook: Any, index: int) -> None:
    """Its points drawn, a hover label on one, and a drag that zooms."""
    inner = drawn_and_hovered(notebook, index, ".scatterlayer .point", ".gtitle",
                              "plotly from a sandbox", ".hovertext")
    mouse = notebook.page.mouse
    plot = inner.locator(".nsewdrag").first.bounding_box()
    before = inner.locator("#plot").evaluate("p => p.layout.xaxis.range.slice()")
    mouse.move(plot["x"] + plot["width"] * 0.2, plot["y"] + plot["height"] * 0.3)
    mouse.down()
    mouse.move(plot["x"] + plot["width"] * 0.6, plot["y"] + plot["height"] * 0.7, steps=8)
    mouse.up()
    wait_for("the drag to zoom the x axis", lambda: inner.locator("#plot").evaluate(
        "p => p.layout.xaxis.range.slice()") != before)


def assert_altair_is_interactive(notebook: Any, index: int) -> None:
    """Its points drawn, a tooltip on one, and a wheel that zooms (`.interactive()`)."""
    inner = drawn_and_hovered(notebook, index, "g.mark-symbol path", "g.role-title",
                              "altair from a sandbox", "#vg-tooltip-element.visible")
    ticks = inner.locator("g.role-axis-label").first
    before = ticks.text_content()
    notebook.page.mouse.wheel(0, -400)
    wait_for("the wheel to zoom the axis", lambda: ticks.text_content() != before)


BOKEH_POINT = """chart => { const view = Object.values(Bokeh.index)[0];
  const canvas = view.canvas_view.el.getBoundingClientRect();
  const box = chart.getBoundingClientRect();
  return [canvas.left - box.left + view.frame.x_scale.compute(1),
          canvas.top - box.top + view.frame.y_scale.compute(3)]; }"""
BOKEH_X_RANGE = "c => { const r = Bokeh.documents[0].roots()[0].x_range; return [r.start, r.end]; }"


def assert_bokeh_is_interactive(notebook: Any, index: int) -> None:
    """Its plot drawn with its title, a tooltip on the point at (1, 3), and a wheel that
    zooms (`active_scroll`)."""
    inner = chart_frame(notebook, index).content_frame
    chart = inner.locator("#chart")  # what the scripts below run on: the frame's own page
    wait_for("the Bokeh plot drawn", lambda: chart.evaluate(
        "c => typeof Bokeh === 'object' && Object.keys(Bokeh.index).length > 0"))
    title = chart.evaluate("c => Bokeh.documents[0].roots()[0].title.text")
    assert title == "bokeh from a sandbox"
    box = chart.bounding_box()
    x, y = chart.evaluate(BOKEH_POINT)
    notebook.page.mouse.move(box["x"] + x, box["y"] + y)
    value = inner.locator(".bk-tooltip-row-value")
    wait_for("a tooltip on the point", lambda: value.count() > 0
             and value.first.text_content().strip() == "1")
    before = chart.evaluate(BOKEH_X_RANGE)
    notebook.page.mouse.wheel(0, -400)
    wait_for("the wheel to zoom the x range", lambda: chart.evaluate(BOKEH_X_RANGE) != before)
    # Bokeh's logo links out from inside a shadow root: no click of any kind opens it (a
    # Ctrl- and a middle-click opened tabs at bokeh.org before the frame's guard read the
    # event's whole path).
    pages = len(notebook.page.context.pages)
    logo = inner.locator("a.bk-logo")
    assert logo.count() == 1
    logo.click(modifiers=["Control"], no_wait_after=True)
    logo.click(button="middle", no_wait_after=True)
    notebook.page.wait_for_timeout(1000)  # a tab would have opened by now
    assert len(notebook.page.context.pages) == pages


def click_hostile_links(notebook: Any) -> None:
    """A person's clicks on the hostile charts' links: plotly's title link, Vega's mark
    with an `href` (without the frames' guards, each navigates its frame to the sink: tried
    when written) and the help tool of the hostile Bokeh plot, which opens its page."""
    plotly = chart_frame(notebook, 4).content_frame
    wait_for("the hostile figure drawn", lambda: plotly.locator(".main-svg").count() > 0)
    title_link = plotly.locator(".gtitle a")
    assert title_link.count() == 1, plotly.locator(".main-svg").first.inner_html()[:500]
    title_link.dispatch_event("click")
    frames = notebook.cell(5).locator("iframe.sandbox-output")
    assert frames.count() == 2
    reach = frames.nth(1).content_frame
    wait_for("the reaching expression refused", lambda: "could not be drawn" in (
        reach.locator("#chart").text_content() or ""))
    frames.nth(0).scroll_into_view_if_needed()
    vega = frames.nth(0).content_frame
    wait_for("the hostile spec drawn", lambda: vega.locator("g.role-title").count() == 1)
    assert vega.locator("body").evaluate("b => ({}).polluted") is None  # never merged
    box = vega.locator("g.mark-symbol path").last.bounding_box()
    notebook.page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    bokeh = chart_frame(notebook, 6).content_frame  # one frame: the CustomJS plot is text
    assert "the model CustomJS" in notebook.output(6).inner_text()
    help_tool = bokeh.locator(".bk-tool-icon-help")
    wait_for("the hostile Bokeh plot drawn", lambda: help_tool.count() == 1)
    help_tool.click()


@pytest.mark.parametrize("frontend", ["lab", "notebook"])
def test_plotly_altair_and_bokeh_charts_from_a_sandbox_are_interactive_and_isolated(
        frontend: str, open_notebook: Any, lab_server: Any, browser_context: Any,
        sink: Any) -> None:
    start = len(sink.seen)
    # Requests that got an answer (one blocked by the frame's CSP is announced, then fails).
    requests: list[str] = []

    def record(request: Any) -> None:
        requests.append(request.url)

    browser_context.on("requestfinished", record)
    sources = [SETUP, CHART_CELL, ALTAIR_CELL, BOKEH_CELL, hostile_cell(sink.base),
               hostile_vega_cell(sink.base), hostile_bokeh_cell(sink.base),
               control_cell(sink.base)]
    notebook = open_notebook(f"charts-{frontend}.ipynb", sources, frontend)
    page = notebook.page
    try:
        run_all(notebook, len(sources))
        cookies = {c["name"]: c["value"] for c in page.context.cookies(lab_server.url)}
        assert_plotly_is_interactive(notebook, 1)
        assert_altair_is_interactive(notebook, 2)
        assert_bokeh_is_interactive(notebook, 3)
        click_hostile_links(notebook)
        control = notebook.cell(7)
        control.scroll_into_view_if_needed()
        wait_for("the control's load at the sink",
                 lambda: "/control-image" in sink.seen[start:])
        page.wait_for_timeout(1500)  # a late load or a navigation would come by now
        seen = [p for p in sink.seen[start:] if p != "/control-image"]
        assert seen == [], seen
        assert [u for u in requests if u.startswith(sink.base)
                and not u.endswith("/control-image")] == []
        assert page.evaluate("window.pwnedLog") == []
        titles = page.evaluate("window.titleLog")
        assert all(MARK not in t and cookies.get("_xsrf", "-") not in t for t in titles)
        assert MARK not in page.evaluate("document.body.innerText")
        assert [f.url for f in page.frames[1:] if sink.base in f.url] == []
        assert not list(lab_server.root.glob("*pwned*"))
    finally:
        browser_context.remove_listener("requestfinished", record)


LINKS = ("<p><a id=plain href='{sink}/{layer}-plain'>plain</a> "
         "<a id=blank href='{sink}/{layer}-blank' target=_blank>blank</a></p>")


def test_no_click_of_any_kind_opens_a_sandboxed_link(open_notebook: Any, sink: Any) -> None:
    """Ctrl-, Shift- and middle-clicks on a link in a sandboxed frame open nothing (the frame
    may open no popup, but a modified click opened a tab at the link's URL: a way out for
    data in it). The control: the same links in the page itself (the user's own output)
    open tabs that reach the sink."""
    start = len(sink.seen)
    sandboxed = LINKS.format(sink=sink.base, layer="sbx")
    control = LINKS.format(sink=sink.base, layer="raw")
    notebook = open_notebook("modified-clicks.ipynb", [
        SETUP, f"%%sandbox --quiet\nfrom IPython.display import HTML\nHTML({sandboxed!r})",
        f"from IPython.display import HTML\nHTML({control!r})"])
    page = notebook.page
    for index in range(3):
        notebook.run_cell(index)
        notebook.wait_cell_done(index)
    inner = chart_frame(notebook, 1).content_frame
    for link in ("#plain", "#blank"):
        for how in ({"modifiers": ["Control"]}, {"modifiers": ["Shift"]}, {"button": "middle"}):
            inner.locator(link).click(**how, no_wait_after=True)
    for link in ("#plain", "#blank"):
        notebook.output(2).locator(link).click(modifiers=["Control"], no_wait_after=True)
    wait_for("the control's tabs at the sink", lambda: {"/raw-plain", "/raw-blank"} <= set(
        sink.seen[start:]))
    page.wait_for_timeout(1500)  # a tab from the frame would have loaded by now
    assert [p for p in sink.seen[start:] if p.startswith("/sbx")] == []
    for other in page.context.pages:
        if other is not page:
            other.close()
