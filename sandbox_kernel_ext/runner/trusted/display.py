"""What a sandboxed cell's display data may become before it reaches a notebook page.

Everything a confined session displays was made by code nobody trusts, and a notebook page
holds the Jupyter server's credentials: markup that runs script in the page's origin could
call the server's API and run code in the unconfined kernel. So the trusted side decides,
format by format, what crosses and how it renders (docs/guarantees.md has the table):

- as they are: `text/plain` (control characters removed), `image/png`, `image/jpeg`,
  `image/gif` (checked to be base64), `application/json` (a tree viewer, no markup);
- isolated: `text/html` is written again without anything that acts by itself (`inert_html`:
  no refresh, frames, objects, scripts or event handlers) and renders inside an
  `<iframe sandbox="allow-scripts">` without `allow-same-origin`, so it runs in an opaque
  origin (no cookies, no token, no parent DOM), under a Content-Security-Policy that lets only
  our own sizing script run and loads nothing from any network; `image/svg+xml` becomes an
  `<img>` of a data URL (an SVG image never runs script);
- rendered inside the sandbox, then isolated: `text/markdown` is made HTML by the child
  (`child/display.py`, mistune), in the sandbox's own time and budget, and crosses as
  `text/html` above: the page's own Markdown renderer would typeset its math (MathJax styles
  load URLs and move text over the page) and draw its mermaid diagrams (CSS of their own),
  and would render raw HTML and make links. This side never renders Markdown: a display
  with Markdown and no HTML (only a hostile child sends one) shows as text, with a line
  saying why;
- drawn in the same frame: a plotly figure, a Vega or Vega-Lite spec and a Bokeh plot's
  JSON item (`charts.py`), as data, by a library installed in the kernel's own environment;
- dropped: `text/latex` (MathJax again), `application/javascript`, every other
  renderer-specific type (`application/vnd.*`: widgets, Bokeh's page scripts...) and
  anything else; the text/plain form still shows, and for a widget or a Bokeh page script a
  line says why.

Each conversion here is linear in its input or runs under a time budget (`inert_html`), so
no display holds the kernel's thread past it; a format that passes its budget shows as text,
with a line saying why. Nothing here raises on hostile input except `ValueError` for a frame
of the wrong shape. The text rules are `crossing_text.py`'s, shared with every channel.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import html
import json
import re
import secrets
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

from .charts import (BOKEH_ITEM_MIME, CHART_NOTES, PLOTLY_MIME, VEGA_MIME, TrustedScript,
                     bokeh_parts, plotly_parts, trusted_script, vega_parts)
from .crossing_text import display_text, line_text, valid_unicode

__all__ = [
    "DisplayOutput", "MAX_BUNDLE_BYTES", "NO_TYPESETTING", "UNTRUSTED_NOTE", "check_bundle",
    "safe_bundle", "format_error", "inert_html", "inert_html_and_text", "isolated_html",
    "bundle_size", "namespaced_display_id",
]

MAX_BUNDLE_BYTES = 8 * 1024 * 1024  # one display's data, as the JSON it arrived in
MAX_MIME_TYPES = 32
MAX_TRACEBACK_FRAMES = 40
_WIDGET = "application/vnd.jupyter.widget-view+json"
_IMAGES = ("image/png", "image/jpeg", "image/gif")
# RFC 6838's names (case does not matter): `_` too, as in Bokeh's and HoloViews' types.
_MIME = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]{0,126}/[a-z0-9][a-z0-9!#$&^_.+-]{0,126}\Z",
                   re.IGNORECASE)
WIDGET_NOTE = ("[sandbox] an ipywidget made inside the sandbox is not live here: widgets need "
               "a connection to the notebook page, which does not cross the sandbox")
MARKDOWN_NOTE = ("[sandbox] Markdown shows as text here: a sandbox's Markdown is made HTML "
                 "inside the sandbox, and this display came without its HTML")
SLOW_HTML_NOTE = ("[sandbox] HTML too complex to check within its time budget shows as text "
                  "(1 s, and 1 s more per MB)")

# The class JupyterLab's MathJax skips: it typesets HTML outputs, and would find TeX (a
# `\href` link, or work enough to hold the tab) in the text inside a frame element and in
# the records that stand for widgets.
NO_TYPESETTING = "mathjax_ignore"
UNTRUSTED_NOTE = ("[sandbox] HTML from a sandboxed cell shows as text here: this page removed "
                  "the frame that isolates it (JupyterLab does for a notebook it does not trust)")
# The text/plain of an object with no text form of its own (IPython's HTML, for one).
_OBJECT_REPR = re.compile(r"<[\w.]+ object( at 0x[0-9a-f]+)?>\Z")

# The first script of every isolated frame (the only one, but for a chart's): it tells the
# page how tall its content is, and keeps every link from opening. The root element's own
# height (plus a horizontal scrollbar's, if any), not its scrollHeight: that one is never
# less than the frame's viewport, so a frame could grow but never shrink (a one-line output
# kept the first 120px).
_SIZER = ("new ResizeObserver(function(){var d=document.documentElement;parent.postMessage("
          "{sandboxFrameHeight:Math.ceil(d.getBoundingClientRect().height)+innerHeight-"
          "d.clientHeight},'*')}).observe(document.documentElement);"
          # No link opens anything, a plain click or not: the frame may open no popup, but a
          # Ctrl-, Shift- or middle-click opened a tab at the link (data in its URL). The
          # event's whole path, not its target: a link inside a shadow root (Bokeh draws in
          # them; its logo links out) shows the document only its host.
          "['click','auxclick'].forEach(function(t){document.addEventListener(t,function(e){"
          "var p=e.composedPath();for(var i=0;i<p.length;i++){var n=p[i].localName;"
          "if(n==='a'||n==='area'){e.preventDefault();return;}}},true);});")
_SIZER_SCRIPT = trusted_script(_SIZER)


def _frame_policy(scripts: tuple[TrustedScript, ...]) -> str:
    """The frame's CSP: only the given scripts run (by hash), nothing is fetched."""
    sources = " ".join(script.source for script in (_SIZER_SCRIPT, *scripts))
    return (f"default-src 'none'; script-src {sources}; style-src 'unsafe-inline'; "
            "img-src data:; font-src data:; media-src data:; form-action 'none'")


