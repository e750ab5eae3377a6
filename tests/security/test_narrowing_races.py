"""A cell's narrowing is checked once and kept: a folder swapped for a symlink between the
check and the sandbox (by another sandbox of the same session, which may write there) must
not hand the link's target to the cell.

Once, `%%sandbox --allow-write w/sub` checked `w/sub` as a folder, then `create_sandbox`
resolved the path again, followed a link to a root-private folder, pinned and owner-mapped
it: the cell read a 0600 secret and created a root-owned file there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_kernel_ext import CapabilityDeclaration, SandboxError, SandboxManager
from sandbox_kernel_ext.policy.narrowing import Narrowing, narrow

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

SECRET = "PRIVATE-0600"


@pytest.fixture
def layout() -> Iterator[tuple[Path, Path]]:
    """`w` (the session's writable folder, world-writable) with `w/sub`, and a private
    folder beside it, 0700 with a 0600 secret, that the policy does not grant."""
    top = Path(tempfile.mkdtemp(prefix="sbx-narrow-"))
    os.chmod(top, 0o755)
    writable, private = top / "w", top / "private"
    (writable / "sub").mkdir(parents=True)
    private.mkdir(mode=0o700)
    (private / "secret.txt").write_text(SECRET)
    os.chmod(private / "secret.txt", 0o600)
    subprocess.run(["chmod", "-R", "a+rwX", str(writable)], check=True)
    try:
        yield writable, private
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _ceiling(writable: Path) -> CapabilityDeclaration:
    return CapabilityDeclaration.model_validate({"filesystem_config": {
        "mode": "read_write", "writable_paths": [str(writable)], "readable_paths": []}})


PROBE = """
import os
for name in os.listdir(SUB):
    try:
        print('read', name, open(os.path.join(SUB, name)).read())
    except OSError as exc:
        print('refused', name, type(exc).__name__)
try:
    open(os.path.join(SUB, 'planted.txt'), 'w').write('x')
except OSError as exc:
    print('no plant', type(exc).__name__)
"""


def _swap_to_link(sub: Path, private: Path) -> None:
    os.rmdir(sub)
    os.symlink(private, sub)


def test_a_swap_after_the_check_is_refused(layout) -> None:
    writable, private = layout
    sub = writable / "sub"
    cell = narrow(_ceiling(writable), Narrowing(allow_write=(str(sub),)))
    _swap_to_link(sub, private)
    with SandboxManager() as manager, pytest.raises(SandboxError, match="now resolves"):
        manager.create_sandbox(cell)
    assert sorted(os.listdir(private)) == ["secret.txt"]


def test_a_swap_racing_the_cells_gets_nothing(layout) -> None:
    """A thread flips `w/sub` between a folder and a link while cells are narrowed to it
    and run: every outcome is a refusal or the folder's own (empty) contents."""
    writable, private = layout
    sub = writable / "sub"
    ceiling = _ceiling(writable)
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            try:
                _swap_to_link(sub, private)
                os.unlink(sub)
                sub.mkdir()
                os.chmod(sub, 0o777)
            except OSError:
                continue

    flipper = threading.Thread(target=flip, daemon=True)
    seen: list[str] = []
    with SandboxManager() as manager:
        flipper.start()
        try:
            for _ in range(40):
                try:
                    cell = narrow(ceiling, Narrowing(allow_write=(str(sub),)))
                    sid = manager.create_sandbox(cell)
                    result = manager.run_python(sid, f"SUB = {str(sub)!r}\n" + PROBE)
                    seen.append(result.stdout + result.stderr)
                    manager.destroy(sid)
                except SandboxError as exc:
                    seen.append(f"refused: {exc}")
        finally:
            stop.set()
            flipper.join()
    assert not [out for out in seen if SECRET in out], seen
    assert sorted(os.listdir(private)) == ["secret.txt"], os.listdir(private)
