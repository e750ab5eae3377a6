"""IPython's syntax in a `%%sandbox` cell, in a real kernel: each cell is run twice, without
and with `%%sandbox`, and both must give the same outcome (the sandboxed one having run in
the sandbox, where it is confined like the rest of the cell).

Found by a first-hour user: `%timeit`, `%time`, `!ls`, `files = !ls`, `sum?`,
`%matplotlib inline` and `%pip` in a sandboxed cell were a bare SyntaxError from `ast.py`.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from conftest import LIVENESS, KernelSession

EXTENSION = "sandbox_kernel_ext"

pytestmark = pytest.mark.usefixtures("extension_unloaded_at_the_end")


@pytest.fixture
def k(kernel: KernelSession) -> KernelSession:
    kernel.run(f"%load_ext {EXTENSION}\n%config SandboxMagics.policy = ''\n"
               "%config SandboxMagics.allow_policy_override = True")
    return kernel


def run(k: KernelSession, code: str, *, sandboxed: bool) -> dict[str, Any]:
    """The cell's stdout, its result's text and its error, run plainly or sandboxed."""
    code = textwrap.dedent(code).lstrip("\n")
    msg_id = k.execute(("%%sandbox --quiet\n" if sandboxed else "") + code)
    k.wait_idle(msg_id, LIVENESS)
    results = [msg["content"]["data"].get("text/plain") for msg in k.outputs(msg_id)
               if msg["msg_type"] == "execute_result"]
    error = k.error(msg_id)
    # the kernel's `!cmd` runs under a terminal, which ends lines with \r\n
    return {"stdout": k.text(msg_id, "stdout").replace("\r\n", "\n"),
            "stderr": k.text(msg_id, "stderr"),
            "result": results[-1] if results else None, "error": error}


def both(k: KernelSession, code: str) -> tuple[dict[str, Any], dict[str, Any]]:
    plain, sandboxed = run(k, code, sandboxed=False), run(k, code, sandboxed=True)
    assert sandboxed["error"] is None, sandboxed
    assert plain["error"] is None, plain
    return plain, sandboxed


TIMES = re.compile(r"CPU times: user .+, sys: .+, total: .+\nWall time: .+\n")


@pytest.mark.parametrize("code, result", [
    ("%time total = sum(range(10))\ntotal", "45"),
    ("%time sum(range(10))", "45"),
    ("%%time\nfirst = 2\nfirst * 3", "6"),
])
def test_time(k: KernelSession, code: str, result: str) -> None:
    for outcome in both(k, code):
        assert TIMES.search(outcome["stdout"]), outcome
        assert outcome["result"] == result, outcome


@pytest.mark.parametrize("code, shape", [
    ("%timeit -n 3 -r 2 sum(range(10))", "of 2 runs, 3 loops each)"),
    ("%%timeit -n 2 -r 1 data = list(range(50))\nsorted(data)", "of 1 run, 2 loops each)"),
])
def test_timeit(k: KernelSession, code: str, shape: str) -> None:
    for outcome in both(k, code):
        assert re.search(r"^\S+ .?s ± \S+ .?s per loop \(mean ± std\. dev\. " + re.escape(shape),
                         outcome["stdout"], re.M), outcome


def test_timeit_gives_its_result_with_o(k: KernelSession) -> None:
    for outcome in both(k, "measured = %timeit -o -q -n 2 -r 3 sum(range(5))\n"
                           "[measured.loops, measured.repeat, len(measured.all_runs), "
                           "measured.best <= measured.worst]"):
        assert outcome["result"] == "[2, 3, 3, True]" and outcome["stdout"] == "", outcome


def test_shell_commands_run_confined(k: KernelSession, shared_dir: Path) -> None:
    for outcome in both(k, "!echo hi; echo there\nlines = !echo a; echo b\nlines"):
        assert outcome["stdout"] == "hi\nthere\n" and outcome["result"] == "['a', 'b']", outcome
    secret = shared_dir / "secret.txt"
    secret.write_text("hidden")
    plain, sandboxed = run(k, f"!cat {secret}", sandboxed=False), run(k, f"!cat {secret}",
                                                                      sandboxed=True)
    assert plain["stdout"] == "hidden" and "hidden" not in sandboxed["stdout"]
    assert "Permission denied" in sandboxed["stdout"] + sandboxed["stderr"]


def test_expansion_of_names_and_expressions(k: KernelSession) -> None:
    for outcome in both(k, "word = 'hello'\n!echo {word.upper()} $word $$HOME-is-not-expanded"):
        assert outcome["stdout"].startswith("HELLO hello "), outcome


def test_environment_folder_and_history(k: KernelSession) -> None:
    for outcome in both(k, "%env SBX_SYNTAX=on\nimport os\nprint(os.environ['SBX_SYNTAX'])"):
        assert outcome["stdout"] == "env: SBX_SYNTAX=on\non\n", outcome
    for sandboxed in (False, True):
        run(k, "6 * 7", sandboxed=sandboxed)
        outcome = run(k, "_ + 1", sandboxed=sandboxed)
        assert outcome["result"] == "43", outcome
    outcome = run(k, "here = %pwd\nimport os\nhere == os.getcwd()", sandboxed=True)
    assert outcome["result"] == "True", outcome


def test_matplotlib_inline_is_accepted_and_figures_still_show(k: KernelSession) -> None:
    msg_id = k.execute("%%sandbox --quiet\n%matplotlib inline\nimport matplotlib.pyplot as plt\n"
                       "plt.plot([1, 2])")
    k.wait_idle(msg_id, LIVENESS)
    assert k.error(msg_id) is None
    assert any("image/png" in msg["content"].get("data", {}) for msg in k.outputs(msg_id)
               if msg["msg_type"] == "display_data")


def test_help_shows_the_docstring(k: KernelSession) -> None:
    outcome = run(k, "sum?", sandboxed=True)
    assert outcome["error"] is None and "Return the sum" in outcome["stdout"], outcome
    outcome = run(k, "def twice(x):\n    return 2 * x\n", sandboxed=True)
    outcome = run(k, "twice??", sandboxed=True)
    assert "return 2 * x" in outcome["stdout"], outcome


@pytest.mark.parametrize("code, words", [
    ("%load_ext autoreload", "%load_ext needs the kernel"),
    ("%lsmagic", "%lsmagic is not available in a sandboxed cell"),
    ("%matplotlib widget", "%matplotlib widget cannot run in a sandboxed cell"),
    ("%pip install requests", "needs the network, and this sandbox has none"),
    ("%%javascript\nalert(1)", "%%javascript needs the kernel"),
])
def test_what_cannot_run_says_so_in_one_line(k: KernelSession, code: str, words: str) -> None:
    outcome = run(k, code, sandboxed=True)
    error = outcome["error"]
    assert error is not None, outcome
    text = "\n".join(error["traceback"])
    assert words in error["evalue"] and "SyntaxError" not in text and "ast.py" not in text
    assert "UsageError" in error["traceback"][-1] and "Traceback" not in text, text


def test_a_real_syntax_error_points_at_the_cell_only(k: KernelSession) -> None:
    error = run(k, "x = (1,\n", sandboxed=True)["error"]
    assert error is not None and "SyntaxError" in error["evalue"] + error["ename"]
    text = "\n".join(error["traceback"])
    assert "ast.py" not in text and "session.py" not in text, text


def test_a_refused_open_shows_the_cells_frame_only(k: KernelSession, shared_dir: Path) -> None:
    secret = shared_dir / "other.txt"
    secret.write_text("x")
    error = run(k, f"def read():\n    return open({str(secret)!r}).read()\nread()",
                sandboxed=True)["error"]
    assert error is not None
    text = "\n".join(error["traceback"])
    assert "inside.py" not in text and "read()" in text, text
