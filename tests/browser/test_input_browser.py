"""`input()` and `getpass()` in a sandboxed session cell, answered by a person in JupyterLab's
own input box (the kernel's stdin channel), with Chromium; the session keeps the answer."""

from __future__ import annotations

from typing import Any

CELLS = [
    "%load_ext sandbox_kernel_ext",
    "%%sandbox --quiet\nname = input('Your name? ')\nprint('hello,', name)",
    "%%sandbox --quiet\nimport getpass\nsecret = getpass.getpass('Token: ')\n"
    "print('token of', len(secret), 'characters')",
    "%%sandbox --quiet\nprint('still here:', name)",
]


def _answer(nb: Any, index: int, prompt: str, text: str) -> None:
    """Type `text` into the input box the cell shows, after checking its prompt."""
    box = nb.output(index).locator("input.jp-Stdin-input")
    box.wait_for()
    assert f"[sandbox] {prompt}" in nb.output(index).inner_text()
    assert nb.is_running(index), "the cell waits for the answer"
    box.fill(text)
    box.press("Enter")
    nb.wait_cell_done(index)


def test_a_person_answers_input_in_jupyterlab_and_the_session_keeps_it(open_notebook: Any) -> None:
    nb = open_notebook("input.ipynb", CELLS)
    nb.run_cell(0)
    nb.wait_cell_done(0)
    nb.run_cell(1)
    _answer(nb, 1, "Your name?", "Ada")
    assert "hello, Ada" in nb.output(1).inner_text()
    nb.run_cell(2)
    _answer(nb, 2, "Token:", "s3cr3t-value")
    shown = nb.output(2).inner_text()
    assert "token of 12 characters" in shown and "s3cr3t-value" not in shown
    nb.run_cell(3)
    nb.wait_cell_done(3)
    assert "still here: Ada" in nb.output(3).inner_text()
