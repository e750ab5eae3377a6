"""The approval widget in a real kernel, with this test as the frontend.

Each case runs a cell that asks, finds the widget in that cell's output over iopub,
acknowledges the render as the widget's JS does, and clicks with a comm_msg the way
@jupyter-widgets sends it, while the asking cell is still busy:
1. a background thread asks while the main thread is blocked (what `%%sandbox` does);
2. the main thread itself asks, in a plain synchronous toolset call;
3. an async cell asks through a worker thread while other coroutines keep running.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from conftest import DENIED_AT_ONCE, LIVENESS, KernelSession, Message, click_route, value

TOOLSET = """
from sandbox_kernel_ext import ApprovalBroker, FileSystemToolset, PathConfig, Sandbox
from sandbox_kernel_ext import SandboxConfig
from sandbox_kernel_ext.notebook.approval_widget import WidgetResponder, responder_for

def toolset(root, responder, timeout=120.0):
    config = SandboxConfig(paths={"data": PathConfig(root=root, mode="rw", write_approval=True)})
    return FileSystemToolset(Sandbox(config), broker=ApprovalBroker(responder, timeout=timeout))
"""

SETUP = TOOLSET + """
# An interactive frontend answers render acknowledgements at once; the long bound only
# keeps a slow CI machine from falling back to the headless decision.
responder = responder_for(get_ipython(), render_timeout=60.0)
assert isinstance(responder, WidgetResponder), responder
"""


@pytest.fixture(scope="module")
def approvals(kernel_session: KernelSession) -> KernelSession:
    kernel_session.run(SETUP)
    if click_route(kernel_session) == "frontend":  # ipykernel 7.1-7.3: as JupyterLab 4.4 does
        kernel_session.widget_subshell = kernel_session.create_subshell()
    return kernel_session


def denied_at_once_elsewhere(k: KernelSession, code: str) -> bool:
    """On a kernel where a click cannot reach a cell busy on another thread than the one
    asking (ipykernel 6.x and 7.0: `click_route` "pump" or "none"), run `code` and check
    it was denied at once, saying why; True then, and the caller's clicks do not apply."""
    if click_route(k) not in ("pump", "none"):
        return False
    msg_id = k.execute(textwrap.dedent(code))
    k.wait_idle(msg_id)
    error = k.error(msg_id)
    assert DENIED_AT_ONCE in k.text(msg_id) + (error["evalue"] if error else ""), k.text(msg_id)
    return True


@pytest.fixture
def k(approvals: KernelSession, kernel: KernelSession) -> KernelSession:
    return kernel


def ask(k: KernelSession, code: str, *, acknowledge: bool = True) -> tuple[str, str]:
    """Run `code` (which asks for approval); return its msg_id and the widget shown in it."""
    msg_id = k.execute(textwrap.dedent(code))
    root = k.wait_for_widget(msg_id)
    if acknowledge:
        k.acknowledge_render(root)
    return msg_id, root


def record_data(k: KernelSession, msg_id: str) -> dict[str, Any]:
    """The display that replaced the widget after the decision (what a saved notebook keeps):
    static HTML and text, no widget."""
    updates = [m for m in k.outputs(msg_id) if m["msg_type"] == "update_display_data"]
    assert updates, "the widget's display was not updated with its outcome"
    data = updates[-1]["content"]["data"]
    assert set(data) == {"text/plain", "text/html"}, data
    return data


def record_text(k: KernelSession, msg_id: str) -> str:
    return record_data(k, msg_id)["text/plain"]


def values(k: KernelSession, root: str, model_name: str) -> list[str]:
    return [k.states[m]["value"] for m in k.tree(root) if k.states[m]["_model_name"] == model_name]


def assert_recorded(k: KernelSession, root: str, outcome: str) -> None:
    for description in ("Approve", "Always", "Deny"):
        assert k.states[k.button(root, description)]["disabled"] is True
    statuses = values(k, root, "LabelModel")
    assert any(s.startswith(outcome) for s in statuses), statuses


