"""`%%sandbox` in a real JupyterLab and Chromium: the gauges move while the confined cell runs,
its approval widget appears in the cell, and a click on Approve (then on Deny) decides whether
the sandbox's write lands.

With SANDBOX_TEST_SCREENSHOT=FILE, the approve-then-deny test also saves a picture of the
waiting cell there (the README's screenshot is made this way).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

SETUP = """\
%load_ext sandbox_kernel_ext
%config SandboxMagics.policy = {policy!r}
%config SandboxMagics.render_timeout = 60.0
"""
# Memory climbs while the cell runs (so the gauges have something to show), then the cell
# writes into the approval-gated root and waits for the click.
APPROVED = """\
%%sandbox
import time
hold = []
for step in range(6):
    hold.append(bytearray(20 * 1024 * 1024))
    print("step", step, flush=True)
    time.sleep(0.4)
with open({target!r}, "w") as f:
    f.write("approved in the browser\\n")
print("written")
"""
DENIED = """\
%%sandbox
try:
    with open({target!r}, "w") as f:
        f.write("must not land\\n")
except PermissionError as exc:
    print("not written:", exc)
"""
# Every change of the memory and elapsed meters in cell 1's output.
WATCH = """(output) => {
  window.meterLog = [];
  const record = () => {
    for (const name of ["Memory", "Elapsed"]) {
      const meter = output.querySelector(`[role="meter"][aria-label="${name}"]`);
      if (meter) window.meterLog.push([name, Number(meter.getAttribute('aria-valuenow'))]);
    }
  };
  new MutationObserver(record).observe(output, {subtree: true, childList: true,
    attributes: true, attributeFilter: ['aria-valuenow']});
}"""


def test_sandboxed_cell_shows_gauges_and_waits_for_approve_then_deny(
    open_notebook: Any, roots: Path
) -> None:
    approved, denied = roots / "data" / "approved.txt", roots / "data" / "denied.txt"
    nb = open_notebook("sandbox.ipynb", [
        SETUP.format(policy=str(roots / "policy.yaml")),
        APPROVED.format(target=str(approved)),
        DENIED.format(target=str(denied)),
    ])
    nb.run_cell(0)
    nb.wait_cell_done(0)

    nb.run_cell(1)
    nb.output(1).get_by_role("meter", name="Memory", exact=True).wait_for()
    nb.output(1).element_handle().evaluate(WATCH)
    approve = nb.button(1, "Approve once")
    approve.wait_for()
    assert nb.is_running(1), "the cell must still be waiting when the widget shows"
    if screenshot := os.environ.get("SANDBOX_TEST_SCREENSHOT"):
        nb.cell(1).screenshot(path=screenshot)
    assert not approved.exists()
    memory = [value for name, value in nb.page.evaluate("window.meterLog") if name == "Memory"]
    assert len(set(memory)) >= 3 and memory == sorted(memory), memory  # it moved, upwards
    output = nb.output(1).inner_text()
    assert "step 5" in output and "data/approved.txt" in output  # live output, the request
    approve.click()
    nb.wait_cell_done(1)
    assert approved.read_text() == "approved in the browser\n"
    assert "written" in nb.output(1).inner_text()
    assert nb.button(1, "Approve once").is_disabled()  # the widget stays, as a record
    nb.output(1).get_by_text("Approved once by the person at the notebook").wait_for()
    nb.output(1).locator('.skx-gauges[data-frozen="true"]').wait_for()

    nb.run_cell(2)
    deny = nb.button(2, "Deny")
    deny.wait_for()
    deny.click()
    nb.wait_cell_done(2)
    assert "not written:" in nb.output(2).inner_text()
    assert "was not approved" in nb.output(2).inner_text()
    assert not denied.exists() and os.listdir(roots / "data") == ["approved.txt"]
