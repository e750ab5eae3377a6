"""A real kernel driven through jupyter_client, with the test acting as the frontend.

`KernelSession` runs cells, keeps every iopub message in arrival order, mirrors widget
model state from comm_open/comm_msg, and sends what a widget frontend sends (clicks and
custom messages) as comm_msg on the shell channel. The kernel runs on this venv's Python
(`sys.executable -m ipykernel_launcher`), over TCP on loopback, with its own IPython and
Jupyter folders; it is shut down in the fixture's finally.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

Message = dict[str, Any]
LIVENESS = 60.0  # bound on every wait for the kernel; a healthy run needs far less

_KERNEL_NAME = "sandbox-kernel-ext-test"
# The kernel's interpreter: this venv's, or another environment's (another ipykernel and
# IPython, with this package installed), as `tests/test_kernel_versions.py` runs these tests.
KERNEL_PYTHON = os.environ.get("SANDBOX_TEST_KERNEL_PYTHON") or sys.executable


def _parent_id(msg: Message) -> str | None:
    return (msg.get("parent_header") or {}).get("msg_id")


def model_ref(model_id: str) -> str:
    return f"IPY_MODEL_{model_id}"


class KernelSession:
    """One kernel and the frontend-side record of what it said."""

    def __init__(self, manager: KernelManager) -> None:
        self.manager = manager
        self.client = manager.blocking_client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=LIVENESS)
        self.messages: list[Message] = []  # every iopub message, in arrival order
        self.states: dict[str, dict[str, Any]] = {}  # widget model id -> synced state
        self._idle: set[str] = set()
        self._executed: list[str] = []
        self._requests: set[str] = set()  # every execute_request sent (each gets a reply)
        self._replies: dict[str, Message] = {}  # shell replies read so far, by request
        # Where clicks go: None, the main shell; a subshell's id, as JupyterLab 4.4 sends
        # them on a kernel that handles comm messages there (ipykernel 7.1-7.3).
        self.widget_subshell: str | None = None

    def close(self) -> None:
        self.client.stop_channels()

    # ------------------------------------------------------------------ cells
    def execute(self, code: str, *, allow_stdin: bool = True) -> str:
        """Queue a cell (later cells still run if it fails) and return its msg_id."""
        msg_id = self.client.execute(code, allow_stdin=allow_stdin, stop_on_error=False)
        self._executed.append(msg_id)
        self._requests.add(msg_id)
        return msg_id

    def run(self, code: str, *, allow_stdin: bool = True) -> str:
        """Execute and wait until the cell is done; fail with its traceback if it raised."""
        msg_id = self.execute(code, allow_stdin=allow_stdin)
        self.wait_idle(msg_id)
        error = self.error(msg_id)
        assert error is None, "cell failed:\n" + "\n".join(error["traceback"])
        return msg_id

    def wait_idle(self, msg_id: str, timeout: float = LIVENESS) -> None:
        """Until the request is done: its idle status, and for a cell also its reply.

        A cell is done when its execute_reply has come too, as nbclient waits for it before
        it sends the next cell. Sending on idle alone loses requests on ipykernel 7.0-7.3:
        the kernel writes its reply to the shell socket from a thread, outside the stream that
        reads the socket, and a request landing during that write is never read
        (ipython/ipykernel#1554, fixed by #1529 in 7.4); back-to-back cells sent on idle hung
        there within about a hundred cells.
        """
        self.wait_for(lambda m: msg_id in self._idle, f"cell {msg_id} to finish", timeout)
        if msg_id in self._requests:
            self.reply(msg_id, timeout)

    def reply(self, msg_id: str, timeout: float = LIVENESS) -> Message:
        """The shell channel's reply to request `msg_id` (replies to others are kept)."""
        deadline = time.monotonic() + timeout
        while msg_id not in self._replies:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no reply to {msg_id} within {timeout:g} s")
            try:
                msg = self.client.get_shell_msg(timeout=min(0.5, left))
            except queue.Empty:
                continue
            parent = _parent_id(msg)
            if parent is not None:
                self._replies[parent] = msg
        return self._replies[msg_id]

    def outputs(self, msg_id: str) -> list[Message]:
        return [m for m in self.messages if _parent_id(m) == msg_id]

    def text(self, msg_id: str, name: str | None = None) -> str:
        """The cell's stream output (stdout and stderr, or only `name`)."""
        return "".join(
            m["content"]["text"]
            for m in self.outputs(msg_id)
            if m["msg_type"] == "stream" and name in (None, m["content"]["name"])
        )

    def error(self, msg_id: str) -> dict[str, Any] | None:
        errors = [m["content"] for m in self.outputs(msg_id) if m["msg_type"] == "error"]
        return errors[0] if errors else None

    def index(self, predicate: Callable[[Message], bool]) -> int:
        """Position of the first iopub message matching `predicate` (arrival order)."""
        for i, msg in enumerate(self.messages):
            if predicate(msg):
                return i
        raise AssertionError("no such iopub message")

    def status_index(self, msg_id: str, state: str) -> int:
        return self.index(
            lambda m: m["msg_type"] == "status"
            and _parent_id(m) == msg_id
            and m["content"]["execution_state"] == state
        )

    # ----------------------------------------------------------------- iopub
    def wait_for(
        self, condition: Callable[[Message | None], bool], what: str, timeout: float = LIVENESS
    ) -> None:
        """Read iopub until `condition` holds (it is also tried once before reading)."""
        if condition(None):
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.client.get_iopub_msg(timeout=min(0.5, deadline - time.monotonic()))
            except queue.Empty:
                continue
            self._record(msg)
            if condition(msg):
                return
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")

    def next_output(self, msg_id: str, timeout: float = LIVENESS) -> Message:
        """The first iopub message for `msg_id` that arrives from now on."""
        start = len(self.messages)
        found: list[Message] = []

        def arrived(msg: Message | None) -> bool:
            if msg is not None and _parent_id(msg) == msg_id and len(self.messages) > start:
                found.append(msg)
            return bool(found)

        self.wait_for(arrived, f"output of cell {msg_id}", timeout)
        return found[0]

    def _record(self, msg: Message) -> None:
        self.messages.append(msg)
        kind, content = msg["msg_type"], msg["content"]
        if kind == "status" and content["execution_state"] == "idle":
            parent = _parent_id(msg)
            if parent is not None:
                self._idle.add(parent)
        elif kind == "comm_open" and content.get("target_name") == "jupyter.widget":
            self.states[content["comm_id"]] = dict(content["data"]["state"])
        elif kind == "comm_msg" and content["comm_id"] in self.states:
            data = content["data"]
            if data.get("method") in ("update", "echo_update"):
                self.states[content["comm_id"]].update(data["state"])

    # --------------------------------------------------------------- widgets
    def displayed_models(self, msg_id: str) -> list[str]:
        """Model ids of widget views displayed in the cell's output (in order), also where a
        display's update put one in place of what it showed before."""
        return [
            m["content"]["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
            for m in self.outputs(msg_id)
            if m["msg_type"] in ("display_data", "update_display_data")
            and "application/vnd.jupyter.widget-view+json" in m["content"]["data"]
        ]

    def tree(self, model_id: str) -> Iterator[str]:
        """`model_id` and every model below it through `children`."""
        yield model_id
        for ref in self.states.get(model_id, {}).get("children", []):
            yield from self.tree(ref.removeprefix("IPY_MODEL_"))

    def find(self, root: str, model_name: str, **prefixes: str) -> str | None:
        for model_id in self.tree(root):
            state = self.states.get(model_id, {})
            if state.get("_model_name") == model_name and all(
                str(state.get(key, "")).startswith(value) for key, value in prefixes.items()
            ):
                return model_id
        return None

    def wait_for_widget(self, msg_id: str, button: str = "Approve", index: int = 0) -> str:
        """The root model of the `index`-th widget displayed in cell `msg_id` that holds a
        Button whose description starts with `button`."""
        found: list[str] = []

        def shown(_msg: Message | None) -> bool:
            found[:] = [
                root
                for root in self.displayed_models(msg_id)
                if self.find(root, "ButtonModel", description=button)
            ]
            return len(found) > index

        self.wait_for(shown, f"a widget with a {button!r} button in cell {msg_id}")
        return found[index]

    def button(self, root: str, description: str) -> str:
        model_id = self.find(root, "ButtonModel", description=description)
        assert model_id is not None, f"no button starting {description!r} under {root}"
        return model_id

    def send_comm_msg(self, comm_id: str, data: dict[str, Any],
                      subshell_id: str | None = None) -> str:
        """What a frontend sends for a widget: a comm_msg on the shell channel (addressed to
        a kernel subshell, as JupyterLab 4.4's commsOverSubshells does, with `subshell_id`).
        Returns its msg_id (the kernel reports busy/idle for it, so `wait_idle` works)."""
        msg = self.client.session.msg("comm_msg", {"comm_id": comm_id, "data": data})
        subshell_id = subshell_id or self.widget_subshell
        if subshell_id is not None:
            msg["header"]["subshell_id"] = subshell_id
        self.client.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    def create_subshell(self) -> str:
        """A kernel subshell (JEP 91, ipykernel 7), asked on the control channel as
        JupyterLab does; its id."""
        msg = self.client.session.msg("create_subshell_request", {})
        self.client.control_channel.send(msg)
        deadline = time.monotonic() + LIVENESS
        while time.monotonic() < deadline:
            reply = self.client.get_control_msg(timeout=LIVENESS)
            if _parent_id(reply) == msg["header"]["msg_id"]:
                assert reply["content"]["status"] == "ok", reply["content"]
                return reply["content"]["subshell_id"]
        raise AssertionError("no create_subshell_reply")

    def click(self, root: str, description: str, subshell_id: str | None = None) -> str:
        """ipywidgets 8's button click, as @jupyter-widgets/controls sends it."""
        return self.send_comm_msg(
            self.button(root, description), {"method": "custom", "content": {"event": "click"}},
            subshell_id)

    def acknowledge_render(self, root: str, subshell_id: str | None = None) -> str:
        """What the approval widget's anywidget view sends when it renders: anywidget's
        `model.send(content)` puts {"method": "custom", "content": content} on its comm."""
        ack = self.find(root, "AnyModel")
        assert ack is not None, f"no render-acknowledging anywidget under {root}"
        # The view is js/render_ack.js, whose node test shows it sends exactly this.
        view = Path(__file__).resolve().parents[2] / "js" / "render_ack.js"
        assert self.states[ack]["_esm"] == view.read_text()
        return self.send_comm_msg(ack, {"method": "custom", "content": {"event": "rendered"}},
                                  subshell_id)

    # ----------------------------------------------------------------- hygiene
    def settle(self) -> None:
        """Interrupt whatever a failed test left running, so the next test starts idle."""
        busy = [msg_id for msg_id in self._executed if msg_id not in self._idle]
        if busy:
            self.manager.interrupt_kernel()
            for msg_id in busy:
                self.wait_idle(msg_id)
        self._executed.clear()


@contextlib.contextmanager
def running_kernel() -> Iterator[KernelSession]:
    """A fresh kernel on `KERNEL_PYTHON`, shut down and cleaned up on exit."""
    home = Path(tempfile.mkdtemp(prefix="sbx-kernel-"))
    spec_dir = home / "kernels" / _KERNEL_NAME
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [KERNEL_PYTHON, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "sandbox_kernel_ext tests",
                "language": "python",
            }
        )
    )
    env = dict(os.environ, IPYTHONDIR=str(home / "ipython"), JUPYTER_RUNTIME_DIR=str(home))
    manager = KernelManager(
        kernel_name=_KERNEL_NAME,
        kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(home / "kernels")]),
        transport="tcp",
        ip="127.0.0.1",
        connection_file=str(home / "connection.json"),
    )
    session = None
    try:
        manager.start_kernel(env=env, cwd=str(home))
        session = KernelSession(manager)
        yield session
    finally:
        if session is not None:
            session.close()
        if manager.has_kernel:
            manager.shutdown_kernel(now=True)
        manager.cleanup_resources()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def kernel_session() -> Iterator[KernelSession]:
    """One kernel per test module (starting one costs about a second)."""
    with running_kernel() as session:
        yield session