def test_approve_once_in_a_synchronous_cell(k: KernelSession, tmp_path: Path) -> None:
    msg_id, root = ask(
        k,
        f"""
        tk = toolset({str(tmp_path)!r}, responder)
        print(tk.write("/data/sync.txt", "written while the main thread waited"))
        """,
    )
    countdown = [v for v in values(k, root, "LabelModel") if v.startswith("Waiting")]
    assert countdown and re.fullmatch(r"Waiting for your answer; denies in 1[0-2]\d s\.", countdown[0])
    k.click(root, "Approve")
    k.wait_idle(msg_id)

    assert k.error(msg_id) is None
    assert (tmp_path / "sync.txt").read_text() == "written while the main thread waited"
    assert "Created data/sync.txt" in k.text(msg_id, "stdout")
    assert_recorded(k, root, "Approved once by the person at the notebook at ")
    record = record_text(k, msg_id).splitlines()
    assert record[0] == ("Approval: the file toolset asks to write 'data/sync.txt' (36 bytes)")
    assert record[1] == f"  file on this machine: {tmp_path / 'sync.txt'}"
    assert record[-1].startswith("Approved once by the person at the notebook at ")
    saved = record_data(k, msg_id)["text/html"]
    assert "Approved once by the person at the notebook at " in saved
    # The record took the widget's place: every model the cell opened is closed (the
    # buttons, labels, the render acknowledgement, their layouts and styles).
    opened = {m["content"]["comm_id"] for m in k.messages if m["msg_type"] == "comm_open"
              and m["parent_header"].get("msg_id") == msg_id}
    closed = {m["content"]["comm_id"] for m in k.messages if m["msg_type"] == "comm_close"}
    assert root in opened and opened <= closed, opened - closed
    assert saved.count("<button type=\"button\" disabled") == 3
    assert "<b>Approved once</b> &middot; the file toolset asked to <b>write" in saved
    # The record says what was decided at its top, and only the chosen button keeps its colour.
    [header, location, *_] = values(k, root, "HTMLModel")
    assert "<b>Approved once</b> &middot; the file toolset asked to <b>write" in header
    assert f"<code>{tmp_path / 'sync.txt'}</code>" in location
    styles = {k.states[k.button(root, d)]["description"]: k.states[k.button(root, d)]["button_style"]
              for d in ("Approve", "Always", "Deny")}
    assert styles == {"Approve once": "success", "Always for this session": "", "Deny": ""}
    assert "skx-approval-chosen" in k.states[k.button(root, "Approve")]["_dom_classes"]


def test_an_interrupt_while_idle_after_an_approval_keeps_the_kernel(
    k: KernelSession, tmp_path: Path
) -> None:
    """Found in review: on ipykernel 6 the click read by the waiting cell went through the
    kernel's whole dispatch, whose hooks left the cell's SIGINT handler installed for idle
    time, so an interrupt between cells ended the kernel's process."""
    if click_route(k) != "pump":
        pytest.skip("only ipykernel 6's cell reading its own clicks goes near SIGINT")
    msg_id, root = ask(k, f"""
        tk = toolset({str(tmp_path)!r}, responder)
        tk.write("/data/before_the_interrupt.txt", "x")
        """)
    k.click(root, "Approve")
    k.wait_idle(msg_id)
    assert k.error(msg_id) is None
    k.manager.interrupt_kernel()  # idle now
    assert k.manager.is_alive()
    assert k.text(k.run("print('still here')")) == "still here\n"


