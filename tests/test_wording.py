"""Words a person reads: counts in the singular where they are one, and a person's stop
called an interruption, not a failure (found by a first-hour user: "(1 bytes)", "Sandbox
failed: KeyboardInterrupt", an input() wait labelled as an approval)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_kernel_ext import FileSystemToolset, PathConfig, Sandbox, SandboxConfig
from sandbox_kernel_ext.approval.request import ApprovalRequest
from sandbox_kernel_ext.approval.responders import TerminalResponder
from sandbox_kernel_ext.policy.models import SandboxResult
from sandbox_kernel_ext.policy.wording import byte_count


@pytest.mark.parametrize(("size", "words"), [(0, "0 bytes"), (1, "1 byte"), (2, "2 bytes"),
                                             (1024, "1,024 bytes")])
def test_byte_counts(size: int, words: str) -> None:
    assert byte_count(size) == words


def test_a_one_byte_write_says_one_byte(tmp_path: Path) -> None:
    config = SandboxConfig(paths={"d": PathConfig(root=str(tmp_path), mode="rw",
                                                   write_approval=False)})
    tools = FileSystemToolset(Sandbox(config))
    assert tools.write_file("/d/x.txt", "x").summary.endswith("(1 byte).")


def test_the_terminal_prompt_says_one_byte() -> None:
    request = ApprovalRequest(operation="write", path="d/x", access="write", size=1,
                              source="toolset:d")
    assert "'d/x' (1 byte)" in TerminalResponder._describe(request)


def test_a_person_s_stop_is_an_interruption_not_a_failure() -> None:
    from sandbox_kernel_ext.notebook.magics import _outcome

    stopped = SandboxResult(exit_code=1, duration_ms=1.0,
                            error={"ename": "KeyboardInterrupt", "evalue": "", "traceback": []})
    assert _outcome(stopped) == "interrupted"
    failed = SandboxResult(exit_code=1, duration_ms=1.0,
                           error={"ename": "ValueError", "evalue": "x", "traceback": []})
    assert _outcome(failed) == "failed: ValueError"


def test_a_wait_for_a_person_is_not_called_an_approval() -> None:
    from sandbox_kernel_ext.notebook.gauges import WAIT_WORDS

    assert "approval" not in WAIT_WORDS and WAIT_WORDS.startswith("waiting for your answer")
    js = (Path(__file__).resolve().parents[1] / "js" / "gauges.js").read_text()
    assert f'WAIT_WORDS = "{WAIT_WORDS}"' in js  # one wording in the page and in the text
