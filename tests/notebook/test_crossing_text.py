"""A sandbox's text as it reaches a real kernel's user: `-o` variables and `input()` prompts
(the rules are `runner/trusted/crossing_text.py`'s; tests/security/test_crossing_text.py has
the rest). A kernel driven through jupyter_client, as in test_sessions.
"""

from __future__ import annotations

import textwrap

import pytest
from conftest import KernelSession, next_input_request, value

EXTENSION = "sandbox_kernel_ext"

pytestmark = pytest.mark.usefixtures("extension_unloaded_at_the_end")


@pytest.fixture
def k(kernel: KernelSession) -> KernelSession:
    """The module's kernel with the extension loaded and its settings at their defaults."""
    kernel.run(f"%load_ext {EXTENSION}\n%config SandboxMagics.policy = ''")
    return kernel


def test_a_lone_surrogate_in_an_o_string_prints_in_the_kernel(k: KernelSession) -> None:
    """It used to reach user_ns as it was: print() then raised in ipykernel's flush
    (UnicodeEncodeError) and the cell's output was lost."""
    k.run(textwrap.dedent("""\
        %%sandbox --quiet -o lone, nested
        lone = 'a\\ud800b'
        nested = {'k\\udfff': ['\\udc80', 'line 1\\nline 2']}
    """))
    msg_id = k.execute("print('before')\nprint(lone, nested)\nprint('after')")
    k.wait_idle(msg_id)
    assert k.error(msg_id) is None, k.error(msg_id)
    assert k.text(msg_id, "stdout") == (
        "before\na\ufffdb {'k\ufffd': ['\ufffd', 'line 1\\nline 2']}\nafter\n")
    assert value(k, "nested['k\\ufffd'][1]") == "line 1\nline 2"  # data: not cleaned


def test_a_many_line_prompt_asks_one_line_after_the_mark(k: KernelSession) -> None:
    spoof = ("Output\n" * 30 + "\u202eYour Jupyter server session expired.\u2029"
             "Re-enter your password: ")
    msg_id = k.execute(f"%%sandbox --quiet --session prompts\nimport getpass\n"
                       f"got = getpass.getpass({spoof!r})")
    request = next_input_request(k)
    k.client.input("not-a-real-password")
    k.wait_idle(msg_id)
    assert k.error(msg_id) is None, k.error(msg_id)
    prompt = request["content"]["prompt"]
    assert prompt.startswith("[sandbox] Output \u21b5 Output") and len(prompt) <= 210, prompt
    assert prompt.splitlines() == [prompt] and "\u202e" not in prompt, ascii(prompt)
    assert prompt.count("[sandbox]") == 1  # the mark is the runner's, put once