def test_another_widgets_click_waits_for_the_cell_as_it_always_did(
    k: KernelSession, tmp_path: Path
) -> None:
    """Only the pending approval's own messages are read while the cell waits (ipykernel
    6): another widget's callback runs after the cell, as it does without an approval,
    not inside it with its output lost."""
    if click_route(k) == "frontend":  # JupyterLab 4.4 sends every widget's clicks there
        return
    shown = k.run("import ipywidgets\nother = ipywidgets.Button(description='Other')\n"
                  "other.on_click(lambda _b: print('other clicked'))\ndisplay(other)")
    [other] = k.displayed_models(shown)
    msg_id, root = ask(k, f"""
        tk = toolset({str(tmp_path)!r}, responder)
        tk.write("/data/with_another_widget.txt", "x")
        print("cell done")
        """)
    clicked = k.click(other, "Other")
    k.click(root, "Approve")
    k.wait_idle(clicked)
    assert k.error(msg_id) is None and "cell done" in k.text(msg_id)
    assert "other clicked" not in k.text(msg_id)
    assert k.status_index(msg_id, "idle") < k.status_index(clicked, "busy")


def test_deny_raises_a_permission_error_and_writes_nothing(
    k: KernelSession, tmp_path: Path
) -> None:
    msg_id, root = ask(
        k,
        f"""
        from sandbox_kernel_ext import ApprovalDeniedError
        assert issubclass(ApprovalDeniedError, PermissionError)
        tk = toolset({str(tmp_path)!r}, responder)
        tk.write("/data/denied.txt", "must not land")
        """,
    )
    k.click(root, "Deny")
    k.wait_idle(msg_id)

    error = k.error(msg_id)
    assert error is not None and error["ename"] == "ApprovalDeniedError"
    assert "refused in the notebook" in error["evalue"]
    assert not (tmp_path / "denied.txt").exists()
    assert_recorded(k, root, "Denied by the person at the notebook at ")


def test_always_from_a_background_thread_while_the_main_thread_blocks(
    k: KernelSession, tmp_path: Path
) -> None:
    """What a `%%sandbox` cell does: the runner's approval thread asks, the magic waits."""
    code = f"""
        import threading
        tk = toolset({str(tmp_path)!r}, responder)
        outcome = {{}}

        def agent():
            try:
                outcome["result"] = tk.write("/data/thread.txt", "from a thread")
            except Exception as exc:
                outcome["error"] = exc
            print("thread output after the decision")

        worker = threading.Thread(target=agent)
        worker.start()
        worker.join()  # the main thread is blocked for the whole approval
        if "error" in outcome:
            raise outcome["error"]
        """
    if denied_at_once_elsewhere(k, code):
        return
    msg_id, root = ask(k, code)
    k.click(root, "Always")
    k.wait_idle(msg_id)

    assert k.error(msg_id) is None
    assert (tmp_path / "thread.txt").read_text() == "from a thread"
    # The click was handled as a request of its own; the thread's later output must still
    # be addressed to the cell, not to the click.
    assert "thread output after the decision" in k.text(msg_id)
    assert_recorded(k, root, "Approved for this session by the person at the notebook at ")

    again = k.run('print(tk.write("/data/thread.txt", "again, no question"))')
    assert k.displayed_models(again) == []  # the session grant answered
    assert (tmp_path / "thread.txt").read_text() == "again, no question"


def test_a_thread_from_an_earlier_cell_asks_in_the_cell_that_waits(
    k: KernelSession, tmp_path: Path
) -> None:
    """A thread that lives across cells (an agent's worker, a pool's) asks while a later
    cell waits for it: what the asking shows belongs to that later cell. On ipykernel 6.x a
    thread's prints went to the cell that started it, so the note saying why nobody could
    click landed in an earlier cell (seen as a missing note under load)."""
    started = k.run(f"""
import queue, threading
jobs = queue.Queue()
def serve():
    while True:
        job, done = jobs.get()
        try:
            done.append(job())
        except Exception as exc:
            done.append(exc)
threading.Thread(target=serve, daemon=True).start()
tk_worker = toolset({str(tmp_path)!r}, responder)
""")
    route = click_route(k)  # asked before the cell below makes the kernel busy
    msg_id = k.execute(textwrap.dedent("""
        import time
        done = []
        jobs.put((lambda: tk_worker.write("/data/worker.txt", "from a worker"), done))
        while not done:
            time.sleep(0.05)
        print("refused:", isinstance(done[0], PermissionError))
        """))
    if route in ("pump", "none"):
        k.wait_idle(msg_id)
        assert DENIED_AT_ONCE in k.text(msg_id, "stderr"), k.outputs(msg_id)
    else:
        root = k.wait_for_widget(msg_id)
        k.acknowledge_render(root)
        k.click(root, "Deny")
        k.wait_idle(msg_id)
    assert "refused: True" in k.text(msg_id, "stdout")
    shown = ("stream", "display_data", "update_display_data")
    assert [m for m in k.outputs(started) if m["msg_type"] in shown] == []
    assert not (tmp_path / "worker.txt").exists()


