"""The anywidget views' own unit tests (`node --test js/`), run by the README's test command."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

JS_DIR = Path(__file__).resolve().parent.parent / "js"


def test_js_unit_tests_pass() -> None:
    node = shutil.which("node")
    assert node is not None, "node 20+ is needed for the js/ tests (apt-get install nodejs)"
    assert any(JS_DIR.glob("*.test.mjs")), f"no *.test.mjs in {JS_DIR}"
    result = subprocess.run(
        [node, "--test", "--test-reporter=tap", str(JS_DIR)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"node --test js/ failed:\n{result.stdout}\n{result.stderr}"
    # node exits 0 when it finds no test files at all: make sure tests ran, and all passed.
    counts = dict(re.findall(r"^# (tests|pass) (\d+)$", result.stdout, re.MULTILINE))
    assert int(counts.get("tests", 0)) > 0, f"node ran no tests:\n{result.stdout}"
    assert counts["pass"] == counts["tests"], result.stdout
