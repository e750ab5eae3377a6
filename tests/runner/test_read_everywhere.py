""""Read everywhere" without enumerating the host (issue 13, section 1).

With a mount namespace the child hides each denied path under an empty mount, so the Landlock
rules are the top-level folders and /etc as one: a folder made later, anywhere, is readable by
the next run, and a large /etc costs no rules. Before, the rules were every sibling along the
way to each denied path, as the first sandbox saw them, and one per entry of /etc beside a
secret (~1,450 rules where /etc held 1,247 more files).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_kernel_ext import CapabilityDeclaration, FilesystemConfig, SandboxManager
from sandbox_kernel_ext.runner.trusted import plan

pytestmark = pytest.mark.skipif(
    not plan.hidden_by_mounts(), reason="no mount namespace here: the enumerated rules hold"
)

# Root's own uid under a root kernel, so that file permissions (of /root, of mkdtemp's folders)
# are not what decides here: the rules and the covers are.
AS_KERNEL = {"child_uid": 0} if os.geteuid() == 0 else {}
EVERYWHERE = CapabilityDeclaration(
    filesystem_config=FilesystemConfig(mode="read_only", readable_paths=None))


def _read(paths: list[str]) -> str:
    return f"""
import json
out = {{}}
for path in {paths!r}:
    try:
        out[path] = open(path).read()
    except OSError as exc:
        out[path] = type(exc).__name__
print(json.dumps(out))
"""


@pytest.fixture
def late_folders() -> Iterator[list[Path]]:
    made: list[Path] = []
    yield made
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_folder_made_later_is_readable_at_the_next_run(late_folders: list[Path]) -> None:
    with SandboxManager(**AS_KERNEL) as manager:
        sid = manager.create_sandbox(EVERYWHERE)
        assert manager.run_python(sid, "print('first')").exit_code == 0
        # beside a denied path (the old rules listed /root's entries as they were) and elsewhere
        for parent in ("/root", "/var/tmp", os.path.expanduser("~")):
            if os.path.isdir(parent):
                late_folders.append(Path(tempfile.mkdtemp(prefix="sbx-late-", dir=parent)))
        for folder in late_folders:
            (folder / "notes.txt").write_text("made later\n")
        files = [str(folder / "notes.txt") for folder in late_folders]
        again = manager.run_python(sid, _read(files))
        later = manager.run_python(manager.create_sandbox(EVERYWHERE), _read(files))
    for result in (again, later):
        assert result.exit_code == 0, result.stderr
        assert set(json.loads(result.stdout).values()) == {"made later\n"}, result.stdout


@pytest.fixture
def crowded_etc() -> Iterator[Path]:
    """/etc with 600 more entries, one of them a secret by its name (as /etc/firejail was)."""
    folder = Path("/etc") / f"sbx-crowd-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    try:
        for index in range(600):
            (folder / f"profile-{index}.conf").write_text("setting\n")
        (folder / "service.key").write_text("SECRET key\n")
        for path in folder.iterdir():
            path.chmod(0o644)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        plan.runtime_read_set.cache_clear()
        plan.etc_secrets.cache_clear()


def test_a_crowded_etc_costs_no_rules_and_its_secret_stays_hidden(crowded_etc: Path) -> None:
    def rules() -> list[str]:
        plan.runtime_read_set.cache_clear()
        plan.etc_secrets.cache_clear()
        return plan.build_plan(EVERYWHERE, kind="python", argv=[], home=tempfile.gettempdir()
                               ).read_paths

    crowded = rules()
    shutil.rmtree(crowded_etc)
    plain = rules()
    crowded_etc.mkdir()
    (crowded_etc / "profile-1.conf").write_text("setting\n")
    (crowded_etc / "service.key").write_text("SECRET key\n")
    (crowded_etc / "service.key").chmod(0o644)
    plan.runtime_read_set.cache_clear()
    plan.etc_secrets.cache_clear()
    assert len(crowded) == len(plain), (len(crowded), len(plain))
    assert not any(path.startswith(str(crowded_etc)) for path in crowded)
    with SandboxManager(**AS_KERNEL) as manager:
        result = manager.run_python(manager.create_sandbox(EVERYWHERE), _read(
            [str(crowded_etc / "profile-1.conf"), str(crowded_etc / "service.key")]))
    assert result.exit_code == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen[str(crowded_etc / "profile-1.conf")] == "setting\n"
    assert seen[str(crowded_etc / "service.key")] == ""  # /dev/null over it

