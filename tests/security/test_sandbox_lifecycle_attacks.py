"""Attacks on a sandbox's lifecycle: swapped grants, failed starts, forged frames, a close
while running, secrets left in the launcher."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from leftovers import own_sleep_marker

from sandbox_kernel_ext import (
    CapabilityDeclaration,
    FilesystemConfig,
    FilesystemMode,
    SandboxError,
    SandboxManager,
    SandboxStatus,
)
from sandbox_kernel_ext.runner.linux import landlock

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or landlock.landlock_abi() < 1, reason="needs Landlock"
)






def _writable(*paths: Path) -> CapabilityDeclaration:
    return CapabilityDeclaration(filesystem_config=FilesystemConfig(
        mode=FilesystemMode.read_write, writable_paths=[str(p) for p in paths],
        readable_paths=[str(paths[0])]))


def test_a_grant_swapped_for_a_symlink_grants_nothing_next_run(manager: SandboxManager, shared_dir: Path) -> None:
    """Run 1 replaced a nested writable grant by a symlink to another sandbox's homes; run 2's
    rules followed it. Rules now refuse any path that no longer names itself."""
    inner = shared_dir / "out"
    inner.mkdir()
    os.chmod(inner, 0o777)
    victim = manager.create_sandbox(CapabilityDeclaration())
    manager.run_python(victim, "open('secret.txt', 'w').write('victim')")
    victim_home = manager._get(victim).home
    attacker = manager.create_sandbox(_writable(shared_dir, inner))
    swap = manager.run_python(attacker, f"import os\nos.rmdir({str(inner)!r})\n"
                                        f"os.symlink({os.path.dirname(victim_home)!r}, {str(inner)!r})")
    if swap.exit_code != 0:
        # A granted folder is a mount point in the child's read-only view of the host, so the
        # cell cannot remove it; the same swap made from outside (by another process of the
        # user) must still grant nothing.
        assert "Device or resource busy" in swap.stderr, swap.stderr
        os.rmdir(inner)
        os.symlink(os.path.dirname(victim_home), inner)
    target = os.path.join(str(inner), os.path.basename(victim_home), "secret.txt")
    # refused: it no longer resolves as it did, and now leads into the sandboxes' homes
    with pytest.raises(SandboxError, match="resolves somewhere else|no sandbox reads"):
        manager.run_python(attacker, f"print(open({target!r}).read())\nopen({target!r}, 'w').write('owned')")
    # as the victim's own runs see it (its home may be a tmpfs only they attach)
    assert manager.run_python(victim, "print(open('secret.txt').read())").stdout == "victim\n"
    with pytest.raises(SandboxError, match="reaches into the sandboxes' homes|no sandbox reads"):
        manager.create_sandbox(_writable(shared_dir, inner))  # nor can a new sandbox be made so


def test_a_child_that_cannot_start_leaves_the_sandbox_usable_and_no_descriptor(manager: SandboxManager) -> None:
    sid = manager.create_sandbox(CapabilityDeclaration())
    manager.execute(sid, ["/bin/true"])
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(SandboxError, match="could not start.*cannot run /no/such/program"):
            manager.execute(sid, ["/no/such/program"])
        assert manager.status(sid) is SandboxStatus.stopped
    assert len(os.listdir("/proc/self/fd")) == before
    assert manager.execute(sid, ["/bin/true"]).exit_code == 0


def test_malformed_output_frames_end_the_run_with_a_clear_reason(manager: SandboxManager) -> None:
    sid = manager.create_sandbox(CapabilityDeclaration())
    for junk in ('b"[" * 100000', 'b"{" * 10', 'b"\\xff\\xfe"'):
        result = manager.run_python(sid, f"import os\nos.write(3, {junk})\nx = 1", outputs=["x"])
        assert result.exit_code == -1 and result.variables == {}
        assert "broke its control protocol (not JSON" in (result.killed or "")
    assert manager.status(sid) is SandboxStatus.stopped
    flood = manager.run_python(sid, "import os\nwhile True: os.write(3, b'[' * 65536)", timeout=20)
    assert flood.exit_code == -1 and "control frame is over" in (flood.killed or "")


def test_close_while_running_ends_child_and_launcher_at_once() -> None:
    """close() used to wait 5 s for a launcher that never saw end of file, then SIGKILL it,
    orphaning the running child."""
    manager = SandboxManager()
    sid = manager.create_sandbox(CapabilityDeclaration())
    marker = own_sleep_marker()
    worker = threading.Thread(target=lambda: manager.execute(sid, ["sleep", marker], timeout=120))
    worker.start()
    for _ in range(200):
        if any(p.info["cmdline"] == ["sleep", marker] for p in psutil.process_iter(["cmdline"])):
            break
        time.sleep(0.05)
    launcher = manager.launcher_pid
    manager._launcher.close()
    worker.join(timeout=30)
    assert not worker.is_alive()
    for _ in range(100):
        if not any(p.info["cmdline"] == ["sleep", marker] for p in psutil.process_iter(["cmdline"])):
            break
        time.sleep(0.05)
    assert not any(p.info["cmdline"] == ["sleep", marker] for p in psutil.process_iter(["cmdline"]))
    assert launcher is not None and not psutil.pid_exists(launcher)
    manager.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="reads another process's memory")
def test_the_launcher_never_holds_a_sandboxs_environment_values(manager: SandboxManager) -> None:
    """Every fork inherits the launcher's memory: a value that passed through it could be
    found by a later sandbox scanning its own memory."""
    sid = manager.create_sandbox(CapabilityDeclaration())
    for i in range(3):
        manager.run_python(sid, "pass", env={"API_KEY": f"sk-REVIEW-{'Q' * 20}{i}"})
    pid = manager.launcher_pid
    found: set[bytes] = set()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            fields = line.split()
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if "r" not in fields[1]:
                continue
            try:
                mem.seek(low)
                found.update(re.findall(rb"sk-REVIEW-Q+\d", mem.read(high - low)))
            except (OSError, ValueError, OverflowError):
                continue
    assert found == set()


def test_a_rule_whose_path_crosses_a_symlink_is_skipped(shared_dir: Path) -> None:
    """The last guard, for a swap between resolving a plan and opening its paths: a rule
    is added only for the path the kernel says the descriptor names."""
    (shared_dir / "real").mkdir()
    os.symlink(shared_dir / "real", shared_dir / "link")
    rules = landlock.LandlockRuleset().allow_read(shared_dir / "link").allow_read(shared_dir / "real")
    try:
        rules.build()
        assert rules.skipped == [str(shared_dir / "link")]
    finally:
        rules.close()
