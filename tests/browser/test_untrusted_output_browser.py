"""Output of `%%sandbox` cells in a real JupyterLab and Chromium: nothing a sandboxed cell
displays runs script in the notebook page's origin, and what it shows honestly (an HTML table,
a DataFrame, a matplotlib figure) is still there for a person to see.

Each hostile payload, were it to run in the page, would change the page's title (its own,
`parent`'s and `top`'s), copy `document.cookie` into the title and into a new element of the
page, and create `pwned-<id>*.txt` in the server's root through the contents API with the
page's XSRF token and cookies. The test looks for all three after every cell ran: the title,
the page's DOM outside the iframes, the server's root folder (directly), and every request the
browser made. The marker a payload writes is put together at run time (`'PW'+'NED-'`), so it
appears in the page only if a payload ran, never as the source text the cells and the escaped
srcdoc attributes show.

A control in a second notebook displays the same payloads from an unconfined kernel cell (the
user's own code, trusted output): there they do run, which proves the detectors above can see
a payload that runs and that the sandbox's rendering is what stops them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

SETTLE_S = 2.0  # after every frame has loaded: time for an async effect (onerror, fetch)
FRAME_HEIGHT = 120  # the iframe's height before its content reports its own

SETUP = "%load_ext sandbox_kernel_ext\n%config SandboxMagics.policy = ''"
IMPORTS = "from IPython.display import HTML, SVG, Markdown, Javascript, display\n"

# What a payload does in whatever window it runs; placeholders in @@...@@. No double quote,
# `<`, `>` or `&`: the same text goes into an HTML attribute, a <script> and an SVG (XML).
PAYLOAD_JS = r"""(function(){var N='@@ID@@',M='@@MARK_A@@'+'@@MARK_B@@'+N,O='@@ORIGIN@@';
function t(f){try{f()}catch(e){}}
var c='';t(function(){c=document.cookie});
var x='';t(function(){var m=/(?:^|;\s*)_xsrf=([^;]*)/.exec(document.cookie);
x=m?decodeURIComponent(m[1]):''});
[window,parent,top].forEach(function(w){
t(function(){w.document.title=M+' '+c});
t(function(){var d=w.document.createElement('div');d.className='pwn-marker';
d.textContent=M+' cookie='+c;w.document.body.appendChild(d)});
});
var b=JSON.stringify({type:'file',format:'text',content:M+' '+c});
function put(w,url,extra){t(function(){
var o={method:'PUT',headers:{'X-XSRFToken':x,'Content-Type':'application/json'},body:b};
for(var k in extra){o[k]=extra[k]}w.fetch(url,o).catch(function(){})})}
[[window,''],[parent,'-parent'],[top,'-top']].forEach(function(p){
put(p[0],'/api/contents/@@PREFIX@@'+N+p[1]+'.txt',{});
put(p[0],O+'/api/contents/@@PREFIX@@'+N+p[1]+'-cred.txt',{credentials:'include'});
});
})();"""
MARK = "PWNED-"  # what a sandbox payload writes (as 'PW'+'NED-')
CONTROL_MARK = "CONTROL-"  # what the control writes (as 'CON'+'TROL-')

# Harmless output a person must see.
TABLE_CELL = """\
%%sandbox --quiet
from IPython.display import HTML, display
display(HTML('<table><thead><tr><th>fruit</th><th>count</th></tr></thead><tbody>'
             '<tr><td>apple</td><td>3</td></tr><tr><td>pear</td><td>5</td></tr>'
             '<tr><td>kiwi</td><td>8</td></tr></tbody></table>'))