@dataclass(frozen=True)
class DisplayOutput:
    """One output of a sandboxed cell, checked: `kind` is "display", "update" (of an earlier
    display with the same id), "result" (the last expression's value) or "clear"."""

    kind: str
    data: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    display_id: str | None = None
    wait: bool = False


def check_bundle(data: Any, metadata: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The shape a bundle must have (a dict of MIME type -> str, or JSON for
    application/json and *+json types); ValueError otherwise. A format whose name is no MIME
    type (`text/html;charset=utf-8`, a library's own) is dropped, not taken for a broken
    protocol: nothing would show it, and an odd name must not end the session."""
    if not isinstance(data, dict) or not isinstance(metadata, dict):
        raise ValueError("display data and metadata must be objects")
    if len(data) > MAX_MIME_TYPES:
        raise ValueError(f"a display has more than {MAX_MIME_TYPES} formats")
    kept = {mime: value for mime, value in data.items()
            if isinstance(mime, str) and _MIME.match(mime)}
    for mime, value in kept.items():
        if not isinstance(value, str) and not mime.endswith("json"):
            raise ValueError(f"the {mime} form of a display must be text")
    return kept, metadata


def _base64_image(value: str) -> str | None:
    try:
        raw = base64.b64decode(value.replace("\n", ""), validate=True)
    except (binascii.Error, ValueError):
        return None
    return base64.b64encode(raw).decode("ascii")


def _image_metadata(metadata: dict[str, Any], mime: str) -> dict[str, Any]:
    meta = metadata.get(mime)
    if not isinstance(meta, dict):
        return {}
    return {key: int(meta[key]) for key in ("width", "height")
            if isinstance(meta.get(key), (int, float)) and not isinstance(meta.get(key), bool)
            and 0 < meta[key] < 100_000}


# Elements that act without a click even where no script runs (a refresh that navigates the
# frame, a nested frame whose srcdoc we never parse, plugins), or whose content a browser does
# not render: dropped with everything inside them.
_DROPPED = frozenset({"meta", "base", "link", "script", "noscript", "iframe", "frame",
                      "frameset", "object", "embed", "applet", "portal", "fencedframe",
                      "template", "noembed", "noframes",
                      # SVG animation can set a link's target to _self (a click then
                      # navigates the frame) or its href: no animation crosses.
                      "set", "animate"})
_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
                   "source", "track", "wbr", "frame", "param"})
# A frame's own document (srcdoc); a link's or form's target (`_self` would navigate the frame
# on a click, past our `<base target="_blank">`); a ping on click.
_DROPPED_ATTRIBUTES = frozenset({"srcdoc", "target", "formtarget", "ping"})
# Elements a click follows: each is written with target="_blank", which a frame without
# allow-popups cannot open, so a click navigates nothing.
_LINKS = frozenset({"a", "area", "form"})
# Where the text form of HTML starts a line, and where it puts a gap (a table's cells).
_LINE_BREAKS = frozenset({"p", "div", "br", "tr", "li", "table", "pre", "h1", "h2", "h3", "h4",
                          "h5", "h6", "section", "article", "header", "footer", "caption",
                          "dt", "dd", "blockquote", "hr"})
_CELLS = frozenset({"td", "th"})
_TAG_NAME = re.compile(r"[a-z][a-z0-9-]*\Z")
_ATTRIBUTE_NAME = re.compile(r"[a-z_:][-a-z0-9_:.]*\Z")


class _InertHTML(HTMLParser):
    """Reads markup and writes it again in a canonical form: every tag ours, every attribute
    value quoted and escaped, every text escaped, so the browser parses exactly the elements
    this parser saw, and none of the `_DROPPED` ones, event handlers or `srcdoc`s."""

    def __init__(self, deadline: float) -> None:
        super().__init__(convert_charrefs=True)
        self.deadline = deadline
        self.out: list[str] = []
        self.text: list[str] = []  # what a reader sees of it, for the untrusted page's text form
        self._skipping: list[str] = []  # the dropped element we are inside, innermost last
        self._raw = False  # inside <style>: CSS, written with every `<` escaped for CSS

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._start(tag, attrs, closed=False)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._start(tag, attrs, closed=True)

    def _start(self, tag: str, attrs: list[tuple[str, str | None]], closed: bool) -> None:
        self._check_time()
        if self._skipping:
            if tag == self._skipping[-1] and not closed and tag not in _VOID:
                self._skipping.append(tag)
            return
        if tag in _DROPPED:
            if not closed and tag not in _VOID:
                self._skipping.append(tag)
            return
        if not _TAG_NAME.match(tag):
            return  # a name no serialisation of ours could carry: its content stays
        kept = "".join(
            f" {name}" if value is None else f" {name}=\"{html.escape(value, quote=True)}\""
            for name, value in attrs
            if _ATTRIBUTE_NAME.match(name) and not name.startswith("on")
            and name not in _DROPPED_ATTRIBUTES)
        if tag in _LINKS:  # SVG's <a> takes no <base target>: each says where it opens
            kept += ' target="_blank"'
        self.out.append(f"<{tag}{kept}{' /' if closed else ''}>")
        self._raw = tag == "style" and not closed
        if tag in _LINE_BREAKS:
            self.text.append("\n")
        elif tag in _CELLS:
            self.text.append("  ")

    def handle_endtag(self, tag: str) -> None:
        if self._skipping:
            if tag == self._skipping[-1]:
                self._skipping.pop()
            return
        self._raw = False
        if _TAG_NAME.match(tag) and tag not in _DROPPED:
            self.out.append(f"</{tag}>")

    def _check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise _TooSlow

    def handle_data(self, data: str) -> None:
        self._check_time()
        if self._skipping:
            return
        # In CSS a `<` is only ever text: escaped as CSS, no browser can end the style early.
        if self._raw:
            self.out.append(data.replace("<", "\\3c "))
        else:
            self.out.append(html.escape(data, quote=False))
            self.text.append(data)


class _TooSlow(Exception):
    """Markup that would hold the kernel's thread (HTMLParser is quadratic on some inputs)."""


def inert_html(markup: str) -> str | None:
    """`markup` written again so that nothing in it acts by itself (see `_InertHTML`);
    comments, declarations and processing instructions go. None for markup whose parse
    passes its time budget (1 s, and 1 s more per MB): a display is no way to hold the
    kernel's thread (Python's parser takes quadratic time on unclosed tags)."""
    both = inert_html_and_text(markup)
    return None if both is None else both[0]


def inert_html_and_text(markup: str) -> tuple[str, str] | None:
    """`inert_html`, and the text a reader sees of it (a line per block, cells apart)."""
    parser = _InertHTML(time.monotonic() + 1.0 + len(markup) / 1e6)
    try:
        parser.feed(valid_unicode(markup))
        parser.close()
    except _TooSlow:
        return None
    lines = (line.rstrip() for line in "".join(parser.text).splitlines())
    return "".join(parser.out), "\n".join(line for line in lines if line.strip())


def isolated_html(markup: str, *, frame_id: str | None = None, text: str = "",
                  scripts: tuple[TrustedScript, ...] = ()) -> str:
    """`markup` inside a sandboxed iframe with an opaque origin, under a CSP that runs only
    the sizing script; the page-side script (ours, with no sandbox bytes in it) sizes the
    frame to its content.

    `text` (its text form) goes inside the iframe element: a browser never shows an
    iframe's content, but a notebook reopened untrusted passes the output through
    JupyterLab's sanitiser, which drops the frame and keeps what was inside it, so the text
    shows there with a line saying why, not a blank.

    `scripts` (a chart library and its start-up, `charts.py`: never a sandbox's bytes) run
    after the markup, each pinned by its hash."""
    frame_id = frame_id or "sandbox-frame-" + secrets.token_hex(8)
    document = (
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{_frame_policy(scripts)}\">"
        f"<script>{_SIZER}</script>"
        # A link clicked in the frame opens nothing (no popups allowed), rather than
        # navigating the frame to a page that could pass for part of the notebook.
        "<base target=\"_blank\">"
        # Tables as JupyterLab shows a DataFrame (the frame sees none of the page's styles).
        "<style>body{margin:0;font-family:system-ui,sans-serif;font-size:13px}"
        "table{border-collapse:collapse;border:none;font-size:12px}"
        "th,td{border:none;padding:4px 8px;text-align:right}thead th{border-bottom:1px solid #bbb}"
        "tbody tr:nth-child(odd){background:#f5f5f5}tbody tr:hover{background:#e1f0fa}</style>"
        f"</head><body>{markup}"
    )
    srcdoc = (html.escape(document, quote=True) + "".join(s.element for s in scripts)
              + html.escape("</body></html>", quote=True))
    page_script = (
        "(function(){var f=document.getElementById('" + frame_id + "');if(!f)return;"
        "function size(e){if(!f.isConnected){window.removeEventListener('message',size);"
        "return;}if(e.source!==f.contentWindow||!e.data)return;var h=e.data.sandboxFrameHeight;"
        "if(typeof h==='number'&&isFinite(h))f.style.height=Math.min(Math.max(h,16),5000)+'px';}"
        "window.addEventListener('message',size);})();"
    )
    return (
        f"<iframe id=\"{frame_id}\" class=\"sandbox-output {NO_TYPESETTING}\" "
        "sandbox=\"allow-scripts\" "
        "referrerpolicy=\"no-referrer\" title=\"output of a sandboxed cell\" "
        "style=\"width:100%;height:120px;border:0;border-left:3px solid #d0d7de;"
        "box-sizing:border-box;display:block\" "
        f"srcdoc=\"{srcdoc}\">{_untrusted_form(text)}</iframe>"
        f"<script>{page_script}</script>"
    )


def _untrusted_form(text: str) -> str:
    return (f"<pre>{html.escape(text, quote=False)}</pre>" if text else "") + (
        f"<p>{html.escape(UNTRUSTED_NOTE, quote=False)}</p>")


def safe_bundle(data: dict[str, Any], metadata: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The bundle that may cross into the notebook page (see the module's docstring)."""
    out: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    plain = display_text(data["text/plain"]) if isinstance(data.get("text/plain"), str) else ""
    for mime in _IMAGES:
        value = data.get(mime)
        if isinstance(value, str) and (image := _base64_image(value)) is not None:
            out[mime] = image
            if found := _image_metadata(metadata, mime):
                meta[mime] = found
    if isinstance(data.get("application/json"), (dict, list)):
        try:
            # No NaN or infinity: the kernel's message encoder refuses them.
            out["application/json"] = json.loads(valid_unicode(json.dumps(
                data["application/json"], ensure_ascii=False, allow_nan=False)))
        except (TypeError, ValueError, RecursionError):
            pass
    notes = [note for prefix, note in CHART_NOTES.items() if any(
        str(mime).startswith(prefix) for mime in data)]
    markup, markdown = data.get("text/html"), data.get("text/markdown")
    vega = next((mime for mime in data if isinstance(mime, str) and VEGA_MIME.match(mime)),
                None)
    if PLOTLY_MIME in data or BOKEH_ITEM_MIME in data or vega is not None:
        # The chart is what shows: a library's own HTML only loads its script from a network.
        markup = markdown = None
        parts = (plotly_parts(data[PLOTLY_MIME]) if PLOTLY_MIME in data
                 else bokeh_parts(data[BOKEH_ITEM_MIME]) if BOKEH_ITEM_MIME in data
                 else vega_parts(data[vega]))
        if isinstance(parts, str):
            notes.append(parts)
        else:
            out["text/html"] = isolated_html(parts[0], text=display_text(plain),
                                             scripts=parts[1])
    if isinstance(markup, str):
        converted = inert_html_and_text(markup)
        if converted is not None:
            inert, text = converted
            readable = plain if plain and not _OBJECT_REPR.match(plain) else text
            out["text/html"] = isolated_html(inert, text=display_text(readable))
        else:
            notes.append(SLOW_HTML_NOTE)
            plain = plain or display_text(markup)
    elif isinstance(markdown, str):
        # Never rendered here (only a hostile child sends Markdown without its HTML): the
        # conversion has no time budget, and the sandbox's time is not the kernel's.
        notes.append(MARKDOWN_NOTE)
        plain = plain or display_text(markdown)
    svg = data.get("image/svg+xml")
    if "text/html" not in out and isinstance(svg, str):
        source = base64.b64encode(valid_unicode(svg).encode("utf-8")).decode("ascii")
        out["text/html"] = (f"<img alt=\"SVG from a sandboxed cell\" "
                            f"src=\"data:image/svg+xml;base64,{source}\">")
    if _WIDGET in data:
        notes.append(WIDGET_NOTE)
    plain = "\n".join(part for part in (plain, *notes) if part)
    if not plain and not out:
        dropped = ", ".join(sorted(str(m) for m in data)[:8]) or "nothing"
        plain = f"[sandbox] a display in a format not shown here ({line_text(dropped)})"
    out["text/plain"] = plain
    return out, meta


def bundle_size(data: dict[str, Any]) -> int:
    """About how many bytes a bundle takes once made safe (what the per-cell cap counts)."""
    return sum(len(value) if isinstance(value, str) else len(json.dumps(value))
               for value in data.values())


def namespaced_display_id(session: str, display_id: Any) -> str | None:
    """A sandbox's display id, made unique to its session: it can update only its own
    displays, never one of the kernel's (an approval widget, the gauges)."""
    if display_id is None:
        return None
    if not isinstance(display_id, str) or not 0 < len(display_id) <= 256:
        raise ValueError("a display id must be text of 1 to 256 characters")
    digest = hashlib.sha256(f"{session}\0{display_id}".encode()).hexdigest()[:32]
    return f"sandbox-{digest}"


# -- errors ---------------------------------------------------------------------------------------
_RED, _GREEN, _CYAN, _RESET = "\x1b[0;31m", "\x1b[0;32m", "\x1b[0;36m", "\x1b[0m"


def format_error(error: Any) -> tuple[str, str, list[str]]:
    """(ename, evalue, traceback lines) from a session's error report, formatted the way
    IPython shows a cell's exception (`Cell In[n], line L` and the lines around it). Every
    piece of text is the sandbox's and is cleaned; the layout and colours are ours."""
    if not isinstance(error, dict):
        raise ValueError("an error report must be an object")
    ename = line_text(error.get("ename", "Error")) or "Error"
    evalue = display_text(error.get("evalue", ""), 10_000)
    frames = error.get("frames")
    if not isinstance(frames, list):
        raise ValueError("an error report needs a list of frames")
    if not frames:  # a magic used wrongly, as IPython shows a UsageError: one line
        return ename, evalue, [f"{_RED}{ename}{_RESET}: {evalue}" if evalue else f"{_RED}{ename}{_RESET}"]
    lines = [f"{_RED}{'-' * 75}{_RESET}",
             f"{_RED}{ename}{_RESET}{' ' * max(1, 42 - len(ename))}Traceback (most recent call last)"]
    for frame in frames[-MAX_TRACEBACK_FRAMES:]:
        if not isinstance(frame, dict):
            raise ValueError("a traceback frame must be an object")
        lines.append(_format_frame(frame))
    lines.append(f"{_RED}{ename}{_RESET}: {evalue}" if evalue else f"{_RED}{ename}{_RESET}")
    return ename, evalue, lines


def _format_frame(frame: dict[str, Any]) -> str:
    lineno = frame.get("lineno")
    lineno = lineno if isinstance(lineno, int) and not isinstance(lineno, bool) else 0
    cell = frame.get("cell")
    name = line_text(frame.get("name") or "")
    if isinstance(cell, int) and not isinstance(cell, bool):
        head = f"Cell {_GREEN}In[{cell}], line {lineno}{_RESET}"
        if name and name != "<module>":
            head += f", in {_CYAN}{name}(){_RESET}"
    else:
        head = (f"File {_GREEN}{line_text(frame.get('filename', '?'), 500)}:{lineno}{_RESET}"
                + (f", in {_CYAN}{name}{_RESET}" if name else ""))
    body = []
    source = frame.get("lines")
    for entry in source if isinstance(source, list) else ():
        if (not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], int)
                or not isinstance(entry[1], str)):
            continue
        number, text = entry
        marker = f"{_GREEN}----> {number}{_RESET}" if number == lineno else f"      {number}"
        body.append(f"{marker} {display_text(text, 500)}")
    return "\n".join([head, *body]) + "\n"
