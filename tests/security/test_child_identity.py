"""The isolation report says who a child is, as the child itself finds it.

A differential check: the child reads its own uid map (a process outside any user namespace
has the whole range mapped to itself) and the report's `child_identity` must tell the same
story, in every profile the container harness runs (Docker's refuses user namespaces).
"""

from __future__ import annotations

import os
import sys

import pytest

from sandbox_kernel_ext import CapabilityDeclaration, SandboxManager, isolation_report
from sandbox_kernel_ext.runner.linux import landlock
from sandbox_kernel_ext.runner.trusted.isolation import default_child_uid

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or landlock.landlock_abi() < 1, reason="needs Landlock"
)

WHOAMI = "import os\nuid = os.getuid()\nuid_map = open('/proc/self/uid_map').read().split()"
WHOLE_RANGE = ["0", "0", "4294967295"]


def _child() -> tuple[int, list[str]]:
    with SandboxManager() as manager:
        sid = manager.create_sandbox(CapabilityDeclaration())
        result = manager.run_python(sid, WHOAMI, outputs=["uid", "uid_map"])
    assert result.exit_code == 0, result.stderr
    return result.variables["uid"], result.variables["uid_map"]


def test_the_report_says_whether_a_child_has_a_user_namespace() -> None:
    uid, uid_map = _child()
    identity = isolation_report()["child_identity"]
    if uid_map == WHOLE_RANGE:  # no user namespace: its uid is its host uid
        assert "no user namespace" in identity, identity
        host_uid = uid
    else:
        assert "no user namespace" not in identity and "user namespace" in identity, identity
        inside, outside, _ = (int(part) for part in uid_map[:3])
        assert inside <= uid, uid_map
        host_uid = outside + (uid - inside)
    if os.geteuid() == 0:
        assert host_uid == default_child_uid() and f"uid {host_uid}" in identity, identity
    else:
        assert host_uid == os.geteuid() and f"uid ({host_uid})" in identity, identity