"""
DATAFRAME_CELL = """\
%%sandbox --quiet
import pandas as pd
pd.DataFrame({'city': [f'city-{i}' for i in range(12)], 'value': [i * i for i in range(12)]})
"""
PLOT_CELL = """\
%%sandbox --quiet
import matplotlib.pyplot as plt
plt.figure(figsize=(4, 2.5))
plt.plot([1, 2, 3, 4], [1, 4, 2, 3], marker='o')
plt.title('plot from a sandboxed cell')
"""


def payload(ident: str, origin: str, *, control: bool = False) -> str:
    mark_a, mark_b, prefix = ("CON", "TROL-", "control-") if control else ("PW", "NED-",
                                                                          "pwned-")
    js = PAYLOAD_JS
    for key, value in (("ID", ident), ("MARK_A", mark_a), ("MARK_B", mark_b),
                       ("ORIGIN", origin), ("PREFIX", prefix)):
        js = js.replace(f"@@{key}@@", value)
    assert '"' not in js and not set("<>&") & set(js)
    return js


def svg(js: str) -> str:
    return ('<svg xmlns="http://www.w3.org/2000/svg" width="120" height="40" '
            f'onload="{js}"><script>{js}</script>'
            '<rect width="120" height="40" fill="teal"/></svg>')


def markdown(js: str) -> str:
    return (f'# hostile markdown\n\n<img src=x onerror="{js}">\n\n<script>{js}</script>\n\n'
            f"[click me](javascript:{js.replace(chr(10), '')})\n\n[or me][ref]\n\n"
            "[ref]: javascript:alert(1)\n")


def script(js: str, before: str = "") -> str:
    return f"{before}<script>{js}</script>"


def img_onerror(js: str) -> str:
    return f'<img src=x onerror="{js}">'


def hostile_cells(origin: str) -> dict[str, str]:
    """Cell sources by payload id: displays first, then the same payloads as Out[n]."""
    def js(ident: str) -> str:
        return payload(ident, origin)

    def sandboxed(body: str) -> str:
        return "%%sandbox --quiet\n" + IMPORTS + body

    scripted = js("d-javascript")
    return {
        "d-html-script": sandboxed(
            f"display(HTML({script(js('d-html-script'), '<p>html with a script</p>')!r}))"),
        "d-html-img": sandboxed(f"display(HTML({img_onerror(js('d-html-img'))!r}))"),
        # An attempt to close the srcdoc attribute and the iframe, and go on in the page.
        "d-html-breakout": sandboxed(
            f"display(HTML({script(js('d-html-breakout'), chr(34) + '></iframe>')!r}))"),
        "d-svg": sandboxed(f"display(SVG({svg(js('d-svg'))!r}))"),
        "d-svg-raw": sandboxed(
            f"display({{'image/svg+xml': {svg(js('d-svg-raw'))!r}, 'text/plain': 'svg'}}, "
            "raw=True)"),
        "d-markdown": sandboxed(f"display(Markdown({markdown(js('d-markdown'))!r}))"),
        "d-markdown-link": sandboxed(
            "display(Markdown('[click me](javascript:alert(1)) and [me][r]\\n\\n"
            "[r]: javascript:alert(2)\\n'))"),
        "d-javascript": sandboxed(
            f"display(Javascript({scripted!r}))\n"
            f"display({{'application/javascript': {scripted!r}, "
            f"'text/html': {script(scripted)!r}}}, raw=True)"),
        "r-html-script": sandboxed(
            f"HTML({script(js('r-html-script'), '<p>result with a script</p>')!r})"),
        "r-html-img": sandboxed(f"HTML({img_onerror(js('r-html-img'))!r})"),
        "r-svg": sandboxed(f"SVG({svg(js('r-svg'))!r})"),
        "r-markdown": sandboxed(f"Markdown({markdown(js('r-markdown'))!r})"),
    }


# What the page holds after the cells ran, outside any iframe's document.
PAGE_STATE = """(mark) => {
  const outputs = [...document.querySelectorAll('.jp-OutputArea')];
  const inOutputs = (sel) => outputs.flatMap(o => [...o.querySelectorAll(sel)]);
  return {
    title: document.title,
    markInHtml: document.documentElement.outerHTML.includes(mark),
    markInText: document.body.innerText.includes(mark),
    markerNodes: document.querySelectorAll('.pwn-marker').length,
    handlers: inOutputs('*').flatMap(el => [...el.attributes]
        .filter(a => a.name.toLowerCase().startsWith('on')).map(a => el.tagName + ' ' + a.name)),
    jsLinks: inOutputs('a').map(a => a.getAttribute('href') || '')
        .filter(h => h.trim().toLowerCase().startsWith('javascript')),
    scripts: inOutputs('script').map(s => s.textContent),
    frames: [...document.querySelectorAll('iframe')].map(f => ({
        cls: f.className, sandbox: f.getAttribute('sandbox'), hasSrcdoc: f.hasAttribute('srcdoc'),
        src: f.getAttribute('src')})),
  };
}"""
# Every change of the page's title from now on.
WATCH_TITLE = """() => {
  window.titleLog = [document.title];
  new MutationObserver(() => window.titleLog.push(document.title))
    .observe(document.head, {subtree: true, childList: true, characterData: true});
}"""
OUTER = "l => l.map(e => e.outerHTML.slice(0, 300))"
PAGE_SCRIPT_START = "(function(){var f=document.getElementById('sandbox-frame-"


@pytest.fixture
def requests_seen(browser_context: Any) -> Any:
    """Every URL the browser requests while the test runs (all pages, all frames)."""
    seen: list[str] = []

    def record(request: Any) -> None:
        seen.append(request.url)

    browser_context.on("request", record)
    yield seen
    browser_context.remove_listener("request", record)


def run_all(nb: Any, count: int) -> None:
    """Run the cells in order, each once: cell i becomes In[i + 1]. Each cell is made the
    active one first (outputs above it still grow as they load, and a click may land on a
    neighbour), and its end is its execution count, not a change of its prompt."""
    for index in range(count):
        cell = nb.cell(index)
        cell.scroll_into_view_if_needed()
        nb.wait_until(f"cell {index} to be the active one", lambda: _activate(cell))
        nb.page.keyboard.press("Control+Enter")
        nb.wait_until(f"cell {index} to finish as In[{index + 1}]",
                      lambda: nb.prompt(index) == f"[{index + 1}]:")


def _activate(cell: Any) -> bool:
    cell.locator(".jp-InputPrompt").click()
    return "jp-mod-active" in (cell.get_attribute("class") or "")


def settle(page: Any) -> None:
    """Every frame loaded and its images decided (loaded or failed), then SETTLE_S for
    anything asynchronous a payload would have started (an onerror, a fetch)."""
    for frame in page.frames:
        frame.wait_for_load_state("load")
        frame.wait_for_function("[...document.images].every(i => i.complete)")
    time.sleep(SETTLE_S)


def fits(frame: Any, inner: Any) -> bool:
    """Whether the iframe is as tall as its document's content (what our sizer reports)."""
    content = inner.locator("html").evaluate(
        "d => Math.ceil(d.getBoundingClientRect().height) + innerHeight - d.clientHeight")
    return abs(frame.bounding_box()["height"] - max(content, 16)) <= 1


