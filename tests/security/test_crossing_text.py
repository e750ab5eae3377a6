"""A sandbox's text, wherever it crosses into the trusted side (`runner/trusted/crossing_text.py`):
output variables, `input()` prompts, streams, display text and error names, and Markdown.

Findings of an attack corpus, each written as a test first: a lone surrogate in an `-o`
string made `print(x)` raise in the kernel; a prompt kept its line breaks, so a long one put
its last words ("session expired, password:") next to the answer box far below the
"[sandbox]" mark; streams kept bidi and invisible characters that displays dropped; and the
trusted side converted a sandbox's Markdown with no time bound (480 KB held a 2 s cell for
8.5 s). Real confined sessions throughout; the properties drive the trusted side's own code
(the control channel, the stream cleaner) with any text hypothesis makes.
"""

from __future__ import annotations

import html
import json
import re
import socket
import subprocess
import sys
import textwrap
import unicodedata
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox_kernel_ext import CapabilityDeclaration, SandboxManager
from sandbox_kernel_ext.runner.linux import landlock
from sandbox_kernel_ext.runner.trusted.control import CellEvents, ControlChannel
from sandbox_kernel_ext.runner.trusted.crossing_text import stream_text

from interfaces import sandbox_session

needs_landlock = pytest.mark.skipif(
    not sys.platform.startswith("linux") or landlock.landlock_abi() < 1, reason="needs Landlock")

