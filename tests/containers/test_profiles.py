"""The security suite and the tour inside a pod's container, once per seccomp profile.

`enter.py` builds the conditions a container runtime gives a Jupyter pod (namespaces, a
read-only host, a fresh /proc with the runtime's masked paths, a uid of 1000 or up with no
capability, `no_new_privs`, then Docker's or Podman's real seccomp profile, or none) and runs
a command there. Each test below runs a whole suite that way and fails with its summary; the
three profiles' security suites run side by side.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from side_by_side import side_by_side

ROOT = Path(__file__).resolve().parents[2]
ENTER = ROOT / "tests" / "containers" / "enter.py"
PROFILES = ["docker", "podman", "unconfined"]

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only"),
    pytest.mark.skipif(os.geteuid() != 0,
                       reason="the container's conditions are built as root, then dropped"),
]


def _container_argv(profile: str, *command: str) -> list[str]:
    # A uid per profile, as pods of their own would have: the suites run side by side, and
    # Linux counts the processes of a uid that has no user namespace across every container
    # (`docs/guarantees.md`), so one suite's sandboxes would eat another's process budget.
    uid = 1000 + PROFILES.index(profile)
    return ["/usr/bin/python3", str(ENTER), "--profile", profile, "--uid", str(uid),
            "--keep", str(ROOT), "--", sys.executable, *command]


_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout, not another install


def _in_container(profile: str, *command: str,
                  timeout: float = 1800) -> subprocess.CompletedProcess:
    """`command` under the conditions of a pod whose runtime uses `profile`."""
    return subprocess.run(_container_argv(profile, *command), cwd=ROOT, env=_ENV,
                          capture_output=True, text=True, timeout=timeout)


SUITE = ("-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/security",
         "tests/runner/test_egress_sandbox.py", "-W", "ignore::UserWarning")


@pytest.fixture(scope="module")
def suites() -> Iterator[dict[str, Future[subprocess.CompletedProcess]]]:
    """The security suite in every profile's container, side by side (each container has
    its own /tmp, /dev/shm, PID and network namespaces, and uid)."""
    with side_by_side({profile: functools.partial(_in_container, profile, *SUITE)
                       for profile in PROFILES}) as running:
        yield running


def _tail(done: subprocess.CompletedProcess, lines: int = 60) -> str:
    """The end of what the suite printed, after the names of what failed and their
    assertion lines (which a long list of skips at the end would otherwise push out of
    view)."""
    printed = (done.stdout + done.stderr).splitlines()
    failed = [line for line in printed if line.startswith(("FAILED ", "ERROR "))]
    why = [line for line in printed if line.startswith("E ")][:80]
    return "\n".join([*failed, *why, "...", *printed[-lines:]])


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
def test_the_security_suite_holds_in(
        profile: str, suites: dict[str, Future[subprocess.CompletedProcess]]) -> None:
    done = suites[profile].result()
    assert done.returncode == 0, _tail(done)


@pytest.mark.parametrize("profile", PROFILES)
def test_the_tour_runs_to_the_end_in(profile: str) -> None:
    """Its network cell included: under Docker's profile, through the connect broker."""
    done = _in_container(profile, "-m", "sandbox_kernel_ext.demo")
    assert done.returncode == 0, _tail(done)