def test_a_cell_queued_while_approval_is_pending_runs_after_it(
    k: KernelSession, tmp_path: Path
) -> None:
    msg_id, root = ask(
        k,
        f"""
        tk = toolset({str(tmp_path)!r}, responder)
        tk.write("/data/first.txt", "first")
        """,
    )
    queued = k.execute(f"print(open({str(tmp_path / 'first.txt')!r}).read(), 'then queued')")
    k.click(root, "Approve")
    k.wait_idle(queued)

    assert k.error(msg_id) is None and k.error(queued) is None
    assert k.text(queued) == "first then queued\n"
    assert k.status_index(msg_id, "idle") < k.status_index(queued, "busy")


def test_async_cell_keeps_the_event_loop_running_while_it_waits(
    k: KernelSession, tmp_path: Path
) -> None:
    code = f"""
        import asyncio
        tk = toolset({str(tmp_path)!r}, responder)

        async def ticker():
            for n in range(100_000):
                print("tick", n, flush=True)
                await asyncio.sleep(0.02)

        ticking = asyncio.create_task(ticker())
        try:
            print(await asyncio.to_thread(tk.write, "/data/async.txt", "from an async cell"))
        finally:
            ticking.cancel()
        """
    if denied_at_once_elsewhere(k, code):
        return
    msg_id, root = ask(k, code)
    shown = k.index(lambda m: m["msg_type"] == "display_data" and m in k.outputs(msg_id))

    def ticks_after_shown(_msg: Message | None) -> bool:
        later = k.messages[shown + 1 :]
        ticks = [m for m in later if m["msg_type"] == "stream" and "tick" in m["content"]["text"]]
        return len(ticks) >= 3

    # Nothing can decide before the click below, so these ticks ran while it was pending.
    k.wait_for(ticks_after_shown, "the ticker to run while the approval is pending")
    k.click(root, "Approve")
    k.wait_idle(msg_id)

    assert k.error(msg_id) is None
    assert (tmp_path / "async.txt").read_text() == "from an async cell"
    assert "Created data/async.txt" in k.text(msg_id, "stdout")


def test_pydantic_ai_agent_run_with_top_level_await(k: KernelSession, tmp_path: Path) -> None:
    """An agent run awaited in a cell; the adapter calls the toolset in a worker thread."""
    code = f"""
        from pydantic_ai import Agent
        from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
        from pydantic_ai.models.function import FunctionModel
        from sandbox_kernel_ext.files.pydantic_ai import as_pydantic_ai_toolset

        def model(messages, info):
            if len(messages) == 1:
                args = {{"path": "/data/agent.md", "content": "# notes"}}
                return ModelResponse(parts=[ToolCallPart("write_file", args, tool_call_id="w")])
            return ModelResponse(parts=[TextPart("done")])

        tk = toolset({str(tmp_path)!r}, responder)
        agent = Agent(FunctionModel(model), toolsets=[as_pydantic_ai_toolset(tk)])
        print("agent said", (await agent.run("write notes")).output)
        """
    if denied_at_once_elsewhere(k, code):
        return
    msg_id, root = ask(k, code)
    k.click(root, "Approve")
    k.wait_idle(msg_id)

    assert k.error(msg_id) is None
    assert (tmp_path / "agent.md").read_text() == "# notes"
    assert "agent said done" in k.text(msg_id, "stdout")


