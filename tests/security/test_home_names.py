"""A sandbox sees its own home and learns no other sandbox's name.

Every sandbox of a kernel has a private home in one folder (`sandbox_homes_folder`). Under a
policy that reads "everywhere" a child that could list that folder would learn the other
sandboxes' names (their contents stay closed): it must find its own home only, as it finds
no credential store. Run as root here and as a pod's uid under the container profiles.
"""

from __future__ import annotations

import os
import sys

import pytest

from sandbox_kernel_ext import CapabilityDeclaration, FilesystemConfig, SandboxManager
from sandbox_kernel_ext.policy.credential_stores import sandbox_homes_folder
from sandbox_kernel_ext.runner.linux import landlock

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or landlock.landlock_abi() < 1, reason="needs Landlock"
)

LOOK = """
import os
def listing(path):
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        return type(exc).__name__
homes = listing(HOMES)
home = os.environ["HOME"]
own = listing(home)
"""


@pytest.mark.parametrize("child_uid", [None, 0], ids=["default-uid", "root-uid"])
@pytest.mark.parametrize("mode", ["read_only", "read_write"])
def test_a_child_lists_no_other_sandboxs_home(mode: str, child_uid: int | None, tmp_path) -> None:
    everywhere = CapabilityDeclaration(filesystem_config=FilesystemConfig(
        mode=mode, readable_paths=None,
        writable_paths=[str(tmp_path)] if mode == "read_write" else []))
    os.chmod(tmp_path, 0o777)
    if child_uid is not None and os.geteuid() != 0:
        pytest.skip("choosing the child's uid needs a root kernel")
    with SandboxManager(child_uid=child_uid) as manager:
        other = manager.create_sandbox(everywhere)
        manager.run_python(other, "open('mine.txt', 'w').write('x')")  # in its home
        sid = manager.create_sandbox(everywhere)
        homes = os.path.realpath(sandbox_homes_folder())
        result = manager.run_python(sid, LOOK.replace("HOMES", repr(homes)),
                                    outputs=["homes", "home", "own"])
        assert result.exit_code == 0, result.stderr
        other_home = os.path.basename(manager._get(other).home)
        found = result.variables
    assert isinstance(found["own"], list), found  # its own home works
    listed = found["homes"]
    assert not isinstance(listed, list) or other_home not in listed, found
