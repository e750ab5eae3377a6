"""The extension on the ipykernel a user has: 6.29 and every 7.x (issue of the first-hour
installs: 6.x denied every approval without warning, 7.0 put a traceback in the cell).

These run on this venv's kernel and, through `tests/test_kernel_versions.py`, on kernels of
other environments (`SANDBOX_TEST_KERNEL_PYTHON`). What a kernel can do with a click that
arrives while a cell is busy decides what each test expects (`click_delivery`):
- "kernel" (7.4 and later): the kernel routes the widget's messages to a subshell; a plain
  frontend's click reaches the cell;
- "frontend" (7.1 to 7.3): a click reaches the cell when the frontend sends it over a
  subshell, as JupyterLab 4.4's `commsOverSubshells` does; this test does the same;
- "pump" (6.x): only a cell asking on its own thread reads its clicks while it waits
  (`test_approval_widget.py` shows it); a `%%sandbox` cell's approval comes from the
  runner's thread, so it is denied at once, saying why, as under
- "none" (7.0): `%load_ext` and `%sandbox status` say so before anyone is asked, and an
  approval in a busy cell is denied at once, saying why.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import (DENIED_AT_ONCE, KernelSession, error_line, gated_policy, running_kernel,
                      value)

ROUTE = ("__import__('sandbox_kernel_ext.notebook.kernel_routing', fromlist=['_'])"
         ".shell_click_delivery(get_ipython())")


@pytest.fixture(scope="module")
def fresh() -> Iterator[tuple[KernelSession, str]]:
    """A kernel of its own (the extension not loaded yet), and what `%load_ext` printed."""
    with running_kernel() as session:
        loaded = session.run("%load_ext sandbox_kernel_ext")
        yield session, session.text(loaded)
        session.settle()
        session.run("%unload_ext sandbox_kernel_ext")


@pytest.fixture
def k(fresh: tuple[KernelSession, str]) -> Iterator[KernelSession]:
    yield fresh[0]
    fresh[0].settle()


def route(k: KernelSession) -> str:
    return value(k, f"{ROUTE}.route")


def test_the_route_is_the_one_this_version_has(k: KernelSession) -> None:
    """What each version can do, pinned from outside the code that judges it (the matrix
    of `tests/test_kernel_versions.py` names it; this venv's kernel is the newest)."""
    expected = os.environ.get("SANDBOX_TEST_EXPECTED_ROUTE", "kernel")
    assert route(k) == expected, value(k, f"{ROUTE}.detail")


def test_load_ext_says_ahead_when_a_click_may_not_arrive(fresh: tuple[KernelSession, str]
                                                         ) -> None:
    k, printed = fresh
    version = value(k, "__import__('ipykernel').__version__")
    if route(k) == "kernel":
        assert "approvals" not in printed, printed
    else:
        assert printed.startswith("sandbox_kernel_ext: approvals: ipykernel "
                                  + ".".join(version.split(".")[:2])), printed
        assert printed.count("\n") == 1  # one line


def test_status_names_how_clicks_arrive(k: KernelSession) -> None:
    msg_id = k.run("%sandbox status")
    [result] = [m for m in k.outputs(msg_id) if m["msg_type"] == "execute_result"]
    text = result["content"]["data"]["text/plain"]
    version = ".".join(value(k, "__import__('ipykernel').__version__").split(".")[:2])
    assert f"Approval clicks: ipykernel {version}" in text, text


def test_a_sandboxed_cell_runs_with_its_gauges(k: KernelSession) -> None:
    # Long enough for the live panel (CellGauges.SHOW_AFTER), whose updates come from the
    # monitor's thread: the part that differs between kernels.
    msg_id = k.run("%%sandbox\nimport time\ntime.sleep(1.5)\nprint('inside', 6 * 7)")
    assert k.error(msg_id) is None
    assert k.text(msg_id, "stdout") == "inside 42\n"
    assert "Traceback" not in k.text(msg_id)
    assert k.displayed_models(msg_id), "no gauges were shown"
    finals = [m["content"]["data"]["text/plain"] for m in k.outputs(msg_id)
              if m["msg_type"] == "update_display_data"]
    assert finals and "running" not in finals[-1].splitlines()[0].lower(), finals


def test_an_approval_in_a_busy_sandboxed_cell(k: KernelSession, shared_dir: Path) -> None:
    how = route(k)
    k.run(f"%config SandboxMagics.policy = {str(gated_policy(shared_dir))!r}\n"
          "%config SandboxMagics.render_timeout = 60.0")
    target = shared_dir / "from_cell.txt"
    try:
        msg_id = k.execute(f"%%sandbox --quiet\nwith open({str(target)!r}, 'w') as f:\n"
                           "    f.write('approved')\nprint('after the decision')")
        if how in ("none", "pump"):  # the runner's thread asks, not the cell's
            k.wait_idle(msg_id)
            assert not target.exists()
            # (Seen once under load: no output at all; the error says what the cell met.)
            assert DENIED_AT_ONCE in k.text(msg_id), (k.text(msg_id), error_line(k, msg_id),
                                                      k.outputs(msg_id))
            assert error_line(k, msg_id).startswith("SandboxCellError")
            return
        root = k.wait_for_widget(msg_id)
        assert msg_id not in k._idle and not target.exists()  # the child is waiting
        subshell = k.create_subshell() if how == "frontend" else None
        k.acknowledge_render(root, subshell)
        k.click(root, "Approve", subshell)
        k.wait_idle(msg_id)
    finally:
        k.run("%config SandboxMagics.render_timeout = 5.0\n%config SandboxMagics.policy = ''")
    assert k.error(msg_id) is None, k.error(msg_id)
    assert target.read_text() == "approved"
    assert "after the decision" in k.text(msg_id, "stdout")
