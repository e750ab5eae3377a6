"""What a sandbox's plotly figure becomes (`runner/trusted/charts.py`), checked as data: the
figure crosses as JSON no text in it can end, the only scripts are the kernel environment's
plotly.js and ours (pinned by hash), and the options that point plotly at a server stay out."""

from __future__ import annotations

import base64
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
    out, _ = safe_bundle({PLOTLY: {"data": data, "layout": layout}, "text/plain": "f"}, {})
    document = frame_document(out["text/html"])
    scripts = scripts_of(document)
    # The sizer, the data block, plotly.js, our start-up: nothing more, in that order.
    assert len(scripts) == 4, [s[0] for s in scripts]
    attributes, block = scripts[1]
    assert 'type="application/json"' in attributes
    assert not set("<>&") & set(block)
    assert json.loads(block)["data"] == data and json.loads(block)["layout"] == layout


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
    assert "closest('a,area'))e.preventDefault()" in scripts_of(document)[0][1]


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


def test_charts_without_an_isolated_renderer_say_so() -> None:
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
