"""A notebook with sandboxed cells, saved in JupyterLab and reopened with a new kernel, trusted
and untrusted: the gauges' summary and the approval's record (who asked, what, the decision,
who decided, when) still show, never "Error displaying widget: model not found", and a
sandboxed DataFrame shows isolated when trusted and as its text when not (JupyterLab's
sanitiser removes the isolating frame), never a blank."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nbformat
from browser_waits import wait_for

from sandbox_kernel_ext.runner.trusted.display import UNTRUSTED_NOTE

SETUP = """\
%load_ext sandbox_kernel_ext
%config SandboxMagics.policy = {policy!r}
%config SandboxMagics.render_timeout = 60.0
"""
TABLE = """\
%%sandbox
import pandas as pd
from IPython.display import SVG, display
display(SVG('<svg xmlns="http://www.w3.org/2000/svg" width="40" height="20">'
            '<rect width="40" height="20" fill="teal"/></svg>'))
pd.DataFrame({"city": ["Oslo", "Lima"], "rain_mm": [763, 6], "note": ["$x^2$", "$$y$$"]})
"""
# TeX where the page's MathJax might look: an exception's name (in the gauges' record) and
# text inside a frame element. Typeset, the first would be a link in the kernel's own line.
TEX = r"""%%sandbox --no-raise-error
raise type(r"$\href{https://evil.example/login}{\text{Session expired: sign in}}$",
           (Exception,), {})()
"""
WRITE = """\
%%sandbox
with open({target!r}, "w") as f:
    f.write("kept\\n")
print("written")
"""
NOT_SHOWN = ("model not found", "Error displaying widget", "Loading widget")


def _saved(path: Path) -> dict[str, Any]:
    """The notebook as saved, or {} while it is being written (the server writes in place)."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _close_with_kernel(nb: Any) -> None:
    """Close the page and end its kernel, as a person who saved and left: a reopen starts a
    kernel that has none of the widgets' models."""
    nb.kernel_state()
    nb.page.close()
    nb.server.api(f"/api/sessions/{nb.session_id}", method="DELETE")


def _assert_nothing_typeset(nb: Any) -> None:
    """No TeX of the sandbox's became math (or a link) in the page. (The traceback's own
    text shows the URL as text, which JupyterLab links as it links any URL in output.)"""
    outputs = nb.page.locator(".jp-NotebookPanel .jp-OutputArea")
    assert outputs.locator("mjx-container").count() == 0
    assert outputs.locator(".skx-gauges a, .sandbox-output a").count() == 0


def _assert_records_show(nb: Any) -> None:
    text = nb.output(2).inner_text()
    assert "Approved once by the person at the notebook at " in text, text
    assert "wants to" not in text and "asked to write" in text, text
    assert "data/kept.txt" in text and "Sandbox finished" in text, text
    for index in (1, 2):
        shown = nb.output(index).inner_text()
        assert "Sandbox finished" in shown, shown
        assert not any(words in shown for words in NOT_SHOWN), shown


def test_a_saved_notebook_keeps_records_and_tables_trusted_and_untrusted(
    open_notebook: Any, lab_server: Any, roots: Path
) -> None:
    target = roots / "data" / "kept.txt"
    nb = open_notebook("saved.ipynb", [SETUP.format(policy=str(roots / "policy.yaml")), TABLE,
                                       WRITE.format(target=str(target)), TEX])
    for index in (0, 1):
        nb.run_cell(index)
        nb.wait_cell_done(index)
    nb.output(1).frame_locator("iframe.sandbox-output").get_by_text("Oslo").wait_for()
    nb.run_cell(2)
    nb.button(2, "Approve once").click()
    nb.wait_cell_done(2)
    nb.output(2).get_by_text("Approved once by the person at the notebook").wait_for()
    assert target.read_text() == "kept\n"
    # The records in place (the page's layout has moved for the last time) before a click.
    nb.output(2).locator(".skx-approval-record").wait_for()
    nb.output(2).locator('.skx-gauges[data-frozen="true"]').wait_for()
    nb.run_cell(3)
    nb.wait_cell_done(3)
    nb.output(3).get_by_text("Sandbox failed: $\\href").wait_for()
    _assert_nothing_typeset(nb)

    file = lab_server.root / "saved.ipynb"
    nb.cell(0).locator(".jp-InputArea-editor").click()
    nb.page.keyboard.press("Control+s")
    wait_for("the notebook to be saved with its outputs",
             lambda: "Approved once by the person" in json.dumps(_saved(file)))
    saved = _saved(file)
    shown = [output for cell in saved["cells"] for output in cell.get("outputs", [])]
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {})
                   for o in shown), "a widget's reference was saved instead of its record"
    _close_with_kernel(nb)

    # Reopened as saved (JupyterLab signed it: trusted): the table in its isolating frame.
    trusted = open_notebook("saved.ipynb")
    trusted.output(1).frame_locator("iframe.sandbox-output").get_by_text("Oslo").wait_for()
    assert UNTRUSTED_NOTE not in trusted.output(1).inner_text()
    _assert_records_show(trusted)
    trusted.output(3).get_by_text("Sandbox failed: $\\href").wait_for()
    _assert_nothing_typeset(trusted)
    _close_with_kernel(trusted)

    # The same outputs in a notebook nobody signed: untrusted, sanitised.
    copy = nbformat.read(file, 4)
    copy.metadata["copied"] = True  # another digest: the notary's record does not cover it
    nbformat.write(copy, lab_server.root / "copied.ipynb")
    untrusted = open_notebook("copied.ipynb")
    table = untrusted.output(1)
    table.get_by_text(UNTRUSTED_NOTE).wait_for()
    assert table.locator("iframe").count() == 0
    assert table.locator("pre", has_text="Oslo").count() == 1  # an element, not markup as text
    assert "Oslo" in table.inner_text() and "763" in table.inner_text()
    svg = table.get_by_role("img", name="SVG from a sandboxed cell")
    assert svg.count() == 1 and svg.evaluate("img => img.naturalWidth") == 40
    _assert_records_show(untrusted)