MARKER = "[sandbox] "
# Characters that reorder text or hide text in text: none may reach a person.
BIDI = set("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
INVISIBLE = set("\u00ad\u180e\u200b\u2060\u2061\u2062\u2063\u2064\ufeff\ufff9\ufffa\ufffb"
                + "".join(chr(c) for c in range(0xE0000, 0xE0080)))
SEPARATORS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
SGR = re.compile(r"\x1b\[[0-9;]*m")

# Cell prelude: a raw handle on the control socket, for frames the child library never sends.
RAW = textwrap.dedent("""\
    import os as _os, socket as _socket, json as _json
    _raw = _socket.socket(fileno=_os.dup(3))
    def frame(d):
        _raw.sendall((_json.dumps(d) + '\\n').encode())
""")


def srcdoc(markup: str) -> str:
    found = re.search(r'srcdoc="([^"]*)"', markup)
    assert found, markup[:200]
    return html.unescape(found.group(1))


# Letters that draw nothing (found in review: 160 Hangul fillers put a fake question on a
# visual line of its own, away from the marker).
BLANK_LETTERS = "\u115f\u1160\u3164\uffa0\u2800"

# Any text a child could send: every code point, lone surrogates included, weighted towards
# the ones that matter here.
_ANY_CHAR = st.characters(exclude_categories=())
_HOSTILE_CHAR = st.sampled_from(sorted(BIDI | INVISIBLE) + list(SEPARATORS)
                                + ["\x1b", "\x9b", "\x00", "\x07", "\x08", "\t", "\ud800",
                                   "\udfff", "\u200c", "\u200d", "\u0301", "[", "]", ";", "m",
                                   *BLANK_LETTERS])
_TEXT = st.text(st.one_of(_ANY_CHAR, _HOSTILE_CHAR), max_size=400)


def _shown_anywhere(char: str) -> bool:
    """Not a control, not a bidi or invisible character, not a surrogate."""
    return (char not in BIDI and char not in INVISIBLE
            and unicodedata.category(char) not in ("Cc", "Cs"))


# =============================================================================================
# Output variables
# =============================================================================================

VARIABLES_CELL = textwrap.dedent("""\
    x = 'a\\ud800b'
    y = {'k\\udfff': ['\\ud83d', ('t\\udc80',)], 'n': 'line 1\\nline 2\\u202e\\x00'}
""")


def _assert_clean_variables(variables: dict[str, Any]) -> None:
    json.dumps(variables, ensure_ascii=False).encode("utf-8")  # what a message encoder does
    assert variables["x"] == "a\ufffdb"
    assert variables["y"] == {"k\ufffd": ["\ufffd", ["t\ufffd"]],
                              # data, not display: only made encodable
                              "n": "line 1\nline 2\u202e\x00"}


@needs_landlock
def test_output_variables_from_run_python_are_encodable(manager: SandboxManager) -> None:
    sid = manager.create_sandbox(CapabilityDeclaration())
    try:
        result = manager.run_python(sid, VARIABLES_CELL, outputs=["x", "y"])
    finally:
        manager.destroy(sid)
    assert result.exit_code == 0, result.stderr
    _assert_clean_variables(result.variables)


@needs_landlock
def test_output_variables_from_a_session_are_encodable(manager: SandboxManager) -> None:
    with sandbox_session(manager) as s:
        result = s.run_cell(VARIABLES_CELL, outputs=["x", "y"])
    assert result.error is None and result.killed is None, result
    _assert_clean_variables(result.variables)


# =============================================================================================
# input() prompts
# =============================================================================================

SPOOF = ("Output of the cell\n" * 30 + "\u202eYour Jupyter server session expired.\u2028"
         "Re-enter\u200b your\x0b password:\x0c\r\u2029\x85\x1b[2K\x1b]0;Jupyter\x07 ")


def _assert_one_marked_line(prompt: str) -> None:
    assert prompt.startswith(MARKER), prompt
    assert prompt.splitlines() == [prompt] and not set(prompt) & set(SEPARATORS), prompt
    assert all(_shown_anywhere(c) and c not in "\u200c\u200d" and c not in BLANK_LETTERS
               for c in prompt), ascii(prompt)
    assert len(prompt) <= len(MARKER) + 200
    prompt.encode("utf-8")


@needs_landlock
def test_a_prompt_reaches_the_person_as_one_marked_line(manager: SandboxManager) -> None:
    asked: list[tuple[str, bool]] = []

    def answer(prompt: str, password: bool) -> str:
        asked.append((prompt, password))
        return "typed"

    with sandbox_session(manager) as s:
        result = s.run_cell(f"import getpass\na = input({SPOOF!r})\n"
                            f"b = getpass.getpass('Token:\\n\\n')", outputs=["a", "b"],
                            on_input=answer)
    assert result.variables == {"a": "typed", "b": "typed"}, result
    (first, _), (second, password) = asked
    _assert_one_marked_line(first)
    _assert_one_marked_line(second)
    assert password and second == MARKER + "Token: \u21b5 "
    # The end of the prompt stays on the marker's line, cut to its length.
    assert first.endswith("…") and "Output of the cell \u21b5 Output" in first


def _asked_prompt(prompt: str) -> str:
    """What the trusted side's control channel passes to its input callback for a child's
    input request with `prompt`."""
    parent, child = socket.socketpair()
    asked: list[str] = []
    broken: list[str] = []
    events = CellEvents(on_input=lambda text, password: asked.append(text) or "")
    channel = ControlChannel(parent, None, on_usage=lambda t, c: None,
                             on_malformed=broken.append, events=events)
    try:
        channel.feed(json.dumps({"type": "input", "id": 1, "prompt": prompt,
                                 "password": False}).encode() + b"\n")
    finally:
        channel.close()
        child.close()
    assert broken == [] and len(asked) == 1
    return asked[0]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_TEXT)
def test_any_prompt_is_one_clean_marked_line(prompt: str) -> None:
    shown = _asked_prompt(prompt)
    _assert_one_marked_line(shown)
    # Letters and digits of a short prompt all stay, in their order (an escape sequence
    # takes the letters it is made of).
    if len(prompt) < 60 and "\x1b" not in prompt and "\x9b" not in prompt:
        words = [c for c in prompt
                 if unicodedata.category(c)[0] in "LN" and c not in BLANK_LETTERS]
        assert [c for c in shown[len(MARKER):] if unicodedata.category(c)[0] in "LN"] == words