@pytest.fixture
def kernel(kernel_session: KernelSession) -> Iterator[KernelSession]:
    """The module's kernel, left idle after each test even if the test failed mid-cell."""
    yield kernel_session
    kernel_session.settle()


def next_input_request(k: KernelSession) -> Message:
    """The next message on the client's stdin channel (an input_request)."""
    try:
        msg = k.client.get_stdin_msg(timeout=LIVENESS)
    except queue.Empty:
        raise AssertionError(f"no input_request within {LIVENESS:g} s") from None
    assert msg["msg_type"] == "input_request", msg
    return msg


def gated_policy(folder: Path) -> Path:
    """A policy file in `folder` that makes it the approval-gated root /notes of the path
    table, nothing else of the host's files readable or writable."""
    path = folder / "policy.yaml"
    path.write_text(textwrap.dedent(f"""
        filesystem_config: {{mode: read_only, readable_paths: []}}
        paths:
          notes: {{root: {folder}, mode: rw, write_approval: true}}
        """))
    return path


def click_route(k: KernelSession) -> str:
    """How a click reaches a busy cell on this kernel (`kernel_routing.click_delivery`):
    "kernel", "frontend", "pump" or "none"."""
    return value(k, "__import__('sandbox_kernel_ext.notebook.kernel_routing', fromlist=['_'])"
                    ".shell_click_delivery(get_ipython()).route")


DENIED_AT_ONCE = "clicks cannot reach this kernel while the cell is busy"


def value(k: KernelSession, expression: str) -> Any:
    """A kernel-side expression's value (JSON), computed in the kernel itself."""
    msg_id = k.run(f"import json as _json; print(_json.dumps({expression}))")
    return json.loads(k.text(msg_id, "stdout").strip().splitlines()[-1])


def error_line(k: KernelSession, msg_id: str) -> str:
    """`ename: evalue` of the cell's error; IPython's UsageError arrives as stderr text."""
    error = k.error(msg_id)
    if error is not None:
        return f"{error['ename']}: {error['evalue']}"
    usage = [line for line in k.text(msg_id, "stderr").splitlines()
             if line.startswith("UsageError")]
    assert usage, f"cell did not fail; output: {k.outputs(msg_id)!r}"
    return usage[0]


@pytest.fixture(scope="module")
def extension_unloaded_at_the_end(kernel_session: KernelSession) -> Iterator[None]:
    """The module's kernel is killed at its end: unload the extension first, so nothing it
    started is left."""
    yield
    kernel_session.settle()
    kernel_session.run("%unload_ext sandbox_kernel_ext")