def test_request_text_is_escaped(k: KernelSession, tmp_path: Path) -> None:
    """Path and diff come from untrusted code: they must reach the page as text."""
    payload = "<img src=x onerror=alert(1)>"
    msg_id, root = ask(
        k,
        f"""
        tk = toolset({str(tmp_path)!r}, responder)
        tk.write("/data/x<b>.txt", {payload!r})
        """,
    )
    html_values = values(k, root, "HTMLModel")
    k.click(root, "Deny")
    k.wait_idle(msg_id)

    shown = "".join(html_values)
    assert "&lt;img src=x onerror=alert(1)&gt;" in shown and "<img" not in shown
    assert "data/x&lt;b&gt;.txt" in shown and "<b>.txt" not in shown
    record = record_data(k, msg_id)["text/html"]  # what the saved notebook keeps
    assert "&lt;img src=x onerror=alert(1)&gt;" in record and "<img" not in record
    assert "data/x&lt;b&gt;.txt" in record and "<b>.txt" not in record
    assert not (tmp_path / "x<b>.txt").exists()


def test_timeout_denies(k: KernelSession, tmp_path: Path) -> None:
    msg_id, root = ask(
        k,
        f"""
        tk = toolset({str(tmp_path)!r}, responder, timeout=1.0)
        tk.write("/data/late.txt", "nobody answers")
        """,
    )
    k.wait_idle(msg_id)  # no click

    error = k.error(msg_id)
    assert error is not None and error["ename"] == "ApprovalDeniedError"
    assert "nobody answered within 1 s" in error["evalue"]
    assert not (tmp_path / "late.txt").exists()
    assert_recorded(k, root, "Denied by timeout at ")


def test_interrupting_the_waiting_cell_stops_it(k: KernelSession, tmp_path: Path) -> None:
    msg_id, root = ask(
        k,
        f"""
        tk = toolset({str(tmp_path)!r}, responder)
        tk.write("/data/stopped.txt", "interrupted")
        """,
    )
    k.manager.interrupt_kernel()
    k.wait_idle(msg_id)

    error = k.error(msg_id)
    assert error is not None and error["ename"] == "KeyboardInterrupt"
    assert not (tmp_path / "stopped.txt").exists()
    assert_recorded(k, root, "Denied by interruption at ")


def test_no_clicks_possible_when_the_client_disallows_stdin(
    k: KernelSession, tmp_path: Path
) -> None:
    """nbclient and papermill send allow_stdin False: headless decision, reason printed."""
    msg_id = k.execute(
        f'toolset({str(tmp_path)!r}, responder).write("/data/batch.txt", "x")',
        allow_stdin=False,
    )
    k.wait_idle(msg_id)

    error = k.error(msg_id)
    assert error is not None and error["ename"] == "ApprovalDeniedError"
    assert "allow_stdin is false" in error["evalue"]
    printed = k.text(msg_id, "stderr")
    assert "headless decision (deny)" in printed and "allow_stdin is false" in printed
    assert not (tmp_path / "batch.txt").exists()
    assert record_text(k, msg_id).splitlines()[-1].startswith("Denied by headless policy at ")


def test_no_render_acknowledgement_means_the_headless_decision(
    k: KernelSession, tmp_path: Path
) -> None:
    """A frontend that never renders the widget (nobody looking): the configured headless
    decision, here allow_once, after render_timeout, with the reason printed."""
    msg_id, root = ask(
        k,
        f"""
        unseen = responder_for(get_ipython(), headless_decision="allow_once", render_timeout=0.5)
        print(toolset({str(tmp_path)!r}, unseen).write("/data/unseen.txt", "headless allowed"))
        unseen.close()
        """,
        acknowledge=False,
    )
    k.wait_idle(msg_id)

    assert k.error(msg_id) is None
    assert (tmp_path / "unseen.txt").read_text() == "headless allowed"
    printed = k.text(msg_id, "stderr")
    assert "headless decision (allow_once)" in printed
    assert "no frontend showed the approval widget within 0.5 s" in printed
    assert_recorded(k, root, "Approved once by headless policy at ")


