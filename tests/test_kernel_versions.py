"""The notebook tests on the kernels users have: ipykernel 6.29 (Colab and many conda
environments), 7.0, one of 7.1-7.3 and (the rest of the suite) the newest, with IPython 8
and 9.

Each combination gets an environment of its own, made here from the system's Python: the
wheel built from this checkout and that ipykernel and IPython, nothing else pinned. The
kernel-facing tests then run against a kernel started from it (`SANDBOX_TEST_KERNEL_PYTHON`,
read by `tests/notebook/conftest.py`), with this venv as the frontend. What each version can
do with a click on a busy cell is in `tests/notebook/test_kernel_range.py`; the README's
matrix says the same.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from side_by_side import side_by_side

REPO = Path(__file__).resolve().parents[1]
# (ipykernel, IPython, how a click reaches a busy cell there, the tests run against it): the
# oldest supported 6.x (clicks read by
# the asking cell itself), 7.0 (whose threads had no parent: no click reaches a busy cell),
# one of 7.1-7.3 (clicks through the frontend's subshells), with both IPythons. What the
# kernel's version changes: loading, status, a sandboxed cell and its gauges, an approval
# in a busy cell, the widget protocol (on 7.0 every approval in a busy cell is denied at
# once, which `test_kernel_range.py` checks; the widget's clicking tests do not apply).
RANGE = ["tests/notebook/test_kernel_range.py", "tests/notebook/test_gauges.py",
         "tests/notebook/test_magics.py::test_gauges_move_while_running_and_freeze_after"]
CLICKS = ["tests/notebook/test_approval_widget.py"]
MATRIX = [("6.29.5", 8, "pump", RANGE + CLICKS), ("7.0.1", 9, "none", RANGE),
          ("7.3.0", 8, "frontend", RANGE + CLICKS)]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


@pytest.fixture(scope="module")
def environments() -> Iterator[dict[str, Future[Path]]]:
    """Every combination's environment, made side by side (installs only: the tests against
    them run one at a time), in a folder the sandboxes' unprivileged uid can read (the
    kernels' children run from it), with the wheel; their interpreters by ipykernel."""
    folder = Path(tempfile.mkdtemp(prefix="sbx-kernels-", dir="/tmp"))
    os.chmod(folder, 0o755)
    try:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                        "--no-build-isolation", "--wheel-dir", str(folder), str(REPO)],
                       check=True)
        with side_by_side({ipykernel: functools.partial(_environment, folder, ipykernel, ipython)
                           for ipykernel, ipython, _, _ in MATRIX}) as made:
            yield made
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _environment(folder: Path, ipykernel: str, ipython: int) -> Path:
    """A fresh venv on the system's Python (readable by the sandboxes' uid) with the wheel,
    `ipykernel==…` and the newest IPython of that major version; its interpreter."""
    [wheel] = folder.glob("sandbox_kernel_ext-*.whl")
    venv = folder / f"ipykernel-{ipykernel}"
    base = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                           "--disable-pip-version-check", f"{wheel}[pydantic-ai]",
                           f"ipykernel=={ipykernel}", f"ipython>={ipython},<{ipython + 1}"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return python


@pytest.mark.parametrize(("ipykernel", "ipython", "route", "tests"), MATRIX)
def test_the_kernel_facing_tests_pass_on(environments: dict[str, Future[Path]], ipykernel: str,
                                         ipython: int, route: str, tests: list[str]) -> None:
    python = environments[ipykernel].result()
    found = subprocess.run([str(python), "-c", "import ipykernel, IPython; "
                            "print(ipykernel.__version__, IPython.__version__)"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert found[0] == ipykernel and found[1].split(".")[0] == str(ipython), found
    env = {**os.environ, "SANDBOX_TEST_KERNEL_PYTHON": str(python),
           "SANDBOX_TEST_EXPECTED_ROUTE": route}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
    assert done.returncode == 0, f"ipykernel {ipykernel}, IPython {found[1]}:\n{tail}"
