"""What a sandbox's chart becomes (`runner/trusted/charts.py`), checked as data: a plotly
figure, a Vega spec or a Bokeh plot crosses as JSON no text in it can end, the only scripts
are the kernel environment's library and ours (pinned by hash), the options that point a
library at a server stay out, and a Bokeh plot made of anything but drawing models (code,
links, HTML) shows as text saying what it has."""

from __future__ import annotations

import base64
import copy
import hashlib
import html
import json
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox_kernel_ext.runner.trusted import charts
from sandbox_kernel_ext.runner.trusted.display import bundle_size, safe_bundle

PLOTLY = charts.PLOTLY_MIME
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12)


def frame_document(frame_html: str) -> str:
    """The document inside an isolated frame, as the browser reads its srcdoc attribute."""
    found = re.search(r'srcdoc="([^"]*)"', frame_html)
    assert found, frame_html[:300]
    return html.unescape(found.group(1))


def scripts_of(document: str) -> list[tuple[str, str]]:
    """(attributes, text) of each script element, as an HTML tokenizer would end them."""
    return re.findall(r"<script([^>]*)>(.*?)</script", document, re.DOTALL | re.IGNORECASE)


@settings(max_examples=150, deadline=None)
@given(data=st.lists(st.dictionaries(st.text(), json_values, max_size=5), max_size=3),
       layout=st.dictionaries(st.text(), json_values, max_size=5))
def test_no_text_in_a_figure_ends_its_data_block_and_it_reads_back(data: list, layout: dict
                                                                   ) -> None:
    markup, _ = charts.plotly_parts({"data": data, "layout": layout})  # the frame's body
    [(attributes, block)] = scripts_of(markup)
    assert 'type="application/json"' in attributes
    assert not set("<>&") & set(block)
    assert json.loads(block)["data"] == data and json.loads(block)["layout"] == layout


def test_a_figures_frame_runs_the_sizer_its_library_and_start_up_after_its_data() -> None:
    out, _ = safe_bundle({PLOTLY: {"data": [{"y": [1]}], "layout": {}}, "text/plain": "f"}, {})
    scripts = scripts_of(frame_document(out["text/html"]))
    assert len(scripts) == 4, [s[0] for s in scripts]
    assert 'type="application/json"' in scripts[1][0]
    assert scripts[3][1] == charts.START_SCRIPT.text


def test_every_script_that_runs_is_pinned_by_its_hash_and_is_the_kernels_plotly() -> None:
    out, _ = safe_bundle({PLOTLY: {"data": [{"type": "bar", "y": [1]}]}, "text/plain": "f"}, {})
    document = frame_document(out["text/html"])
    policy = re.search(r'Content-Security-Policy" content="([^"]*)"', document).group(1)
    runnable = [text for attributes, text in scripts_of(document)
                if "application/json" not in attributes]
    pinned = {f"'sha256-{base64.b64encode(hashlib.sha256(t.encode()).digest()).decode()}'"
              for t in runnable}
    assert set(re.search(r"script-src ([^;]*)", policy).group(1).split()) == pinned
    assert "default-src 'none'" in policy and "connect-src" not in policy
    import plotly
    shipped = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    assert shipped.read_text("utf-8") in runnable


def test_options_that_reach_a_server_stay_out_and_the_frame_ignores_link_clicks() -> None:
    figure = {"data": [], "layout": {}, "config": {
        "topojsonURL": "http://x/", "plotlyServerURL": "http://x", "showLink": True,
        "mapboxAccessToken": "secret", "scrollZoom": True}}
    document = frame_document(safe_bundle({PLOTLY: figure, "text/plain": "f"}, {})[0]["text/html"])
    config = json.loads(scripts_of(document)[1][1])["config"]
    assert config == {"scrollZoom": True, "responsive": True, "displaylogo": False}
    # The frame's first script (the sizer) keeps every link from opening, clicked or not.
    # Its whole path: a link in a shadow root (Bokeh's) shows the document only its host.
    assert ("var p=e.composedPath();" in scripts_of(document)[0][1]
            and "if(n==='a'||n==='area'){e.preventDefault();" in scripts_of(document)[0][1])