def test_close_removes_the_kernels_subshell(k: KernelSession) -> None:
    if click_route(k) != "kernel":  # no routing: no subshell of the responder's, ever
        assert value(k, "responder._router.subshell_id") is None
        return

    def subshells() -> list[str]:
        msg = k.client.session.msg("list_subshell_request", {})
        k.client.control_channel.send(msg)
        while True:
            reply = k.client.control_channel.get_msg(timeout=LIVENESS)
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return reply["content"]["subshell_id"]

    k.run("print(responder._router.start())")  # the tests above started it already
    started = subshells()
    assert len(started) == 1
    k.run("responder.close()\nresponder = responder_for(get_ipython(), render_timeout=60.0)")
    assert subshells() == []


def refused_write(root: Path, responder_args: str = "") -> str:
    """Kernel-side code: ask through responder_for(...) and print how it went."""
    return TOOLSET + textwrap.dedent(
        f"""
        responder = responder_for(get_ipython(){responder_args})
        print(type(responder).__name__)
        try:
            toolset({str(root)!r}, responder).write("/data/t.txt", "x")
        except PermissionError as exc:
            print("refused:", exc)
        """
    )


def run_python(argv: list[str], tmp_path: Path) -> str:
    done = subprocess.run(
        [sys.executable, *argv],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=LIVENESS,
        env={"IPYTHONDIR": str(tmp_path / "ipython"), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_terminal_ipython_prompts_and_end_of_input_denies(tmp_path: Path) -> None:
    code = refused_write(tmp_path)
    stdout = run_python(["-m", "IPython", "--quick", "--no-banner", "-c", code], tmp_path)

    assert stdout.splitlines()[0] == "TerminalResponder"
    assert "[y]es / [a]lways for this session / [N]o" in stdout
    assert "refused: write of 'data/t.txt' was not approved: no answer at the terminal" in stdout
    assert not (tmp_path / "t.txt").exists()


def test_a_kernel_without_subshells_gets_the_headless_decision_and_the_reason(
    tmp_path: Path,
) -> None:
    """ipykernel's in-process kernel has no shell-channel thread, so clicks could never
    reach a busy cell: the responder must say so and answer headless, not wait."""
    code = refused_write(tmp_path, ", render_timeout=60.0")
    script = textwrap.dedent(
        f"""
        import json
        from ipykernel.inprocess.manager import InProcessKernelManager

        manager = InProcessKernelManager()
        manager.start_kernel()
        client = manager.client()
        client.start_channels()
        client.execute({code!r})  # runs to the end before returning
        streams = {{"stdout": "", "stderr": ""}}
        while client.iopub_channel.msg_ready():
            msg = client.get_iopub_msg()
            if msg["msg_type"] == "stream":
                streams[msg["content"]["name"]] += msg["content"]["text"]
        manager.shutdown_kernel()
        print(json.dumps(streams))
        """
    )
    streams = json.loads(run_python(["-c", script], tmp_path).splitlines()[-1])

    assert streams["stdout"].startswith("WidgetResponder\nrefused: write of 'data/t.txt' was not")
    assert "the headless decision (deny) answered write 'data/t.txt'" in streams["stderr"]
    assert "InProcessKernel has no shell channel thread" in streams["stderr"]
    assert not (tmp_path / "t.txt").exists()


def test_askers_are_named_in_words() -> None:
    from sandbox_kernel_ext.notebook.approval_widget import asker

    assert asker("toolset:sandbox:4dd167f4") == "the sandboxed cell (sandbox 4dd167f4)"
    assert asker("sandbox:4dd167f4") == "the sandboxed cell (sandbox 4dd167f4)"
    assert asker("toolset:filesystem") == "the file toolset"
    assert asker("toolset:notes") == "the file toolset 'notes'"
    assert asker("reviewer bot") == "reviewer bot"
