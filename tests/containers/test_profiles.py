"""The security suite and the tour inside a pod's container, once per seccomp profile.

`enter.py` builds the conditions a container runtime gives a Jupyter pod (namespaces, a
read-only host, a fresh /proc with the runtime's masked paths, uid 1000 with no capability,
`no_new_privs`, then Docker's or Podman's real seccomp profile, or none) and runs a command
there. Each test below runs a whole suite that way and fails with its summary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTER = ROOT / "tests" / "containers" / "enter.py"
PROFILES = ["docker", "podman", "unconfined"]

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only"),
    pytest.mark.skipif(os.geteuid() != 0,
                       reason="the container's conditions are built as root, then dropped"),
]


def _in_container(profile: str, *command: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """`command` under the conditions of a pod whose runtime uses `profile`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout, not another install
    return subprocess.run(
        ["/usr/bin/python3", str(ENTER), "--profile", profile, "--keep", str(ROOT), "--",
         sys.executable, *command],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _tail(done: subprocess.CompletedProcess, lines: int = 60) -> str:
    """The end of what the suite printed, after the names of what failed (which a long list
    of skips at the end would otherwise push out of view)."""
    printed = (done.stdout + done.stderr).splitlines()
    failed = [line for line in printed if line.startswith(("FAILED ", "ERROR "))]
    return "\n".join([*failed, "...", *printed[-lines:]])


@pytest.mark.parametrize("profile", PROFILES)
def test_the_report_names_what_the_pod_takes_away(profile: str) -> None:
    """Each layer as established in that profile: Docker's refuses user namespaces; every
    profile's masked /proc paths refuse a fresh /proc; the report says so, and strict mode
    refuses to run."""
    done = _in_container(profile, "-c", (
        "import json, warnings; warnings.simplefilter('ignore')\n"
        "from sandbox_kernel_ext import isolation_report, SandboxManager, "
        "CapabilityDeclaration, SandboxError\n"
        "r = isolation_report()\n"
        "try:\n"
        "    SandboxManager(strict=True).create_sandbox(CapabilityDeclaration())\n"
        "    strict = 'ran'\n"
        "except SandboxError as exc:\n"
        "    strict = str(exc)\n"
        "print(json.dumps({'layers': r['layers'], 'missing': r['missing'], 'strict': strict, "
        "'egress': r['egress']}))\n"))
    assert done.returncode == 0, _tail(done)
    report = json.loads(done.stdout.splitlines()[-1])
    layers = report["layers"]
    assert layers["user_namespace"] is (profile != "docker")
    assert layers["pid_namespace"] is (profile != "docker")
    assert layers["private_proc"] is False
    assert layers["private_dev_shm"] is (profile != "docker")
    assert any(entry.startswith("private /proc") for entry in report["missing"])
    assert report["strict"].startswith("strict mode"), report["strict"]
    # egress: a network namespace of the child's own, or every connect answered
    assert report["egress"].startswith("no network namespace" if profile == "docker" else
                                       "the proxy listens"), report["egress"]


@pytest.mark.parametrize("profile", PROFILES)
def test_the_security_suite_holds_in(profile: str) -> None:
    done = _in_container(profile, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                         "tests/security", "tests/runner/test_egress_sandbox.py",
                         "-W", "ignore::UserWarning")
    assert done.returncode == 0, _tail(done)


@pytest.mark.parametrize("profile", PROFILES)
def test_the_tour_runs_to_the_end_in(profile: str) -> None:
    """Its network cell included: under Docker's profile, through the connect broker."""
    done = _in_container(profile, "-m", "sandbox_kernel_ext.demo")
    assert done.returncode == 0, _tail(done)