def assert_shows_whole_table(frame: Any, inner: Any) -> None:
    """The table's box (in page coordinates) lies inside the iframe's box: nothing of it is
    cut off by the frame."""
    frame_box, table_box = frame.bounding_box(), inner.locator("table").bounding_box()
    assert table_box["height"] > 0 and table_box["width"] > 0, table_box
    assert table_box["y"] >= frame_box["y"] - 1, (table_box, frame_box)
    assert table_box["y"] + table_box["height"] <= frame_box["y"] + frame_box["height"] + 1, (
        table_box, frame_box)
    assert table_box["x"] + table_box["width"] <= frame_box["x"] + frame_box["width"] + 1


def painted(page: Any) -> None:
    """Before a screenshot: a frame just scrolled into view (notebook cells off screen are
    skipped by content-visibility) paints a moment after its parent; wait two animation
    frames and a little more, for the person looking at the picture, not for an assertion."""
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    time.sleep(0.5)


def is_result(nb: Any, index: int) -> bool:
    """Whether cell `index` shows an Out[n]: an execute_result, prompted with its count."""
    result = nb.output(index).locator(".jp-OutputArea-executeResult")
    if result.count() != 1:
        return False
    prompt = result.locator(".jp-OutputPrompt").inner_text().strip()
    assert prompt == f"[{index + 1}]:", prompt
    return True


def pwned_files(root: Path, prefix: str = "pwned") -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.name.lower().startswith(prefix))