@pytest.mark.parametrize("figure", [[1, 2], "x", {"data": "x"}, {"layout": []},
                                    {"data": [float("nan")]}])
def test_what_is_not_a_figure_shows_as_text_with_a_line_saying_why(figure: object) -> None:
    out, _ = safe_bundle({PLOTLY: figure, "text/plain": "Figure(...)",
                          "text/html": "<div>plotly's loader</div>"}, {})
    assert set(out) == {"text/plain"}
    assert out["text/plain"].startswith("Figure(...)\n[sandbox] a plotly figure shows as text")


def test_without_plotly_in_the_kernels_environment_the_figure_is_text(monkeypatch) -> None:
    monkeypatch.setattr(charts.importlib.util, "find_spec", lambda name: None)
    out, _ = safe_bundle({PLOTLY: {"data": []}, "text/plain": "Figure(...)"}, {})
    assert out == {"text/plain": "Figure(...)\n" + charts.PLOTLY_MISSING_NOTE}


def test_bokehs_page_scripts_show_as_text_and_say_so() -> None:
    out, _ = safe_bundle({"application/vnd.bokehjs_exec.v0+json": {}, "text/plain": "p"}, {})
    assert out == {"text/plain": "p\n" + charts.CHART_NOTES["application/vnd.bokehjs_"]}


@pytest.mark.parametrize("mime", ["application/vnd.vegalite.v5+json",
                                  "application/vnd.vegalite.v6.json",
                                  "application/vnd.vega.v5+json"])
def test_a_vega_spec_is_drawn_by_the_kernels_vega_with_no_url_reachable(mime: str) -> None:
    spec = {"data": {"url": "http://x/d.json"}, "mark": "point",
            "usermeta": {"embedOptions": {"loader": {"baseURL": "http://x/"}}}}
    document = frame_document(safe_bundle({mime: spec, "text/plain": "c"}, {})[0]["text/html"])
    scripts = scripts_of(document)
    # The spec's own embed options (Vega-Embed would merge them over ours) are dropped.
    assert json.loads(scripts[1][1]) == {**spec, "usermeta": {}}
    start = scripts[-1][1]
    # Our loader refuses every URL (data, images, a mark's href), frozen so no option can
    # change it; Vega interprets expressions (ast) rather than compiling them.
    assert "l=Object.freeze({load:n,sanitize:n,http:n,file:n})" in start
    assert "ast:true" in start
    assert "unsafe-eval" not in document


@pytest.mark.parametrize("spec", [[1], "x", 3])
def test_what_is_not_a_vega_spec_shows_as_text(spec: object) -> None:
    out, _ = safe_bundle({"application/vnd.vegalite.v5+json": spec, "text/plain": "c",
                          "text/html": "<div>altair's loader</div>"}, {})
    assert set(out) == {"text/plain"} and "a Vega chart shows as text" in out["text/plain"]


def test_without_vl_convert_in_the_kernels_environment_the_spec_is_text(monkeypatch) -> None:
    monkeypatch.setattr(charts, "installed_package", lambda name: None)
    out, _ = safe_bundle({"application/vnd.vegalite.v5+json": {}, "text/plain": "c"}, {})
    assert out == {"text/plain": "c\n" + charts.VEGA_MISSING_NOTE}


def test_the_cells_display_cap_counts_every_byte_of_a_chart() -> None:
    """Each chart carries its library (megabytes): the per-cell cap counts them, so a loop
    of charts cannot grow the kernel, the server and the notebook past it."""
    out, _ = safe_bundle({PLOTLY: {"data": [{"y": [1, 2]}]}, "text/plain": "f"}, {})
    assert len(out["text/html"]) > 4_000_000
    assert bundle_size(out) >= len(out["text/html"])


