"""`%%sandbox` Python cells run in long-lived confined sessions: proved in a real kernel.

A kernel driven through jupyter_client, as in test_magics: cells go in on the shell channel,
answers come back on iopub (and input requests on stdin, which the test answers as a
frontend does). Each test names its own variables, so the sessions the module's kernel keeps
between tests do not make one test depend on another.
"""

from __future__ import annotations

import base64
import html
import json
import queue
import re
import tempfile
import textwrap
from typing import Any

import psutil
import pytest

from conftest import (
    LIVENESS,
    KernelSession,
    error_line,
    next_input_request,
    running_kernel,
    value,
)

EXTENSION = "sandbox_kernel_ext"
MAGICS = "get_ipython().magics_manager.registry['SandboxMagics']"
SESSIONS = f"{MAGICS}._resources.sessions"
LIVE_PIDS = (f"sorted(e.session.pid for e in {SESSIONS}.values() "
             "if e.session is not None and e.session.alive)")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


pytestmark = pytest.mark.usefixtures("extension_unloaded_at_the_end")


@pytest.fixture
def k(kernel: KernelSession) -> KernelSession:
    """The module's kernel with the extension loaded and its settings at their defaults."""
    kernel.run(f"%load_ext {EXTENSION}\n%config SandboxMagics.policy = ''")
    return kernel


# -- helpers ------------------------------------------------------------------------------------

def cell(k: KernelSession, code: str, *, allow_stdin: bool = True,
         timeout: float = LIVENESS) -> str:
    """Run a cell that may fail; its msg_id once it is done."""
    msg_id = k.execute(textwrap.dedent(code).lstrip("\n"), allow_stdin=allow_stdin)
    k.wait_idle(msg_id, timeout)
    return msg_id


def ok(k: KernelSession, code: str) -> str:
    """Run a cell that must succeed."""
    return k.run(textwrap.dedent(code).lstrip("\n"))




def of_type(k: KernelSession, msg_id: str, msg_type: str) -> list[dict[str, Any]]:
    return [m["content"] for m in k.outputs(msg_id) if m["msg_type"] == msg_type]


def result_data(k: KernelSession, msg_id: str) -> dict[str, Any]:
    """The data of the cell's one execute_result."""
    results = of_type(k, msg_id, "execute_result")
    assert len(results) == 1, f"expected one execute_result, got {k.outputs(msg_id)}"
    return results[0]["data"]


def displays(k: KernelSession, msg_id: str) -> list[dict[str, Any]]:
    return of_type(k, msg_id, "display_data")




def execution_count(k: KernelSession, msg_id: str) -> int:
    return int(of_type(k, msg_id, "execute_input")[0]["execution_count"])


def srcdoc(markup: str) -> str:
    """The document an isolated-output iframe holds."""
    found = re.search(r'srcdoc="([^"]*)"', markup)
    assert found, f"no srcdoc in {markup[:200]!r}"
    return html.unescape(found.group(1))


def assert_isolated(markup: str, inner: str) -> None:
    """`markup` is one sandboxed iframe (scripts, no same origin) holding `inner`."""
    assert markup.startswith("<iframe "), markup[:200]
    tag = markup[:markup.index(">") + 1]
    assert 'sandbox="allow-scripts"' in tag and "allow-same-origin" not in markup
    assert inner in srcdoc(markup)
    assert inner not in markup  # only inside srcdoc, escaped: never markup of the page


def live_pids(k: KernelSession) -> list[int]:
    pids = value(k, LIVE_PIDS)
    assert isinstance(pids, list)
    return pids


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone_soon(pids: list[int]) -> list[int]:
    """Those of `pids` still alive after waiting (liveness bound) for them to go: a
    namespace's teardown finishes a moment after the kill."""
    still = [pid for pid in pids if alive(pid)]
    for _ in range(int(LIVENESS / 0.1)):
        if not still:
            break
        psutil.wait_procs([psutil.Process(p) for p in still if psutil.pid_exists(p)],
                          timeout=0.1)
        still = [pid for pid in still if alive(pid)]
    return still


