"""Nothing of one sandbox's run is readable by another sandbox's process (issue 13, section 3).

Python cells are forks of the launcher and inherit its heap, freed memory included. The
attacks: one sandbox runs a command line (a `--shell` cell is one) holding a token, or is
granted a folder named after one; a cell of another sandbox, with no file access at all,
scans its own memory for it, and for the first sandbox's home name.
"""

from __future__ import annotations

import json
import os
import secrets

import pytest

from sandbox_kernel_ext import CapabilityDeclaration, FilesystemConfig, SandboxManager

PREFIX = "sbx-leak-probe-"

# Scans every private writable mapping of the cell's own process for PREFIX followed by hex
# digits, without ever holding the token itself: it knows only the prefix.
SCAN = f"""
import ctypes, json, re
prefix = {PREFIX!r}.encode()
found = set()
with open('/proc/self/maps') as maps:
    regions = [line.split() for line in maps]
for fields in regions:
    if not fields[1].startswith('rw'):
        continue
    if len(fields) > 5 and fields[5] not in ('[heap]',) and not fields[5].startswith('['):
        pass
    start, end = (int(x, 16) for x in fields[0].split('-'))
    if end - start > 512 * 1024 * 1024:
        continue
    try:
        data = ctypes.string_at(start, end - start)
    except Exception:
        continue
    for match in re.finditer(re.escape(prefix) + rb'([0-9a-f]{{32}})', data):
        found.add(match.group(1).decode())
print(json.dumps(sorted(found)))
"""


def test_the_scan_finds_a_token_where_there_is_one(manager: SandboxManager) -> None:
    """The control: a token in the cell's own memory is found, so a miss below means
    the token is not there, not that the scan is blind."""
    sid = manager.create_sandbox(CapabilityDeclaration())
    try:
        result = manager.run_python(sid, f"mine = {PREFIX!r} + 'ab' * 16\n" + SCAN)
    finally:
        manager.destroy(sid)
    assert json.loads(result.stdout) == ["ab" * 16]


@pytest.mark.parametrize("where", ["start", "end"])
def test_a_command_line_never_reaches_another_sandboxes_cell(
    manager: SandboxManager, where: str
) -> None:
    """A `--shell` cell is such a command line (`/bin/sh -c SCRIPT`). It travels to the
    child on a memfd, as the environment does, so the launcher never holds it."""
    token = secrets.token_hex(16)
    line = f"echo {PREFIX}{token} > /dev/null; "
    filler = "true; " * 700  # about 4 KB, as found
    script = line + filler if where == "start" else filler + line
    first = manager.create_sandbox(CapabilityDeclaration())
    try:
        assert manager.execute(first, ["/bin/sh", "-c", script]).exit_code == 0
    finally:
        manager.destroy(first)
    other = manager.create_sandbox(CapabilityDeclaration(
        filesystem_config=FilesystemConfig(mode="none")))
    try:
        found = [json.loads(manager.run_python(other, SCAN).stdout) for _ in range(2)]
    finally:
        manager.destroy(other)
    assert all(token not in seen for seen in found)


def test_the_launcher_is_never_sent_a_plan(manager: SandboxManager) -> None:
    """Structural: what the launcher receives for a run carries nothing of its plan (argv,
    environment, folders, home): the plan arrives on a memfd only the child reads."""
    from sandbox_kernel_ext.runner.trusted import launcher_client

    sent: list[dict] = []
    original = launcher_client.send_message

    def spy(sock, message, fds=()):  # type: ignore[no-untyped-def]
        sent.append(message)
        return original(sock, message, fds)

    launcher_client.send_message = spy
    try:
        sid = manager.create_sandbox(CapabilityDeclaration())
        token = secrets.token_hex(16)
        for _ in range(2):  # the second run takes the view prepared after the first
            assert manager.execute(sid, ["/bin/echo", token]).stdout == token + "\n"
        home = manager._get(sid).home
        manager.destroy(sid)
    finally:
        launcher_client.send_message = original
    spawns = [m for m in sent if m.get("op") == "spawn"]
    assert len(spawns) == 2 and all(set(m) == {"op", "id", "fds", "key"} and "plan" in m["fds"]
                                    for m in spawns)
    # A prepared view's key is an opaque token; what the view is made of is on a memfd too.
    prepares = [m for m in sent if m.get("op") == "prepare"]
    assert prepares and all(set(m) == {"op", "key", "fds"} and "plan" in m["fds"] for m in prepares)
    assert spawns[1]["key"] == prepares[0]["key"]
    assert token not in json.dumps(sent) and os.path.basename(home) not in json.dumps(sent)


def test_another_sandboxes_folders_and_home_never_reach_a_cell(manager: SandboxManager) -> None:
    """The rest of a plan: the folders a sandbox is granted, its home's name, its working
    folder. The launcher used to parse every plan (to prepare its Landlock rules), so a later
    cell found them in its inherited heap; now a plan reaches only its own child, on a memfd."""
    import os
    import shutil
    import tempfile

    token = secrets.token_hex(16)
    folder = tempfile.mkdtemp(prefix=f"{PREFIX}{token}", dir="/tmp")
    os.chmod(folder, 0o777)  # whatever uid the child has
    try:
        first = manager.create_sandbox(CapabilityDeclaration(filesystem_config=FilesystemConfig(
            mode="read_write", writable_paths=[folder], readable_paths=[folder])))
        first_home = os.path.basename(manager._get(first).home)
        assert manager.run_python(first, "print(1)", cwd=folder).exit_code == 0
        assert manager.execute(first, ["/bin/true"], cwd=folder).exit_code == 0
        manager.destroy(first)
        other = manager.create_sandbox(CapabilityDeclaration(
            filesystem_config=FilesystemConfig(mode="none")))
        try:
            folders = [json.loads(manager.run_python(other, SCAN).stdout) for _ in range(2)]
            homes = [json.loads(manager.run_python(other, SCAN_HOMES).stdout) for _ in range(2)]
        finally:
            manager.destroy(other)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert all(not any(token in seen for seen in run) for run in folders), folders
    assert all(first_home not in run for run in homes), (first_home, homes)


# The same scan for sandbox home names (`sandbox-<id>-<mkdtemp's suffix>`).
SCAN_HOMES = SCAN.replace(f"prefix = {PREFIX!r}.encode()", "prefix = b'sandbox-'").replace(
    r"([0-9a-f]{32})", r"([0-9a-f]{8}-[0-9a-z_]{8})")
