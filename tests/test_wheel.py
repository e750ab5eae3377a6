"""The wheel a user installs: built from this checkout, its metadata and files checked, and
the tour run from it as `python -m sandbox_kernel_ext.demo` (found by a first-hour user: it
crashed with FileNotFoundError for `site-packages/notebooks/tour.ipynb`)."""

from __future__ import annotations

import email
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import sandbox_kernel_ext

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--wheel-dir", str(out), str(REPO)], check=True)
    [built] = out.glob("sandbox_kernel_ext-*.whl")
    return built


def test_the_metadata_says_what_a_package_index_shows(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [metadata_name] = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(archive.read(metadata_name))
    assert metadata["Version"] == sandbox_kernel_ext.__version__  # one version, one place
    assert metadata["License-Expression"] == "MIT"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    classifiers = metadata.get_all("Classifier")
    assert "Operating System :: POSIX :: Linux" in classifiers and "Typing :: Typed" in classifiers
    assert "sandbox_kernel_ext/py.typed" in names
    for shipped in ("sandbox_kernel_ext/notebooks/tour.ipynb", "sandbox_kernel_ext/js/gauges.js",
                    "sandbox_kernel_ext/js/render_ack.js"):
        assert shipped in names, shipped
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "scripts/"))
                or "__pycache__" in n]


def test_the_tour_runs_from_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    """Installed into a folder of its own, ahead of this checkout on the path (the rest of
    the environment gives the dependencies)."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--target", str(target), str(wheel)], check=True)
    os.chmod(tmp_path, 0o755)  # the sandbox's unprivileged uid reads the package from here
    env = {**os.environ, "PYTHONPATH": str(target)}
    done = subprocess.run([sys.executable, "-m", "sandbox_kernel_ext.demo",
                           "--save", str(tmp_path / "tour.ipynb")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert str(target) in subprocess.run(
        [sys.executable, "-c", "import sandbox_kernel_ext; print(sandbox_kernel_ext.__file__)"],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert "Ran " in done.stdout and "jupyter lab" in done.stdout