def test_sandboxed_output_cannot_script_the_page_and_harmless_output_shows(
    open_notebook: Any, lab_server: Any, requests_seen: list[str], tmp_path: Path,
    record_property: Any,
) -> None:
    hostile = hostile_cells(lab_server.url)
    sources = [SETUP, TABLE_CELL, DATAFRAME_CELL, PLOT_CELL, *hostile.values()]
    table, frame_cell, plot = 1, 2, 3
    console: list[str] = []
    nb = open_notebook("untrusted.ipynb", sources)
    page = nb.page
    page.set_viewport_size({"width": 1280, "height": 1000})
    page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
    page.evaluate(WATCH_TITLE)
    cookies = {c["name"]: c["value"] for c in page.context.cookies(lab_server.url)}
    assert cookies.get("_xsrf"), f"the page has no _xsrf cookie to steal: {cookies}"
    shot = tmp_path / "untrusted-output.png"
    record_property("screenshot", str(shot))
    try:
        run_all(nb, len(sources))
        settle(page)

        # -- nothing ran in the page's origin --------------------------------------------------
        assert pwned_files(lab_server.root) == [], "a payload wrote through the contents API"
        assert [u for u in requests_seen if "pwned" in u.lower()] == []
        state = page.evaluate(PAGE_STATE, MARK)
        titles = page.evaluate("window.titleLog")
        assert state["title"] == titles[0], titles
        assert not [t for t in titles if MARK in t or cookies["_xsrf"] in t], titles
        assert not state["markInHtml"] and not state["markInText"]
        assert state["markerNodes"] == 0
        assert state["handlers"] == [] and state["jsLinks"] == []
        # The only scripts in outputs are the page-side sizers: ours, no sandbox bytes.
        assert state["scripts"], "no page-side sizing script: JupyterLab dropped it?"
        for script in state["scripts"]:
            assert script.startswith(PAGE_SCRIPT_START), script[:200]
            assert "PW" not in script and "pwned" not in script and "<" not in script
        output_frames = [f for f in state["frames"] if "sandbox-output" in f["cls"].split()]
        # table, DataFrame, 6 hostile HTML and 3 hostile Markdown (rendered as HTML, isolated)
        assert len(output_frames) == 11, state["frames"]
        for frame in output_frames:
            assert frame["sandbox"] == "allow-scripts" and frame["hasSrcdoc"], frame
            assert frame["src"] is None, frame
        # Inside the frames too the CSP let no payload run (only the hash-pinned sizer).
        for frame in page.frames[1:]:
            assert MARK not in frame.evaluate("document.documentElement.outerHTML")
            assert MARK not in frame.evaluate("document.title")

        # -- how each hostile payload arrived -------------------------------------------------
        first_hostile = 4
        for offset, ident in enumerate(hostile):
            output = nb.output(first_hostile + offset)
            text = output.inner_text()
            assert "Traceback" not in text and "Error" not in text, (ident, text)
            frames = output.locator("iframe.sandbox-output").count()
            svg_images = output.locator('img[src^="data:image/svg+xml;base64,"]').count()
            rendered = output.locator(".jp-OutputArea-output").locator("svg, a")
            assert rendered.count() == 0, (ident, rendered.evaluate_all(OUTER))  # no SVG, link
            if "svg" in ident:
                assert (frames, svg_images) == (0, 1), ident
            else:  # HTML, a raw bundle with text/html, Markdown made HTML here: isolated
                assert (frames, svg_images) == (1, 0), ident
        # Markdown renders (as HTML in its frame) with its scripts, handlers and links gone.
        for ident in ("d-markdown", "r-markdown"):
            output = nb.output(first_hostile + list(hostile).index(ident))
            body = output.frame_locator("iframe.sandbox-output").locator("body")
            assert "hostile markdown" in body.locator("h1").inner_text(), ident
            markup = body.inner_html()
            assert "onerror" not in markup and "<script" not in markup, (ident, markup[:500])
        # The harmless part of a hostile HTML display still shows (in its frame).
        for ident, words in (("d-html-script", "html with a script"),
                             ("r-html-script", "result with a script")):
            output = nb.output(first_hostile + list(hostile).index(ident))
            shown = output.frame_locator("iframe.sandbox-output").locator("body")
            assert words in shown.inner_text(), (ident, shown.inner_html()[:500])
        assert "IPython.core.display.Javascript object" in nb.output(
            first_hostile + list(hostile).index("d-javascript")).inner_text()
        for offset, ident in enumerate(hostile):
            assert is_result(nb, first_hostile + offset) == ident.startswith("r-"), ident

        # -- what a person must see ---------------------------------------------------------
        # The small table: all of it inside its frame, and the frame fitted to it (smaller
        # than the frame's first 120px).
        nb.cell(table).scroll_into_view_if_needed()
        inner = nb.output(table).frame_locator("iframe.sandbox-output")
        inner.get_by_text("kiwi").wait_for()
        frame = nb.output(table).locator("iframe.sandbox-output")
        nb.wait_until("the table's frame to fit its content", lambda: fits(frame, inner))
        assert_shows_whole_table(frame, inner)
        assert frame.bounding_box()["height"] < FRAME_HEIGHT

        # The DataFrame (Out[n]): taller than 120px, so its frame had to grow to show it.
        nb.cell(frame_cell).scroll_into_view_if_needed()
        frame = nb.output(frame_cell).locator("iframe.sandbox-output")
        inner = nb.output(frame_cell).frame_locator("iframe.sandbox-output")
        inner.get_by_text("city-11").wait_for()
        assert is_result(nb, frame_cell)
        nb.wait_until("the DataFrame's frame to grow to its content", lambda: fits(frame, inner))
        assert inner.locator("table").bounding_box()["height"] > FRAME_HEIGHT
        assert frame.bounding_box()["height"] > FRAME_HEIGHT
        assert_shows_whole_table(frame, inner)
        assert inner.locator("tbody tr").count() == 12

        # The matplotlib figure: a PNG that decoded, at a size a person can read.
        nb.cell(plot).scroll_into_view_if_needed()
        image = nb.output(plot).locator('img[src^="data:image/png"]')
        assert image.count() == 1
        natural = image.evaluate("i => [i.naturalWidth, i.naturalHeight]")
        assert natural[0] > 0 and natural[1] > 0, natural
        box = image.bounding_box()
        assert box["width"] > 100 and box["height"] > 50, box

        for index, name in ((frame_cell, "dataframe"), (plot, "plot")):
            nb.cell(index).scroll_into_view_if_needed()
            painted(page)
            nb.output(index).screenshot(path=str(tmp_path / f"output-{name}.png"))
        for index, path in ((table, shot), (first_hostile, tmp_path / "hostile-outputs.png")):
            nb.cell(index).scroll_into_view_if_needed()
            painted(page)
            page.screenshot(path=str(path))
    except BaseException:
        page.screenshot(path=str(tmp_path / "failure.png"))
        print("console of the page:\n" + "\n".join(console[-60:]))
        raise
    finally:
        print(f"screenshots in {tmp_path}")
    (tmp_path / "console.json").write_text(json.dumps(console, indent=1))


