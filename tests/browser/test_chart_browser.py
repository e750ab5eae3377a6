"""Interactive charts from a sandboxed cell, in a real JupyterLab and Notebook 7 with Chromium.

A plotly figure made in a `%%sandbox` cell must render as a chart a person can use (its
points drawn, a hover label on a point, a drag that zooms), while the same isolation proof as
for HTML holds in the same run: the page's title and cookies untouched, nothing written
through the contents API, and no request reaching a loopback server that stands in for the
internet, even from a hostile figure that points plotly at that server in every way it offers
(layout images, topojson, the cloud server's URL, links with `target="_self"`, text that
tries to close its data block) and after a click on its link. A control from the user's own
cell shows the server does see a load when nothing defends.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import nbformat
import pytest
from browser_waits import wait_for

SETUP = "%load_ext sandbox_kernel_ext\n%config SandboxMagics.policy = ''"
CHART_CELL = """\
%%sandbox --quiet
import plotly.express as px
fig = px.scatter(x=[1, 2, 3], y=[3, 1, 2], title="plotly from a sandbox")
fig
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
            "annotations": [{"text": f"<a href='javascript:top.postMessage({{pwned:1}},`*`)'>"
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


def control_cell(sink: str) -> str:
    """The user's own cell: a load the sink must see (the detector works)."""
    return ("from IPython.display import HTML, display\n"
            f"display(HTML(\"<img src='{sink}/control-image'>\"))\n")


class _Sink(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.server.seen.append(self.path)  # type: ignore[attr-defined]
        self.send_response(404)
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def sink() -> Iterator[Any]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    server.seen = []  # type: ignore[attr-defined]
    server.base = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def open_page(lab_server: Any, browser_context: Any, frontend: str, name: str,
              sources: list[str]) -> Any:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in sources]
    nbformat.write(nb, lab_server.root / name)
    page = browser_context.new_page()
    page.set_viewport_size({"width": 1280, "height": 2400})
    where = "lab/tree" if frontend == "lab" else "notebooks"
    page.goto(f"{lab_server.url}/{where}/{name}?reset&token={lab_server.token}")
    cells = page.locator(".jp-Notebook .jp-Cell")
    cells.nth(len(sources) - 1).locator(".jp-InputArea-editor").wait_for()

    def idle() -> bool:
        return any(s["path"] == name and s["kernel"]["execution_state"] == "idle"
                   for s in lab_server.api("/api/sessions"))

    wait_for(f"the kernel of {name}", idle)
    page.evaluate(WATCH)
    for index in range(len(sources)):
        cell = cells.nth(index)
        editor = cell.locator(".jp-InputArea-editor")

        def focused() -> bool:
            editor.click()
            return bool(editor.evaluate("el => el.contains(document.activeElement)"))

        wait_for(f"cell {index}'s editor to have the focus", focused)
        page.keyboard.press("Control+Enter")
        wait_for(f"cell {index} to finish", lambda: cell.locator(".jp-InputPrompt")
                 .inner_text().strip() == f"[{index + 1}]:")
        text = cell.locator(".jp-OutputArea").inner_text()
        assert "Traceback" not in text and "Error" not in text, (index, text[:2000])
    return page


def chart_frame(page: Any, index: int) -> Any:
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    frame = cell.locator("iframe.sandbox-output")
    assert frame.count() == 1, cell.locator(".jp-OutputArea").inner_text()[:500]
    frame.scroll_into_view_if_needed()
    return frame


@pytest.mark.parametrize("frontend", ["lab", "notebook"])
def test_a_plotly_chart_from_a_sandbox_is_interactive_and_isolated(
        frontend: str, lab_server: Any, browser_context: Any, sink: Any) -> None:
    name = f"charts-{frontend}.ipynb"
    start = len(sink.seen)
    # Requests that got an answer (one blocked by the frame's CSP is announced, then fails).
    requests: list[str] = []

    def record(request: Any) -> None:
        requests.append(request.url)

    browser_context.on("requestfinished", record)
    page = open_page(lab_server, browser_context, frontend, name,
                     [SETUP, CHART_CELL, hostile_cell(sink.base), control_cell(sink.base)])
    try:
        cookies = {c["name"]: c["value"] for c in page.context.cookies(lab_server.url)}
        # -- the chart: drawn, and a person can hover and zoom ----------------------------------
        frame = chart_frame(page, 1)
        inner = frame.content_frame
        points = inner.locator(".scatterlayer .point")
        wait_for("the chart's three points", lambda: points.count() == 3)
        assert "plotly from a sandbox" in inner.locator(".gtitle").text_content()
        box = points.nth(0).bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        wait_for("a hover label on the point", lambda: inner.locator(".hovertext").count() > 0)
        plot = inner.locator(".nsewdrag").first.bounding_box()
        before = inner.locator("#plot").evaluate("p => p.layout.xaxis.range.slice()")
        page.mouse.move(plot["x"] + plot["width"] * 0.2, plot["y"] + plot["height"] * 0.3)
        page.mouse.down()
        page.mouse.move(plot["x"] + plot["width"] * 0.6, plot["y"] + plot["height"] * 0.7,
                        steps=8)
        page.mouse.up()
        wait_for("the drag to zoom the x axis", lambda: inner.locator("#plot").evaluate(
            "p => p.layout.xaxis.range.slice()") != before)

        # -- the hostile figure: drawn, and nothing it points at is reached -----------------
        hostile = chart_frame(page, 2).content_frame
        wait_for("the hostile figure drawn", lambda: hostile.locator(".main-svg").count() > 0)
        # A person's click on the title's link (without the frame's guard, this navigates
        # the frame to the sink: tried when written).
        title_link = hostile.locator(".gtitle a")
        assert title_link.count() == 1, hostile.locator(".main-svg").first.inner_html()[:500]
        title_link.dispatch_event("click")
        control = page.locator(".jp-Notebook .jp-Cell").nth(3)
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
        page.close()
        for session in lab_server.api("/api/sessions"):
            if session["path"] == name:
                lab_server.api(f"/api/sessions/{session['id']}", method="DELETE")