# =============================================================================================
# Streams
# =============================================================================================

_PRINTABLE = st.characters(categories=["L", "M", "N", "P", "S", "Zs"])
_SGR_SEQUENCE = st.from_regex(r"\x1b\[[0-9;]{0,8}m", fullmatch=True)
_KEPT = st.lists(st.one_of(st.text(_PRINTABLE, max_size=20), _SGR_SEQUENCE,
                           st.sampled_from(["\n", "\t", "\r"])), max_size=20)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_TEXT, _KEPT)
def test_stream_text_loses_what_hides_or_rewrites_and_keeps_text_and_colours(
        text: str, pieces: list[str]) -> None:
    shown = stream_text(text)
    shown.encode("utf-8")
    assert all(_shown_anywhere(c) or c in "\n\t\r\x1b" for c in shown), ascii(shown)
    assert "\x1b" not in SGR.sub("", shown)  # an escape only as a colour
    # Printable text, colours, newlines, tabs and carriage returns stay as they are.
    kept = "".join(pieces)
    assert stream_text(kept) == kept


@needs_landlock
def test_a_sessions_streams_lose_bidi_and_invisible_characters(manager: SandboxManager) -> None:
    seen: dict[str, list[str]] = {"stdout": [], "stderr": []}
    code = ("import sys\nprint('\\x1b[31mred\\x1b[0m pay\\u202eusd\\u202c \\u2066x\\u2069 '"
            "'a\\u200bb\\u2060c\\ufeffd\\u200e\\u200f\\u061c\\U000e0041 \\U0001f469\\u200d\\U0001f4bb')\n"
            "print('err\\u202e', file=sys.stderr)")
    with sandbox_session(manager) as s:
        result = s.run_cell(code, on_output=lambda name, text: seen[name].append(text))
    expected = "\x1b[31mred\x1b[0m payusd x abcd \U0001f469\u200d\U0001f4bb\n"
    assert result.stdout == "".join(seen["stdout"]) == expected, ascii(seen)
    assert result.stderr == "".join(seen["stderr"]) == "err\n"


# =============================================================================================
# Names in error reports
# =============================================================================================

@needs_landlock
def test_an_error_reports_names_cannot_add_lines(manager: SandboxManager) -> None:
    code = RAW + textwrap.dedent("""\
        frame({'type': 'done', 'cell': 3, 'status': 'error', 'values': {},
               'error': {'ename': 'Boom\\nPermissionError\\u2028Fake: line', 'evalue': 'v',
                         'frames': [{'cell': None, 'filename': 'f.py\\n----> 1 fake()',
                                     'lineno': 1, 'name': 'g\\r\\u202e', 'lines': []}]}})
        import time
        time.sleep(30)
    """)
    with sandbox_session(manager) as s:
        result = s.run_cell(code, cell=3, timeout=20)
    assert result.error is not None, result
    assert result.error["ename"] == "Boom \u21b5 PermissionError \u21b5 Fake: line"
    frame = result.error["traceback"][2]
    assert frame.count("\n") == 1 and "\u202e" not in frame, ascii(frame)  # head line only


# =============================================================================================
# Markdown: made HTML inside the sandbox, never on the trusted side
# =============================================================================================