def session_rows(k: KernelSession) -> dict[str, list[list[str]]]:
    """`%sandbox list` as {session name: [[policy, uptime, cells, memory, state], ...]},
    read off its HTML table."""
    page = result_data(k, k.run("%sandbox list"))["text/html"]
    body = page.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    rows: dict[str, list[list[str]]] = {}
    for row in re.findall(r"<tr>(.*?)</tr>", body):
        cells = [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        rows.setdefault(cells[0], []).append(cells[1:])
    return rows


# -- 1. state persists ----------------------------------------------------------------------

def test_a_variable_set_in_one_cell_is_there_in_the_next(k: KernelSession) -> None:
    ok(k, "%%sandbox --quiet\nx = 41")
    msg_id = ok(k, "%%sandbox --quiet\nx + 1")
    assert result_data(k, msg_id)["text/plain"] == "42"
    # Out[n] of the sandboxed cell is the kernel's own execute_result for that cell.
    assert of_type(k, msg_id, "execute_result")[0]["execution_count"] == execution_count(
        k, msg_id)


def test_functions_and_imports_persist(k: KernelSession) -> None:
    ok(k, """
        %%sandbox --quiet
        import math as m
        def square(v):
            return v * v
        """)
    msg_id = ok(k, "%%sandbox --quiet\nsquare(m.sqrt(16))")
    assert result_data(k, msg_id)["text/plain"] == "16.0"


def test_an_open_file_stays_open_between_cells(k: KernelSession) -> None:
    workspace = value(k, f"{MAGICS}.workspace")
    ok(k, f"""
        %%sandbox --quiet
        notes = open({workspace + '/notes.txt'!r}, 'w+')
        notes.write('line one\\n')
        """)
    msg_id = ok(k, """
        %%sandbox --quiet
        notes.write('line two\\n')
        notes.seek(0)
        [notes.closed, notes.read()]
        """)
    assert result_data(k, msg_id)["text/plain"] == "[False, 'line one\\nline two\\n']"


# -- 2. rich output -------------------------------------------------------------------------

def test_html_arrives_as_an_isolated_iframe(k: KernelSession) -> None:
    table = "<table><tr><td>cell</td></tr></table>"
    msg_id = ok(k, f"""
        %%sandbox --quiet
        from IPython.display import HTML, display
        display(HTML({table!r}))
        """)
    shown = displays(k, msg_id)
    assert len(shown) == 1
    assert_isolated(shown[0]["data"]["text/html"], table)
    assert not of_type(k, msg_id, "execute_result")


def test_a_matplotlib_plot_arrives_as_a_png(k: KernelSession) -> None:
    msg_id = ok(k, "%%sandbox --quiet\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3])")
    images = [d["data"]["image/png"] for d in displays(k, msg_id) if "image/png" in d["data"]]
    assert len(images) == 1
    assert base64.b64decode(images[0], validate=True).startswith(PNG_MAGIC)


def test_a_dataframe_as_last_expression_is_the_cells_result(k: KernelSession) -> None:
    msg_id = ok(k, """
        %%sandbox --quiet
        import pandas as pd
        pd.DataFrame({'fruit': ['apple', 'pear'], 'count': [3, 5]})
        """)
    data = result_data(k, msg_id)
    assert "fruit" in data["text/plain"] and "pear" in data["text/plain"]
    assert_isolated(data["text/html"], "<td>pear</td>")
    assert not displays(k, msg_id)


def test_update_display_updates_the_same_namespaced_display(k: KernelSession) -> None:
    kernel_own = ok(k, "display('the kernel\\'s own', display_id='progress')")
    kernel_id = displays(k, kernel_own)[0]["transient"]["display_id"]
    assert kernel_id == "progress"
    msg_id = ok(k, """
        %%sandbox --quiet
        from IPython.display import display, update_display
        display('step 1', display_id='progress')
        update_display('step 2', display_id='progress')
        handle = display('other', display_id=True)
        handle.update('other, updated')
        """)
    shown = displays(k, msg_id)
    updates = of_type(k, msg_id, "update_display_data")
    assert [d["data"]["text/plain"] for d in shown] == ["'step 1'", "'other'"]
    assert [u["data"]["text/plain"] for u in updates] == ["'step 2'", "'other, updated'"]
    first, second = (d["transient"]["display_id"] for d in shown)
    assert [u["transient"]["display_id"] for u in updates] == [first, second]
    # The sandbox's 'progress' is its own, never the kernel's display of that name.
    assert first.startswith("sandbox-") and first != kernel_id and first != second


def test_clear_output_arrives_as_clear_output(k: KernelSession) -> None:
    msg_id = ok(k, """
        %%sandbox --quiet
        from IPython.display import clear_output
        print('soon gone')
        clear_output(wait=True)
        print('stays')
        """)
    kinds = [(m["msg_type"], m["content"]) for m in k.outputs(msg_id)
             if m["msg_type"] in ("stream", "clear_output")]
    clear = [i for i, (kind, _) in enumerate(kinds) if kind == "clear_output"]
    assert len(clear) == 1 and kinds[clear[0]][1] == {"wait": True}
    before = "".join(c["text"] for kind, c in kinds[:clear[0]] if kind == "stream")
    after = "".join(c["text"] for kind, c in kinds[clear[0] + 1:] if kind == "stream")
    assert before == "soon gone\n" and after == "stays\n"


def test_text_and_displays_keep_their_order(k: KernelSession) -> None:
    """The progress idiom: each clear_output comes before the text printed after it, and a
    display between two prints stays between them. Found by this test: the text after a
    display was passed on before it (the runner drained the pipes when the display came)."""
    msg_id = ok(k, """
        %%sandbox --quiet
        from IPython.display import clear_output, display
        for i in range(20):
            clear_output(wait=True)
            print(i)
        print('before')
        display('shown')
        print('after')
        """)
    sequence: list[str] = [""]
    for m in k.outputs(msg_id):
        if m["msg_type"] == "stream":
            sequence[-1] += m["content"]["text"]
        elif m["msg_type"] in ("clear_output", "display_data"):
            sequence += [m["msg_type"], ""]
    expected = [""]
    for i in range(20):
        expected += ["clear_output", f"{i}\n"]
    expected[-1] += "before\n"
    expected += ["display_data", "after\n"]
    assert sequence == expected


def test_a_bokeh_plot_shown_the_notebook_way_arrives_drawn_in_its_frame(k: KernelSession
                                                                        ) -> None:
    """`output_notebook()` and `show(plot)`, as Bokeh's notebook users write them: nothing
    for the loader, the plot in an isolated frame with BokehJS; a server app says why not."""
    msg_id = ok(k, """
        %%sandbox --quiet
        from bokeh.io import output_notebook, show
        from bokeh.plotting import figure
        output_notebook()
        p = figure(title="bokeh from a sandbox")
        p.scatter([1, 2, 3], [3, 1, 2])
        show(p, notebook_handle=True)
        """)
    [shown] = displays(k, msg_id)
    assert shown["data"]["text/plain"].startswith("figure(id=")
    frame = shown["data"]["text/html"]
    assert 'sandbox="allow-scripts"' in frame and "Bokeh.embed.embed_item" in frame
    assert "bokeh from a sandbox" in html.unescape(frame)
    msg_id = cell(k, "%%sandbox --quiet\nfrom bokeh.io import show\nshow(lambda doc: None)")
    error = k.error(msg_id)
    assert error is not None and "RuntimeError: a Bokeh server application cannot be shown " \
        "from a sandboxed cell" in error["evalue"], error


def test_a_widget_shows_its_text_and_why_it_is_not_live(k: KernelSession) -> None:
    from sandbox_kernel_ext.runner.trusted.display import WIDGET_NOTE

    msg_id = ok(k, "%%sandbox --quiet\nimport ipywidgets\nipywidgets.IntSlider(value=7)")
    data = result_data(k, msg_id)
    assert set(data) == {"text/plain"}
    assert "IntSlider(value=7)" in data["text/plain"]
    assert WIDGET_NOTE in data["text/plain"]
    assert "widgets need a connection to the notebook page" in WIDGET_NOTE
    assert not [m for m in k.outputs(msg_id) if m["msg_type"].startswith("comm_")]


# -- 3. input() -----------------------------------------------------------------------------

def test_input_asks_the_frontend_and_the_next_cell_sees_the_answer(k: KernelSession) -> None:
    msg_id = k.execute("%%sandbox --quiet\nname = input('who? ')")
    request = next_input_request(k)
    assert request["content"]["prompt"] == "[sandbox] who? " and request["content"]["password"] is False
    assert msg_id not in k._idle  # the cell waits for the answer
    k.client.input("Ada")
    k.wait_idle(msg_id)
    assert k.error(msg_id) is None
    assert result_data(k, ok(k, "%%sandbox --quiet\nname.upper()"))["text/plain"] == "'ADA'"


def test_getpass_asks_for_a_password(k: KernelSession) -> None:
    msg_id = k.execute("%%sandbox --quiet -o secret_length\nimport getpass\n"
                       "secret = getpass.getpass('Token: ')\nsecret_length = len(secret)")
    request = next_input_request(k)
    assert request["content"]["prompt"] == "[sandbox] Token: " and request["content"]["password"] is True
    k.client.input("hunter22")
    k.wait_idle(msg_id)
    assert k.error(msg_id) is None
    assert value(k, "secret_length") == 8
    assert "hunter22" not in json.dumps([m["content"] for m in k.outputs(msg_id)])


def test_input_without_stdin_raises_eoferror_saying_why(k: KernelSession) -> None:
    """nbclient and papermill execute with allow_stdin false: no one can answer."""
    msg_id = cell(k, "%%sandbox --quiet\ntry:\n    input('who? ')\n"
                     "except EOFError as exc:\n    reason = str(exc)\n    raise",
                  allow_stdin=False)
    line = error_line(k, msg_id)
    assert line.startswith("SandboxCellError: EOFError: ")
    assert "cannot be answered here: this frontend takes no input" in line
    with pytest.raises(queue.Empty):
        k.client.get_stdin_msg(timeout=0.5)  # nothing was asked of the client
    # The reason reached the cell itself (the EOFError was raised inside the sandbox).
    reason = result_data(k, ok(k, "%%sandbox --quiet\nreason"))["text/plain"]
    assert "this frontend takes no input" in reason


# -- 4. interrupt ---------------------------------------------------------------------------

def test_an_interrupt_stops_the_cell_and_keeps_the_session(k: KernelSession) -> None:
    ok(k, "%%sandbox --quiet\nsurvivor = 'still here'")
    before = live_pids(k)
    msg_id = k.execute("%%sandbox --quiet\nimport time\nprint('sleeping', flush=True)\n"
                       "time.sleep(600)")
    k.wait_for(lambda _m: "sleeping" in k.text(msg_id), "the cell to start sleeping")
    k.manager.interrupt_kernel()
    k.wait_idle(msg_id)
    error = k.error(msg_id)
    assert error is not None and error["evalue"] == "KeyboardInterrupt"
    assert "KeyboardInterrupt" in error["traceback"][-1]
    assert any("time.sleep(600)" in entry for entry in error["traceback"])
    msg_id = ok(k, "%%sandbox --quiet\nsurvivor")
    assert result_data(k, msg_id)["text/plain"] == "'still here'"
    assert live_pids(k) == before  # the same process: the same session


# -- 5. a breach ends the session -----------------------------------------------------------

def test_a_breach_ends_the_session_and_says_so(k: KernelSession) -> None:
    ok(k, "%%sandbox --quiet\nelsewhere = 'default session'")
    ok(k, "%%sandbox --quiet --memory 100\nbefore_breach = 1")
    msg_id = cell(k, """
        %%sandbox --quiet --memory 100 --timeout 30
        import time
        hog = b'x' * (150 * 1024 * 1024)
        time.sleep(60)
        """, timeout=LIVENESS * 3)
    line = error_line(k, msg_id)
    assert "session ended: Memory limit exceeded" in line
    assert "its variables are gone" in line
    rows = session_rows(k)["default"]
    narrowed = [row for row in rows if row[0].endswith("; --memory 100")]
    assert len(narrowed) == 1 and narrowed[0][4].startswith("ended (Memory limit exceeded")
    # The next cell of that narrowing starts a fresh session: what was set before is gone.
    again = cell(k, "%%sandbox --quiet --memory 100\nbefore_breach")
    assert error_line(k, again) == ("SandboxCellError: NameError: name 'before_breach' is "
                                    "not defined")
    # The default session, another process, lost nothing.
    msg_id = ok(k, "%%sandbox --quiet\nelsewhere")
    assert result_data(k, msg_id)["text/plain"] == "'default session'"


# -- 6. nothing left running ----------------------------------------------------------------

def test_unload_leaves_no_session_process(k: KernelSession) -> None:
    ok(k, "%%sandbox --quiet\nfirst = 1")
    ok(k, "%%sandbox --quiet --session unload_me\nsecond = 2")
    ok(k, "%%sandbox --quiet --memory 200\nthird = 3")
    pids = live_pids(k)
    assert len(pids) >= 3 and all(alive(pid) for pid in pids)
    try:
        k.run(f"%unload_ext {EXTENSION}")
        assert gone_soon(pids) == []
    finally:
        k.run(f"%load_ext {EXTENSION}")
    # A new magics, new sessions: the old variables went with their processes.
    msg_id = cell(k, "%%sandbox --quiet\nfirst")
    assert error_line(k, msg_id) == "SandboxCellError: NameError: name 'first' is not defined"


@pytest.mark.parametrize("now", [False, True], ids=["shut-down", "killed"])
def test_shutting_the_kernel_down_ends_its_sessions(now: bool) -> None:
    with running_kernel() as other:
        other.run(f"%load_ext {EXTENSION}")
        other.run("%%sandbox --quiet\nx = 1")
        other.run("%%sandbox --quiet --session second\ny = 2")
        pids = live_pids(other)
        assert len(pids) == 2 and all(alive(pid) for pid in pids)
        other.manager.shutdown_kernel(now=now)
        assert not other.manager.is_alive()
    assert gone_soon(pids) == []


# -- 7. a sandboxed cell sets no kernel variable nobody asked for ---------------------------

# Written by the sandboxed cell straight on its control socket (fd 3), past the session's own
# code: a `done` frame for this very cell, or a `variables` frame, carrying kernel names.
FORGE = """
import sys
from sandbox_kernel_ext.runner.child import inside
number = int(sys._getframe().f_code.co_filename.rsplit('-', 1)[1].rstrip('>'))
names = {'api_base': 'http://attacker.example', 'allowed_cmd': 'rm -rf /',
         'result_name': 'forged'}
if KIND == 'done':
    inside.send_frame({'type': 'done', 'cell': number, 'status': 'ok', 'values': names,
                       'error': None})
else:
    inside.send_frame({'type': 'variables', 'values': names})
result_name = 'from the cell'
"""


@pytest.mark.parametrize("kind", ["done", "variables"])
@pytest.mark.parametrize("options", ["", "-o result_name"])
def test_a_forged_frame_sets_no_kernel_variable(k: KernelSession, kind: str,
                                                options: str) -> None:
    k.run("api_base = 'kernel-value'\n"
          "for _name in ('allowed_cmd', 'result_name'):\n"
          "    globals().pop(_name, None)")
    msg_id = cell(k, f"%%sandbox --quiet {options}\nKIND = {kind!r}\n{FORGE}")
    assert value(k, "api_base") == "kernel-value"
    assert value(k, "'allowed_cmd' in globals()") is False
    broke = k.error(msg_id) is not None
    if broke:
        # A forged done frame read in the same read as the real one (a loaded machine): the
        # cell ended twice, and the session ends on it, its variables with it.
        assert kind == "done" and "a cell ended twice" in error_line(k, msg_id), \
            error_line(k, msg_id)
    if options and not broke:
        # The name -o asked for crosses (whichever frame carried it), and nothing else.
        assert value(k, "result_name") in ("from the cell", "forged")
    else:
        assert value(k, "'result_name' in globals()") is False
    # A forged done frame leaves the real one unread: the session breaks on it (in the next
    # cell, the first to read it) and says so; the cell after that runs in a new session.
    after = cell(k, "%%sandbox --quiet\nprint('next')")
    if k.error(after) is not None:
        assert kind == "done" and "the sandbox broke its control protocol" in error_line(k, after)
        assert "next" in k.text(k.run("%%sandbox --quiet\nprint('next')"))


def test_only_the_names_o_asks_for_cross(k: KernelSession) -> None:
    k.run("api_base = 'kernel-value'\nglobals().pop('allowed_cmd', None)")
    ok(k, """
        %%sandbox --quiet -o result_name
        api_base = 'sandbox-value'
        allowed_cmd = 'rm'
        result_name = {'answer': 42}
        """)
    assert value(k, "[api_base, 'allowed_cmd' in globals(), result_name]") == [
        "kernel-value", False, {"answer": 42}]


# -- 8. --fresh and --session ---------------------------------------------------------------

def test_fresh_runs_alone(k: KernelSession) -> None:
    ok(k, "%%sandbox --quiet\nin_default = 'default'")
    sessions = value(k, f"len({SESSIONS})")
    msg_id = cell(k, "%%sandbox --quiet --fresh\nin_default")
    assert error_line(k, msg_id) == ("SandboxCellError: NameError: name 'in_default' is not "
                                     "defined")
    ok(k, "%%sandbox --quiet --fresh\nin_fresh = 'fresh'")
    for options in ("", "--fresh"):
        msg_id = cell(k, f"%%sandbox --quiet {options}\nin_fresh")
        assert error_line(k, msg_id) == ("SandboxCellError: NameError: name 'in_fresh' is not "
                                         "defined")
    assert value(k, f"len({SESSIONS})") == sessions  # no session is kept for a --fresh cell


def test_a_named_session_is_independent_of_the_default(k: KernelSession) -> None:
    ok(k, "%%sandbox --quiet\nwhere = 'default'")
    msg_id = cell(k, "%%sandbox --quiet --session other\nwhere")
    assert error_line(k, msg_id) == "SandboxCellError: NameError: name 'where' is not defined"
    ok(k, "%%sandbox --quiet --session other\nwhere = 'other'")
    assert result_data(k, ok(k, "%%sandbox --quiet\nwhere"))["text/plain"] == "'default'"
    assert result_data(k, ok(k, "%%sandbox --quiet --session other\nwhere"))[
        "text/plain"] == "'other'"


# -- 9. %sandbox list and restart -----------------------------------------------------------

def test_list_shows_each_session(k: KernelSession) -> None:
    for _ in range(3):
        ok(k, "%%sandbox --quiet --session listed\nimport json")
    ok(k, "%%sandbox --quiet --session listed --memory 300\npass")
    rows = session_rows(k)["listed"]
    assert len(rows) == 2
    by_policy = {policy: rest for policy, *rest in rows}
    plain = next(p for p in by_policy if not p.endswith("--memory 300"))
    narrowed = next(p for p in by_policy if p.endswith("; --memory 300"))
    assert plain.startswith(f"built-in default (workspace {tempfile.gettempdir()}/sandbox-workspace-")
    assert narrowed == plain + "; --memory 300"
    for policy, cells_run in ((plain, "3"), (narrowed, "1")):
        uptime, cells, memory, state = by_policy[policy]
        assert re.fullmatch(r"\d+ s|\d+ min \d+ s", uptime)
        assert cells == cells_run and state == "idle"
        found = re.fullmatch(r"(\d+\.\d) MB", memory)
        assert found and float(found.group(1)) > 0
    text = result_data(k, k.run("%sandbox list"))["text/plain"]
    assert "listed" in text and "--memory 300" in text


def test_restart_ends_the_sessions_and_the_next_cell_starts_afresh(k: KernelSession) -> None:
    ok(k, "%%sandbox --quiet\nbefore_restart = 1")
    ok(k, "%%sandbox --quiet --session kept_apart\nbefore_restart = 2")
    pids = live_pids(k)
    text = k.text(k.run("%sandbox restart"))
    assert re.match(r"Ended \d+ session\(s\) \(.*default.*\)", text) and "kept_apart" in text
    assert gone_soon(pids) == []
    assert {row[-1] for rows in session_rows(k).values() for row in rows} <= {
        "restarted: starts with the next cell", "ended (restarted)", "ended"}
    for options in ("", "--session kept_apart"):
        msg_id = cell(k, f"%%sandbox --quiet {options}\nbefore_restart")
        assert error_line(k, msg_id) == ("SandboxCellError: NameError: name 'before_restart' "
                                         "is not defined")


def test_restart_by_name_ends_only_that_session(k: KernelSession) -> None:
    ok(k, "%%sandbox --quiet\nhere_to_stay = 1")
    ok(k, "%%sandbox --quiet --session doomed\nhere_to_stay = 2")
    assert "Ended 1 session(s) (doomed)" in k.text(k.run("%sandbox restart doomed"))
    assert result_data(k, ok(k, "%%sandbox --quiet\nhere_to_stay"))["text/plain"] == "1"
    msg_id = cell(k, "%%sandbox --quiet --session doomed\nhere_to_stay")
    assert "NameError" in error_line(k, msg_id)


def test_restart_of_an_unknown_session_names_the_known_ones(k: KernelSession) -> None:
    ok(k, "%%sandbox --quiet --session alpha\npass")
    known = sorted(session_rows(k))
    msg_id = cell(k, "%sandbox restart no_such_session")
    assert error_line(k, msg_id) == ("UsageError: %sandbox restart: no session called "
                                     f"'no_such_session' (sessions: {', '.join(known)})")
    assert "alpha" in known and "default" in known


# -- 10. tracebacks -------------------------------------------------------------------------

def test_a_traceback_points_at_the_cells_lines(k: KernelSession) -> None:
    """Each frame names the cell it is in by its In[n], with its line as the editor
    numbers it (the `%%sandbox` line is line 1) and its source, also for a function an
    earlier cell defined. Found by this test: every session cell said In[n+1] (IPython 9
    counts the next cell while one runs); found by a first-hour user: lines one off."""
    defined = ok(k, """
        %%sandbox --quiet
        def explode(why):
            raise ValueError(why)
        """)
    failed = cell(k, """
        %%sandbox --quiet
        total = 1
        explode('boom')
        total += 1
        """)
    error = k.error(failed)
    assert error is not None and error["evalue"] == "ValueError: boom"
    plain = [re.sub(r"\x1b\[[0-9;]*m", "", entry) for entry in error["traceback"]]
    heads = [entry.split("\n", 1)[0] for entry in plain]
    calling = [e for e, head in zip(plain, heads)
               if head == f"Cell In[{execution_count(k, failed)}], line 3"]
    raising = [e for e, head in zip(plain, heads)
               if head == f"Cell In[{execution_count(k, defined)}], line 3, in explode()"]
    assert len(calling) == 1 and len(raising) == 1, plain
    assert "----> 3 explode('boom')" in calling[0] and "2 total = 1" in calling[0]
    assert "----> 3     raise ValueError(why)" in raising[0]
    assert plain[-1] == "ValueError: boom"
    assert "magics.py" not in "".join(plain) and "session.py" not in "".join(plain)
