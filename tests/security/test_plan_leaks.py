"""Nothing of one sandbox's run is readable by another sandbox's process (issue 13, section 3).

Python cells are forks of the launcher and inherit its heap, freed memory included. The
attack: one sandbox runs a command line (a `--shell` cell is one) holding a token; a cell of
another sandbox, with no file access at all, scans its own memory for it.
"""

from __future__ import annotations

import json
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


def test_the_launcher_is_never_sent_a_command_line(manager: SandboxManager) -> None:
    """Structural: what the launcher receives for a run carries no argv and no environment
    values (they arrive on memfds only the child reads)."""
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
        assert manager.execute(sid, ["/bin/echo", token]).stdout == token + "\n"
        manager.destroy(sid)
    finally:
        launcher_client.send_message = original
    spawns = [m for m in sent if m.get("op") == "spawn"]
    assert spawns and all(m["plan"]["argv"] == [] and m["plan"]["env"] == {} for m in spawns)
    assert token not in json.dumps(sent)