def test_control_the_same_payloads_from_an_unconfined_cell_do_run(
    open_notebook: Any, lab_server: Any,
) -> None:
    """The user's own (unconfined) cell shows trusted output: there the payloads run, and the
    detectors of the test above see every effect. Without this, the test above could pass
    because a payload was written wrong."""
    def js(ident: str) -> str:
        return payload(ident, lab_server.url, control=True)

    sources = [
        IMPORTS + f"display(HTML({script(js('c-script'))!r}))",
        IMPORTS + f"display(HTML({img_onerror(js('c-img'))!r}))",
        IMPORTS + f"display(Markdown({markdown(js('c-markdown'))!r}))",
    ]
    nb = open_notebook("trusted-control.ipynb", sources)
    nb.page.evaluate(WATCH_TITLE)
    cookie = {c["name"]: c["value"] for c in nb.page.context.cookies(lab_server.url)}["_xsrf"]
    run_all(nb, len(sources))
    expected = [f"control-{ident}{where}{cred}.txt" for ident in ("c-script", "c-img",
                                                                  "c-markdown")
                for where in ("", "-parent", "-top") for cred in ("", "-cred")]
    nb.wait_until("the control's files", lambda: pwned_files(lab_server.root, "control-")
                  == sorted(expected))
    written = (lab_server.root / "control-c-script.txt").read_text()
    assert written.startswith(CONTROL_MARK + "c-script") and cookie in written
    state = nb.page.evaluate(PAGE_STATE, CONTROL_MARK)
    assert state["markInText"] and state["markerNodes"] >= 3 * 3  # 3 payloads x 3 windows
    assert state["handlers"] and state["jsLinks"]  # what the sandboxed test finds none of
    # JupyterLab puts its own title back soon after (on the notebook's next change), so the
    # title is watched, not read once at the end.
    titles = nb.page.evaluate("window.titleLog")
    assert any(CONTROL_MARK in title and cookie in title for title in titles), titles
    for path in lab_server.root.glob("control-*"):
        path.unlink()