def test_a_package_the_kernel_would_import_from_a_writable_folder_is_not_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `plotly/` (or `vl_convert/`) ahead of site-packages on the path, say in the
    notebook's folder a policy lets a sandbox write: its script is never run, and the
    package is never imported into the kernel."""
    planted = tmp_path / "plotly"
    (planted / "package_data").mkdir(parents=True)
    (planted / "__init__.py").write_text("raise SystemExit('imported')\n")
    (planted / "package_data" / "plotly.min.js").write_text("top.postMessage('x','*')")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "plotly" or m.startswith("plotly.")]:
        monkeypatch.delitem(sys.modules, name)  # as in a kernel that never imported it
    assert charts.installed_package("plotly") is None
    out, _ = safe_bundle({PLOTLY: {"data": []}, "text/plain": "Figure(...)"}, {})
    assert out == {"text/plain": "Figure(...)\n" + charts.PLOTLY_MISSING_NOTE}


# -- Bokeh -----------------------------------------------------------------------------------
from bokeh import layouts as bokeh_layouts  # noqa: E402
from bokeh import plotting as bokeh_plotting  # noqa: E402
from bokeh import models as bokeh_models  # noqa: E402
from bokeh.embed import json_item  # noqa: E402
from bokeh.transform import factor_cmap, jitter, linear_cmap  # noqa: E402

BOKEH = charts.BOKEH_ITEM_MIME
figure = bokeh_plotting.figure


def _lines() -> object:
    p = figure(title="lines", tooltips=[("x", "@x"), ("y", "@y{0.00}")],
               x_axis_type="datetime", y_axis_type="log")
    p.line([0, 86_400_000, 172_800_000], [1, 10, 100], legend_label="a")
    p.scatter([0, 86_400_000], [3, 30], marker="triangle", size=10, legend_label="b")
    p.add_layout(bokeh_models.Span(location=10, dimension="width"))
    return p


def _bars() -> object:
    fruits = ["apples", "pears", "plums"]
    source = bokeh_models.ColumnDataSource({"fruit": fruits, "n": [3, 1, 2]})
    p = figure(x_range=fruits, tools="hover,tap,box_select,reset,save", tooltips="@fruit: @n")
    p.vbar(x="fruit", top="n", width=0.8, source=source,
           color=factor_cmap("fruit", "Category10_3", fruits))
    p.scatter(x=jitter("fruit", 0.2, range=p.x_range), y="n", source=source)
    p.add_layout(bokeh_models.LabelSet(x="fruit", y="n", text="fruit", source=source))
    return p


def _heatmap_and_layout() -> object:
    import numpy as np

    image = figure(tools="pan,wheel_zoom,box_zoom,reset,help,crosshair,lasso_select")
    image.image(image=[np.arange(16.0).reshape(4, 4)], x=0, y=0, dw=1, dh=1,
                palette="Viridis256")
    mapper = bokeh_models.LinearColorMapper(palette="Viridis256", low=0, high=1)
    image.add_layout(bokeh_models.ColorBar(color_mapper=mapper), "right")
    shapes = figure()
    shapes.patches([[1, 2, 3]], [[1, 2, 1]])
    shapes.wedge(0, 0, 1, 0, 1)
    shapes.quad(0, 1, 1, 0)
    shapes.scatter([1, 2], [1, 2], color=linear_cmap("x", "Viridis256", 0, 3))
    shapes.add_layout(bokeh_models.BoxAnnotation(left=1))
    shapes.add_layout(bokeh_models.Arrow(end=bokeh_models.VeeHead(), x_start=0, y_start=0,
                                         x_end=1, y_end=1))
    return bokeh_layouts.column(bokeh_layouts.gridplot([[image, shapes]]),
                                bokeh_layouts.row(figure(), bokeh_layouts.Spacer(width=10)))


def bokeh_item(plot: object) -> dict:
    return json.loads(json.dumps(json_item(plot)))  # as it arrives: JSON


_LINES = bokeh_item(_lines())


def drawn(item: object) -> str:
    out, _ = safe_bundle({BOKEH: item, "text/plain": "figure(...)"}, {})
    assert "text/html" in out, out["text/plain"]
    assert out["text/plain"] == "figure(...)"
    return frame_document(out["text/html"])


@pytest.mark.parametrize("make", [_lines, _bars, _heatmap_and_layout])
def test_bokeh_plots_people_make_are_drawn_by_the_kernels_bokehjs(make: object) -> None:
    item = bokeh_item(make())
    document = drawn(item)
    scripts = scripts_of(document)
    assert len(scripts) == 4, [s[0] for s in scripts]  # sizer, data block, BokehJS, start-up
    assert json.loads(scripts[1][1])["doc"] == item["doc"]
    import bokeh
    shipped = Path(bokeh.__file__).parent / "server" / "static" / "js" / "bokeh.min.js"
    assert scripts[2][1] == shipped.read_text("utf-8")
    policy = re.search(r'Content-Security-Policy" content="([^"]*)"', document).group(1)
    pinned = {f"'sha256-{base64.b64encode(hashlib.sha256(t.encode()).digest()).decode()}'"
              for a, t in scripts if "application/json" not in a}
    assert set(re.search(r"script-src ([^;]*)", policy).group(1).split()) == pinned
    assert "unsafe-eval" not in policy and "connect-src" not in policy


def _with_callback() -> object:
    p = figure()
    p.scatter([1], [1])
    p.js_on_event("tap", bokeh_models.CustomJS(code="top.postMessage(1, '*')"))
    return p


def _with_open_url() -> object:
    p = figure(tools="tap")
    p.scatter([1], [1])
    p.select_one(bokeh_models.TapTool).callback = bokeh_models.OpenURL(url="http://x/")
    return p


def _with_image_url() -> object:
    p = figure()
    p.image_url(url=["http://x/i.png"], x=0, y=0, w=1, h=1)
    return p


def _with_tooltip(tooltips: object) -> object:
    p = figure(tooltips=tooltips)
    p.scatter([1], [1])
    return p


@pytest.mark.parametrize(("make", "says"), [
    (_with_callback, "the model CustomJS, which is not drawn from a sandbox"),
    (_with_open_url, "the model OpenURL"),
    (lambda: bokeh_layouts.column(bokeh_models.Div(text="<meta http-equiv=refresh "
                                                       "content='0;url=http://x/'>")),
     "the model Div"),
    (lambda: _with_tooltip("<img src='http://x/i'>@x"), "a tooltip written as HTML"),
    (lambda: _with_tooltip([("x", "@x{safe}")]), "a tooltip field shown as HTML ({safe})"),
    (lambda: _with_tooltip([("x", "<style>:host{inset:0}</style><a href='http://x/'>go</a>")]),
     "a tooltip written as HTML"),
    (_with_image_url, "the model ImageURL"),
])
def test_a_bokeh_plot_with_code_links_or_html_shows_as_text_saying_what(make: object,
                                                                         says: str) -> None:
    out, _ = safe_bundle({BOKEH: bokeh_item(make()), "text/plain": "p"}, {})
    assert set(out) == {"text/plain"}, out.keys()
    assert out["text/plain"].startswith("p\n[sandbox] a Bokeh plot shows as text here: it has ")
    assert says in out["text/plain"]


def _hover_tool(item: dict) -> dict:
    pending = [item]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            if value.get("name") == "HoverTool":
                return value
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    raise AssertionError("no HoverTool")


@pytest.mark.parametrize("wrap", ["map", "array", "id"])
def test_wrapped_attributes_or_tooltips_hide_nothing(wrap: str) -> None:
    """BokehJS decodes a model's attributes and values in any JSON form it knows: a map or
    an array around them is read like the plain form, and is checked like it."""
    item = copy.deepcopy(_LINES)
    hover = _hover_tool(item)
    html_tooltip = "<a href='http://x/' target='_self'>go</a> @x{safe}"
    if wrap == "map":
        hover["attributes"] = {"type": "map", "entries": [["tooltips", html_tooltip]]}
    elif wrap == "array":
        hover["attributes"]["tooltips"] = {"type": "array", "entries": [["x", html_tooltip]]}
    else:
        hover["attributes"] = {"id": hover["id"]}
    refused = charts.bokeh_parts(item)
    assert isinstance(refused, str) and refused.startswith(
        "[sandbox] a Bokeh plot shows as text here: it has "), refused


def _places(value: object, path: tuple = ()) -> list[tuple]:
    """Every dict and list of a JSON value, by path."""
    found = [path] if isinstance(value, (dict, list)) else []
    children = (value.items() if isinstance(value, dict)
                else enumerate(value) if isinstance(value, list) else ())
    for key, child in children:
        found += _places(child, (*path, key))
    return found


@settings(max_examples=150, deadline=None)
@given(name=st.text(min_size=1, max_size=30).filter(lambda n: n not in charts._BOKEH_MODELS)
       | st.sampled_from(["CustomJS", "CustomJSHover", "CustomJSTickFormatter", "OpenURL",
                          "Div", "Paragraph", "ImageURL", "AjaxDataSource", "WMTSTileSource",
                          "InlineStyleSheet", "ImportedStyleSheet", "Template", "Button",
                          "Menu", "HTMLLabel"]),
       where=st.integers(min_value=0), as_def=st.booleans())
def test_a_model_not_listed_anywhere_in_a_plot_makes_it_text(name: str, where: int,
                                                             as_def: bool) -> None:
    """Wherever a hostile child puts it (a list, an attribute, a map's entries, the document
    itself), one model not on the list, or a model the plot defines, keeps the plot from
    the frame."""
    item = copy.deepcopy(_LINES)
    places = _places(item)
    place = places[where % len(places)]
    target = item
    for key in place:
        target = target[key]
    node = ({"type": "model", "name": "Figure", "extends": {"id": "p1"}} if as_def
            else {"type": "object", "name": name, "id": "p999999"})
    if isinstance(target, list):
        target.append(node)
    else:
        target["sneaked"] = node
    refused = charts.bokeh_parts(item)
    assert isinstance(refused, str) and "a Bokeh plot shows as text here" in refused


@settings(max_examples=100, deadline=None)
@given(title=st.text(), values=st.lists(st.text(), min_size=1, max_size=4))
def test_no_text_in_a_bokeh_plot_ends_its_data_block(title: str, values: list) -> None:
    item = copy.deepcopy(_LINES)
    item["doc"]["title"] = title
    item["doc"]["roots"][0]["attributes"]["tags"] = values
    markup, _ = charts.bokeh_parts(item)  # the frame's body: the plot's place, its data
    [(attributes, block)] = scripts_of(markup)
    assert 'type="application/json"' in attributes and not set("<>&") & set(block)
    assert json.loads(block)["doc"] == item["doc"]


@pytest.mark.parametrize("item", [[1], "x", {"doc": []}, {"doc": {"roots": []}},
                                  {"root_id": "p1", "doc": {"roots": {}}}])
def test_what_is_not_a_bokeh_plot_shows_as_text(item: object) -> None:
    out, _ = safe_bundle({BOKEH: item, "text/plain": "p"}, {})
    assert out == {"text/plain": "p\n[sandbox] a Bokeh plot shows as text here: its data is "
                                 "not a plot"}


def test_without_bokeh_in_the_kernels_environment_the_plot_is_text(monkeypatch) -> None:
    item = bokeh_item(_lines())
    monkeypatch.setattr(charts, "installed_package", lambda name: None)
    out, _ = safe_bundle({BOKEH: item, "text/plain": "p"}, {})
    assert out == {"text/plain": "p\n" + charts.BOKEH_MISSING_NOTE}


def test_a_plot_made_by_another_bokeh_says_which(monkeypatch) -> None:
    """BokehJS reads only what its own version writes: a plot from a Bokeh the sandbox
    installed for itself says so instead of failing in the frame."""
    item = bokeh_item(_lines())
    item["doc"]["version"] = "2.4.3"
    out, _ = safe_bundle({BOKEH: item, "text/plain": "p"}, {})
    import bokeh
    assert out["text/plain"] == (
        "p\n[sandbox] a Bokeh plot shows as text here: it was made by Bokeh 2.4.3, and the "
        f"kernel's environment has Bokeh {bokeh.__version__}")