@needs_landlock
def test_markdown_from_a_child_arrives_made_html_in_the_child(manager: SandboxManager) -> None:
    """The child's own frame carries the HTML (seen by wrapping its sender), and what
    arrives is that HTML, rewritten and isolated."""
    code = textwrap.dedent("""\
        from IPython.display import Markdown, display
        import sandbox_kernel_ext.runner.child.display as child_display
        sent = []
        _send = child_display._send
        child_display._send = lambda frame: (sent.append(frame), _send(frame))[-1]
        display(Markdown('**x** and <script>alert(1)</script>\\n\\n| a |\\n|---|\\n| 1 |'))
        child_display._send = _send
        frame_mimes = sorted(sent[0]['data'])
        Markdown('*y*')
    """)
    with sandbox_session(manager) as s:
        result = s.run_cell(code, outputs=["frame_mimes"])
    assert result.error is None and result.killed is None, result
    assert "text/html" in result.variables["frame_mimes"]
    assert "text/markdown" not in result.variables["frame_mimes"]
    shown, returned = (srcdoc(o["data"]["text/html"]).split("<body>", 1)[1]
                       for o in result.outputs)
    assert "<strong>x</strong>" in shown and "<table>" in shown and "<script" not in shown
    assert "<em>y</em>" in returned


PATHOLOGICAL = "*_~" * 160_000  # 480 KB that mistune takes ~10 s to convert


@needs_landlock
def test_markdown_without_html_shows_as_text_with_a_note(manager: SandboxManager) -> None:
    """A hostile child sends Markdown the library would have converted: the trusted side
    does not render it (its conversion has no time bound); it shows as text, saying why."""
    code = RAW + ("frame({'type': 'display', 'data': {'text/markdown': '*_~' * 160_000},"
                  "'metadata': {}, 'display_id': None, 'update': False})\n"
                  "frame({'type': 'display', 'data': {'text/markdown': '**b**\\u202e',"
                  "'text/plain': 'plain'}, 'metadata': {}, 'display_id': None, 'update': False})")
    with sandbox_session(manager) as s:
        result = s.run_cell(code, timeout=60)
    assert result.error is None and result.killed is None, result
    big, small = (o["data"] for o in result.outputs)
    assert "text/html" not in big and "text/html" not in small
    from sandbox_kernel_ext.runner.trusted.display import MARKDOWN_NOTE

    assert big["text/plain"] == PATHOLOGICAL + "\n" + MARKDOWN_NOTE
    assert small["text/plain"] == "plain\n" + MARKDOWN_NOTE


def test_the_trusted_side_never_loads_a_markdown_renderer() -> None:
    """Structural: the kernel's side handles a Markdown display frame without mistune ever
    being imported (a fresh interpreter, the trusted side's own channel)."""
    code = textwrap.dedent("""\
        import json, socket, sys
        from sandbox_kernel_ext.runner.trusted.control import CellEvents, ControlChannel
        parent, child = socket.socketpair()
        shown = []
        channel = ControlChannel(parent, None, on_usage=lambda t, c: None,
                                 on_malformed=print, events=CellEvents(on_display=shown.append))
        channel.feed(json.dumps({'type': 'display', 'data': {'text/markdown': '**m**'},
                                 'metadata': {}, 'display_id': None, 'update': False}
                                ).encode() + b'\\n')
        assert len(shown) == 1 and 'text/html' not in shown[0].data, shown
        loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'mistune')
        assert not loaded, loaded
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@needs_landlock
def test_html_too_complex_to_check_in_time_shows_as_text_with_a_note(
        manager: SandboxManager) -> None:
    """Python's HTML parser is quadratic on unclosed tags: past its budget, the display is
    its text and one line saying why (it used to vanish)."""
    code = ("display({'text/html': '<a ' * 30000, 'text/plain': 'the text form'}, raw=True)\n"
            "display({'text/html': '<a ' * 30000}, raw=True)")
    with sandbox_session(manager) as s:
        result = s.run_cell(code, timeout=60)
    assert result.error is None and result.killed is None, result
    with_text, without = (o["data"] for o in result.outputs)
    from sandbox_kernel_ext.runner.trusted.display import SLOW_HTML_NOTE

    assert with_text == {"text/plain": "the text form\n" + SLOW_HTML_NOTE}
    assert without == {"text/plain": "<a " * 30000 + "\n" + SLOW_HTML_NOTE}
