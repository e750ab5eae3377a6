"""The test command's groups (`scripts/run_groups.py`) run every test of the suite, once."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("run_groups", ROOT / "scripts" / "run_groups.py")
assert _spec is not None and _spec.loader is not None
run_groups = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_groups)


def test_the_groups_run_every_test_once(tmp_path: Path) -> None:
    """Each named group's paths hold tests, no test is in two of them, and the last group
    is the whole suite without them."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests",
                           "--collect-only", "-q", "-o", "addopts="], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    whole = [line for line in done.stdout.splitlines() if "::" in line]
    assert len(whole) > 1000, done.stdout[-3000:]
    grouped = [path for paths in run_groups.GROUPS.values() for path in paths]
    assert len(grouped) == len(set(grouped)), "a path is named twice"
    assert run_groups.REST not in run_groups.GROUPS
    for path in grouped:
        assert any(test.startswith(path.rstrip("/") + ("/" if "." not in path else "::"))
                   for test in whole), f"{path} holds no test"
    for path in grouped:
        inside = [other for other in grouped if other != path
                  and (other.startswith(path + "/") or path.startswith(other + "/"))]
        assert not inside, f"{path} and {inside} overlap"
    lines = run_groups.commands(tmp_path)
    assert set(lines) == {*run_groups.GROUPS, run_groups.REST, run_groups.ALONE}
    assert list(lines)[-1] == run_groups.ALONE and lines[run_groups.ALONE][len(run_groups.PYTEST):][:3] == [
        "tests", "-m", "alone"]
    for name, line in lines.items():
        assert name == run_groups.ALONE or line[-3:-1] == ["-m", "not alone"], line
    assert [a for a in lines[run_groups.REST] if a.startswith("--ignore=")] == [
        f"--ignore={path}" for path in grouped]
    assert len({a for line in lines.values() for a in line if a.startswith("--basetemp=")}) == len(
        lines)
