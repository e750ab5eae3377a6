"""No number of sandboxes, created and destroyed, breaks a manager by exhausting the
launcher's descriptors (issue 13, section 3).

The launcher used to prepare each sandbox's Landlock rules by opening every granted path (one
descriptor per rule), and broke at the fourth sandbox; now each child opens its own. The
attack: an agent loop that makes a sandbox per task, each with its own few hundred readable
files, under the open-file limit most desktop sessions give a Jupyter server (1,024), in a
fresh process so the limit is really that low.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import json, os, resource, sys
    from sandbox_kernel_ext import CapabilityDeclaration, FilesystemConfig, SandboxManager

    soft, hard = int(sys.argv[1]), int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    folder, tasks, per_task = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    exits, launcher_fds = [], []
    with SandboxManager() as manager:
        for task in range(tasks):
            files = [os.path.join(folder, f"t{task}", f"f{i}") for i in range(per_task)]
            policy = CapabilityDeclaration(filesystem_config=FilesystemConfig(
                mode="read_only", readable_paths=files))
            sid = manager.create_sandbox(policy)
            exits.append(manager.execute(sid, ["/bin/true"]).exit_code)
            # The launcher holds nothing per sandbox: its count stays flat.
            launcher_fds.append(len(os.listdir(f"/proc/{manager.launcher_pid}/fd")))
            exits.append(manager.run_python(sid, "pass").exit_code)
            manager.destroy(sid)
    print(json.dumps({"exits": exits, "launcher_fds": launcher_fds}))
""")


@pytest.fixture(scope="module")
def many_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("rules")
    for task in range(24):
        (folder / f"t{task}").mkdir()
        for i in range(300):
            (folder / f"t{task}" / f"f{i}").write_bytes(b"")
    return folder


@pytest.mark.parametrize(("soft", "hard"), [(1024, None), (1024, 1024)],
                         ids=["soft-1024", "soft-and-hard-1024"])
def test_an_agent_loop_of_sandboxes_never_runs_out_of_descriptors(
    many_files: Path, soft: int, hard: int | None
) -> None:
    import resource

    hard = hard or resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(soft), str(hard), str(many_files), "24", "300"],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["exits"] == [0] * 48
    # What the launcher holds stays bounded: it does not grow with the sandboxes made.
    assert max(report["launcher_fds"][4:]) <= max(report["launcher_fds"][:4]) + 8, report
