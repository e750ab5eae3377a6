"""After `%load_ext sandbox_kernel_ext`, every approval-gated call in the kernel asks through
the notebook's widget: toolsets built with filesystem-sandbox's own constructor (no broker
named), `SandboxManager` instances a user makes, and `session_toolset()` under the default
policy. Proved in a real kernel with this test as the frontend, as in test_approval_widget.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import LIVENESS, KernelSession, value

pytestmark = pytest.mark.usefixtures("extension_unloaded_at_the_end")

LIBRARY_TOOLSET = """
from sandbox_kernel_ext import FileSystemToolset, PathConfig, Sandbox, SandboxConfig
tk = FileSystemToolset(Sandbox(SandboxConfig(paths={{"data": PathConfig(root={root!r}, mode="rw")}})))
"""


@pytest.fixture
def k(kernel: KernelSession) -> KernelSession:
    """The extension loaded, with a render bound long enough for a slow machine (an
    interactive frontend acknowledges at once)."""
    kernel.run("%load_ext sandbox_kernel_ext\n%config SandboxMagics.render_timeout = 60.0")
    return kernel


def asked(k: KernelSession, code: str) -> tuple[str, str]:
    """Run `code`, which must ask; its msg_id and the approval widget it showed."""
    msg_id = k.execute(textwrap.dedent(code))
    root = k.wait_for_widget(msg_id)
    k.acknowledge_render(root)
    return msg_id, root


def test_a_toolset_built_with_the_library_constructor_asks_through_the_widget(
    k: KernelSession, tmp_path: Path
) -> None:
    k.run(LIBRARY_TOOLSET.format(root=str(tmp_path)))
    msg_id, root = asked(k, 'print(tk.write("data/a.txt", "approved in the notebook"))')
    k.click(root, "Approve")
    k.wait_idle(msg_id)
    assert k.error(msg_id) is None
    assert (tmp_path / "a.txt").read_text() == "approved in the notebook"
    assert "data/a.txt" in k.text(msg_id, "stdout")

    msg_id, root = asked(k, 'tk.write("data/b.txt", "refused")')
    k.click(root, "Deny")
    k.wait_idle(msg_id)
    error = k.error(msg_id)
    assert error is not None and error["ename"] == "ApprovalDeniedError"
    assert not (tmp_path / "b.txt").exists()


def test_a_toolset_given_its_own_broker_keeps_it(k: KernelSession, tmp_path: Path) -> None:
    k.run(textwrap.dedent(f"""
        from sandbox_kernel_ext import ApprovalBroker, CallbackResponder
        own = FileSystemToolset(
            Sandbox(SandboxConfig(paths={{"data": PathConfig(root={str(tmp_path)!r}, mode="rw")}})),
            broker=ApprovalBroker(CallbackResponder(lambda request: True, name="own")))
        own.write("data/own.txt", "no widget")
        """))
    assert (tmp_path / "own.txt").read_text() == "no widget"
    assert value(k, "own.broker.log[-1].decision.decided_by") == "own"


def test_unload_restores_the_previous_default(k: KernelSession, tmp_path: Path) -> None:
    k.run(LIBRARY_TOOLSET.format(root=str(tmp_path)))
    k.run("%unload_ext sandbox_kernel_ext")
    msg_id = k.execute('tk.write("data/after.txt", "x")')
    k.wait_idle(msg_id)
    error = k.error(msg_id)
    assert error is not None and error["ename"] == "ApprovalDeniedError"
    assert "set_default_responder" in error["evalue"]
    assert k.displayed_models(msg_id) == []
    assert not (tmp_path / "after.txt").exists()


def test_a_manager_the_user_makes_asks_through_the_widget(
    k: KernelSession, shared_dir: Path
) -> None:
    """A sandboxed process's gated write, from a manager nobody gave a broker."""
    k.run(textwrap.dedent(f"""
        from sandbox_kernel_ext import CapabilityParser, SandboxManager
        manager = SandboxManager()
        sandbox_id = manager.create_sandbox(CapabilityParser.from_string('''
        paths:
          data: {{root: {str(shared_dir)}, mode: rw, write_approval: true}}
        '''))
        """))
    try:
        msg_id, root = asked(k, """
            result = manager.run_python(sandbox_id, "open({path!r}, 'w').write('from the child')")
            print(result.exit_code, result.stderr)
            """.format(path=str(shared_dir / "child.txt")))
        k.click(root, "Approve")
        k.wait_idle(msg_id)
        assert k.error(msg_id) is None
        assert k.text(msg_id, "stdout").startswith("0 ")
        assert (shared_dir / "child.txt").read_text() == "from the child"
    finally:
        k.settle()
        k.run("manager.close()")


def test_session_toolset_under_the_default_policy_is_the_workspace(k: KernelSession) -> None:
    k.run("%config SandboxMagics.policy = ''")
    k.run(textwrap.dedent("""
        from sandbox_kernel_ext.notebook import session_toolset
        tools = session_toolset()
        tools.write("workspace/from_the_kernel.txt", "shared")
        """))
    assert value(k, "tools.sandbox.readable_roots") == ["workspace"]
    msg_id = k.run("%%sandbox --quiet\nprint(open('from_the_kernel.txt').read())")
    assert k.text(msg_id, "stdout") == "shared\n"
    k.run("%%sandbox --quiet\nopen('from_the_cell.txt', 'w').write('back')")
    assert value(k, "tools.read('workspace/from_the_cell.txt').content") == "back"


def test_terminal_ipython_asks_at_the_prompt(tmp_path: Path) -> None:
    """No kernel to host a widget: after %load_ext the terminal's prompt answers."""
    code = "\n".join([
        'get_ipython().run_line_magic("load_ext", "sandbox_kernel_ext")',
        LIBRARY_TOOLSET.format(root=str(tmp_path)),
        'print(tk.write("data/t.txt", "approved at the terminal"))',
    ])
    done = subprocess.run(
        [sys.executable, "-m", "IPython", "--quick", "--no-banner", "-c", code],
        input="y\n", capture_output=True, text=True, timeout=LIVENESS,
        env={"IPYTHONDIR": str(tmp_path / "ipython"), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert "[y]es / [a]lways for this session / [N]o" in done.stdout + done.stderr
    assert "Created data/t.txt" in done.stdout
    assert (tmp_path / "t.txt").read_text() == "approved at the terminal"
