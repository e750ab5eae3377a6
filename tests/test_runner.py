"""SandboxManager, run_python, sandbox-run and the launcher, driven for real (no mocks).

The confined child runs as an unprivileged uid of its own when the tests run as root, so every
folder handed to a sandbox is made under /tmp with modes that uid can use.

Other sandboxes (another engineer's tests, a notebook) may run on this host at the same time, so "nothing is left running" counts only the processes the test itself started; see
`leftovers.py`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import psutil
import pytest
from leftovers import leftover_sandbox_processes
from no_user_namespaces import without_user_namespaces

from sandbox_kernel_ext import (
    CapabilityDeclaration,
    CapabilityParser,
    FilesystemConfig,
    FilesystemMode,
    ResourceLimits,
    SandboxError,
    SandboxManager,
    SandboxStatus,
    SandboxTier,
    isolation_report,
)
from sandbox_kernel_ext.runner.linux import landlock
from sandbox_kernel_ext.runner.trusted.isolation import default_child_uid

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or landlock.landlock_abi() < 1,
    reason="the runner's confinement needs Linux with Landlock",
)






def _policy(rw: Path | None = None, **limits: float) -> CapabilityDeclaration:
    fs = FilesystemConfig(mode=FilesystemMode.read_write, writable_paths=[str(rw)]) if rw else FilesystemConfig()
    return CapabilityDeclaration(filesystem_config=fs, resource_limits=ResourceLimits(**limits))


# The sandbox's uid on the host: a root kernel's children drop to a uid of their own
# (`default_child_uid`) when the tests run as root, else keep ours.
SANDBOX_UID = default_child_uid() if os.geteuid() == 0 else os.getuid()
# Set in the environment of what a test starts (`env=` of a run, or of a subprocess), so that
# its processes are known as ours even after they leave our process tree.
MARKER_NAME = "SBX_RUNNER_SUITE"
MARKER = f"runner-{uuid.uuid4().hex[:12]}"


def _leftover_sandbox_processes(*homes: str | Path, wait: float = 10.0) -> list[str]:
    """The sandbox processes this module started that are still there (`leftovers`)."""
    return leftover_sandbox_processes(SANDBOX_UID, MARKER, homes, wait)


def test_python_cell_variables_in_and_out(manager: SandboxManager) -> None:
    sid = manager.create_sandbox(_policy())
    result = manager.run_python(
        sid, "total = sum(xs)\nblob = data * 2\nnested = {'a': [1, None, 2.5], 'b': (True,)}",
        inputs={"xs": [1, 2, 3], "data": b"\x00\xff"}, outputs=["total", "blob", "nested"],
    )
    assert result.exit_code == 0, result.stderr
    assert result.variables == {"total": 6, "blob": b"\x00\xff\x00\xff",
                                "nested": {"a": [1, None, 2.5], "b": [True]}}
    assert manager.status(sid) is SandboxStatus.stopped


def test_non_json_output_variable_is_a_clear_error(manager: SandboxManager) -> None:
    sid = manager.create_sandbox(_policy())
    result = manager.run_python(sid, "import fractions\nf = fractions.Fraction(1, 3)", outputs=["f"])
    assert result.exit_code == 1 and result.variables == {}
    assert "output variable 'f' is a Fraction" in result.stderr
    missing = manager.run_python(sid, "x = 1", outputs=["y"])
    assert "not defined by the cell: y" in missing.stderr


def test_cell_exception_traceback_shows_the_cell_line(manager: SandboxManager) -> None:
    sid = manager.create_sandbox(_policy())
    result = manager.run_python(sid, "a = 1\nraise ValueError('boom')\n")
    assert result.exit_code == 1 and result.killed is None
    assert '<sandbox-cell>", line 2' in result.stderr and "raise ValueError('boom')" in result.stderr
    assert manager.run_python(sid, "import sys; sys.exit(7)").exit_code == 7


def test_output_streams_live_in_order(manager: SandboxManager) -> None:
    sid = manager.create_sandbox(_policy())
    seen: list[tuple[str, str]] = []
    code = "import sys, time\nprint('one', flush=True)\ntime.sleep(0.3)\nprint('two', file=sys.stderr)"
    result = manager.run_python(sid, code, on_output=lambda name, text: seen.append((name, text)))
    assert ("stdout", "one\n") in seen and ("stderr", "two\n") in seen
    assert seen.index(("stdout", "one\n")) < seen.index(("stderr", "two\n"))
    assert result.stdout == "one\n" and result.stderr == "two\n"


def test_writable_root_is_writable_and_nothing_else(manager: SandboxManager, shared_dir: Path) -> None:
    sid = manager.create_sandbox(_policy(shared_dir))
    result = manager.execute(sid, ["sh", "-c", f"echo ok > {shared_dir}/out.txt && echo no > /tmp/sbx-outside-$$"])
    assert (shared_dir / "out.txt").read_text() == "ok\n"
    # Refused by the read-only view of the host (or, where Linux has no mount_setattr, Landlock).
    assert result.exit_code != 0 and (
        "Read-only file system" in result.stderr or "Permission denied" in result.stderr)
    assert not list(Path("/tmp").glob("sbx-outside-*"))


def test_resource_usage_has_the_seed_keys(manager: SandboxManager) -> None:
    sid = manager.create_sandbox(_policy())
    usage = manager.execute(sid, ["/bin/true"]).resource_usage
    assert {"cpu_seconds", "peak_memory_mb", "tokens_used", "cost_usd", "elapsed_seconds"} <= set(usage)
    assert usage["peak_processes"] == 1  # over before the monitor's first look, still one process


def test_peak_processes_counts_the_largest_tree_seen(manager: SandboxManager) -> None:
    sid = manager.create_sandbox(_policy())
    result = manager.execute(sid, ["sh", "-c", "sleep 1 & sleep 1 & wait"], timeout=20)
    assert result.exit_code == 0 and result.resource_usage["peak_processes"] == 3


def test_token_budget_breach_kills_the_run(manager: SandboxManager) -> None:
    sid = manager.create_sandbox(_policy(max_tokens=100))
    threading.Timer(0.5, lambda: manager.record_usage(sid, tokens=150)).start()
    result = manager.run_python(sid, "import time; time.sleep(30)", timeout=20)
    assert result.exit_code == -1 and "Token limit exceeded" in (result.killed or "")
    assert result.stderr.endswith("[sandbox] killed: " + result.killed + "\n")
    assert result.resource_usage["tokens_used"] == 150


def test_monitor_snapshots_reach_subscribers_while_running(manager: SandboxManager) -> None:
    sid = manager.create_sandbox(_policy())
    snapshots: list[dict] = []

    def watch(name: str, text: str) -> None:
        monitor = manager.monitor(sid)
        if monitor is not None and "go" in text:
            monitor.subscribe(snapshots.append)

    manager.run_python(sid, "import time\nprint('go', flush=True)\ntime.sleep(1.2)", on_output=watch)
    assert snapshots and all("memory_mb" in snap for snap in snapshots)


def test_interrupt_kills_the_whole_tree(manager: SandboxManager) -> None:
    sid = manager.create_sandbox(_policy())

    def interrupt(name: str, text: str) -> None:
        if "ready" in text:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        manager.execute(sid, ["sh", "-c", "setsid sleep 300 & sleep 300 & echo ready; wait"],
                        on_output=interrupt, env={MARKER_NAME: MARKER})
    assert _leftover_sandbox_processes() == []
    assert manager.status(sid) is SandboxStatus.stopped
    assert manager.execute(sid, ["/bin/true"]).exit_code == 0  # usable again


def test_errors_name_the_problem(manager: SandboxManager, shared_dir: Path) -> None:
    with pytest.raises(SandboxError, match="unknown sandbox id"):
        manager.execute("nope", ["true"])
    sid = manager.create_sandbox(_policy())
    with pytest.raises(SandboxError, match="non-empty list"):
        manager.execute(sid, [])
    with pytest.raises(SandboxError, match="metacharacters"):
        manager.execute(sid, ["ls;rm"])
    with pytest.raises(SandboxError, match="command not found.*'no-such-program'"):
        manager.execute(sid, ["no-such-program"])
    with pytest.raises(SandboxError, match="writable_paths is empty"):
        manager.create_sandbox(CapabilityDeclaration(filesystem_config=FilesystemConfig(mode=FilesystemMode.read_write)))
    with pytest.raises(SandboxError, match="firecracker' is not available"):
        manager.create_sandbox(CapabilityDeclaration(sandbox_tier=SandboxTier.firecracker))
    with pytest.raises(SandboxError, match="gvisor"):
        manager.create_sandbox(CapabilityDeclaration(sandbox_tier=SandboxTier.gvisor))
    with pytest.raises(SandboxError, match="does not exist"):
        manager.create_sandbox(_policy(shared_dir / "missing"))
    assert manager.status(sid) is SandboxStatus.created


@pytest.mark.skipif(os.geteuid() != 0, reason="only root's children have a uid check")
def test_root_refuses_a_writable_root_the_child_cannot_write(manager: SandboxManager, shared_dir: Path) -> None:
    """Root's 0755 folder is shown to the unprivileged child as its own (the owner map), as it is
    writable by a root child; another user's 0755 folder is neither's to write."""
    os.chmod(shared_dir, 0o755)
    manager.destroy(manager.create_sandbox(_policy(shared_dir)))
    with SandboxManager(child_uid=0) as as_root:
        as_root.destroy(as_root.create_sandbox(_policy(shared_dir)))
        os.chown(shared_dir, 1000, 1000)
        with pytest.raises(SandboxError, match="not writable by uid 0"):
            as_root.create_sandbox(_policy(shared_dir))
    with pytest.raises(SandboxError, match=f"not writable by uid {SANDBOX_UID}"):
        manager.create_sandbox(_policy(shared_dir))


def test_list_destroy_and_lifecycle() -> None:
    with SandboxManager() as m:
        sid = m.create_sandbox(_policy())
        assert [s["sandbox_id"] for s in m.list_sandboxes()] == [sid]
        assert m.list_sandboxes()[0]["status"] is SandboxStatus.created
        m.execute(sid, ["/bin/true"])
        launcher = m.launcher_pid
        assert launcher is not None and psutil.pid_exists(launcher)
        m.destroy(sid)
        assert m.list_sandboxes() == []
        with pytest.raises(SandboxError):
            m.status(sid)
    assert not psutil.pid_exists(launcher) or psutil.Process(launcher).status() == psutil.STATUS_ZOMBIE


def test_concurrent_runs_from_threads(manager: SandboxManager) -> None:
    ids = [manager.create_sandbox(_policy()) for _ in range(4)]
    results: dict[str, str] = {}

    def run(sid: str) -> None:
        results[sid] = manager.run_python(sid, f"print({sid!r})").stdout

    threads = [threading.Thread(target=run, args=(sid,)) for sid in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {sid: sid + "\n" for sid in ids}


def test_isolation_report_matches_this_host() -> None:
    report = isolation_report()
    assert report["landlock_abi"] == landlock.landlock_abi()
    assert report["layers"]["landlock"] is True
    assert report["tiers"]["firecracker"].startswith("unavailable")


def _venv_python() -> str:
    return sys.executable


def test_sandbox_run_cli(shared_dir: Path) -> None:
    policy = shared_dir / "policy.yaml"
    policy.write_text(f"filesystem_config:\n  mode: read_write\n  writable_paths: [{shared_dir}]\n")
    cli = [_venv_python(), "-m", "sandbox_kernel_ext.runner.trusted.cli"]
    done = subprocess.run([*cli, "--policy", str(policy), "--", "sh", "-c", f"echo hi > {shared_dir}/f; exit 3"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and (shared_dir / "f").read_text() == "hi\n"
    done = subprocess.run([*cli, "--timeout", "0.5", "--", "sleep", "30"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "[sandbox] killed: timeout after 0.5 s" in done.stderr
    bad = shared_dir / "bad.yaml"
    bad.write_text("resource_limits:\n  max_memmory_mb: 1\n")
    done = subprocess.run([*cli, "--policy", str(bad), "--", "true"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "line 2" in done.stderr and "max_memmory_mb" in done.stderr
    done = subprocess.run([*cli, "--check", "--json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and '"landlock_abi"' in done.stdout


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_unprivileged_kernel_confines_through_a_user_namespace(shared_dir: Path) -> None:
    """A kernel that is not root: the child keeps its uid inside a user namespace."""
    script = shared_dir / "run.py"
    script.write_text(
        "from sandbox_kernel_ext import SandboxManager, CapabilityDeclaration\n"
        "with SandboxManager() as m:\n"
        "    sid = m.create_sandbox(CapabilityDeclaration())\n"
        "    r = m.execute(sid, ['sh', '-c', 'cat /proc/self/uid_map; echo x > /tmp/sbx-unpriv-escape'])\n"
        "    print(r.exit_code, r.stdout.split(), r.stderr)\n"
    )
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", _venv_python(), str(script)],
        capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"], "HOME": str(shared_dir)},
    )
    assert done.returncode == 0, done.stderr
    assert "['65534', '65534', '1']" in done.stdout
    assert "Read-only file system" in done.stdout  # the mount namespace of its user namespace
    assert not Path("/tmp/sbx-unpriv-escape").exists()


def test_policy_file_drives_the_runner(shared_dir: Path, manager: SandboxManager) -> None:
    (shared_dir / "ro").mkdir()
    (shared_dir / "ro" / "in.txt").write_text("data")
    os.chmod(shared_dir / "ro", 0o755)
    policy_file = shared_dir / "policy.yaml"
    policy_file.write_text(
        "filesystem_config:\n  mode: read_only\n  readable_paths: [ro]\nresource_limits:\n  max_memory_mb: 64\n"
    )
    policy = CapabilityParser.from_file(policy_file)
    sid = manager.create_sandbox(policy)
    result = manager.run_python(sid, f"print(open('{shared_dir}/ro/in.txt').read())\nopen('/etc/hostname').read()\n"
                                     "open('/tmp/x', 'w')")
    assert result.stdout == "data\n" and "PermissionError" in result.stderr


def test_a_killed_kernel_leaves_no_sandbox_behind(shared_dir: Path) -> None:
    """SIGKILL the process that owns the manager mid-run: the launcher sees its socket close
    and kills the child's namespace, `setsid` grandchild included."""
    marker = f"{os.getpid()}{threading.get_ident() % 1000}"
    script = shared_dir / "owner.py"
    script.write_text(
        "from sandbox_kernel_ext import SandboxManager, CapabilityDeclaration\n"
        "m = SandboxManager()\n"
        "sid = m.create_sandbox(CapabilityDeclaration())\n"
        f"m.execute(sid, ['sh', '-c', 'setsid sleep {marker}1 & sleep {marker}2'], timeout=120)\n"
    )
    owner = subprocess.Popen([_venv_python(), str(script)])

    def sleepers() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"]
                and p.info["cmdline"][0] == "sleep" and p.info["cmdline"][-1].startswith(marker)]

    try:
        for _ in range(400):
            if len(sleepers()) == 2:
                break
            threading.Event().wait(0.05)
        assert len(sleepers()) == 2
    finally:
        owner.kill()
        owner.wait()
    for _ in range(200):
        if not sleepers():
            break
        threading.Event().wait(0.05)
    assert sleepers() == []


def test_terminal_tool_runs_confined_and_refuses_blacklisted_words(shared_dir: Path) -> None:
    import asyncio

    from sandbox_kernel_ext import TerminalTool, ToolError

    policy = _policy(shared_dir)
    with TerminalTool(timeout=5.0, policy=policy, cwd=str(shared_dir)) as terminal:
        out = asyncio.run(terminal.execute(
            command="echo hi > note.txt; cat note.txt; cat /etc/shadow; echo x > /etc/sbx-terminal"))
        assert out["stdout"] == "hi\n", out  # /etc/shadow is hidden: nothing to print
        assert "Read-only file system" in out["stderr"] or "Permission denied" in out["stderr"]
        assert not os.path.exists("/etc/sbx-terminal")
        assert out["exit_code"] != 0 and out["platform"] == sys.platform
        assert (shared_dir / "note.txt").read_text() == "hi\n"
        # The sandbox's private home: every process the tool starts has HOME there.
        home = asyncio.run(terminal.execute(command='echo "$HOME"'))["stdout"].strip()
        assert home.startswith("/")
        for line in ("rm -rf /", "echo ok; env rm x", "echo $(rm x)", "sh -c 'rm x'"):
            with pytest.raises(ToolError, match="'rm' is blocked"):
                asyncio.run(terminal.execute(command=line))
        with pytest.raises(ToolError, match="timed out"):
            asyncio.run(terminal.execute(command="sleep 30"))
    assert _leftover_sandbox_processes(home) == []


# Nested user namespaces refused, then uid 65534: the runner must fall back to no namespaces,
# warn, and still leave nothing behind.
WITHOUT_USER_NAMESPACES = without_user_namespaces(drop_to_nobody=True)

FALLBACK_RUN = """
import os, sys, tempfile, time, warnings
tempfile.tempdir = sys.argv[1]
from sandbox_kernel_ext import SandboxManager, CapabilityDeclaration, isolation_report
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    m = SandboxManager()
    sid = m.create_sandbox(CapabilityDeclaration())
print("warned:", any("namespaces" in str(w.message) for w in caught))
print("missing:", isolation_report()["missing"])
left = "import os, time\\npid = os.fork()\\nif pid == 0:\\n    os.closerange(0, 100); os.setsid(); time.sleep(60); os._exit(0)\\nprint(pid)"
r = m.run_python(sid, left, timeout=20)
orphan = int(r.stdout)  # a host pid: no PID namespace here
for _ in range(200):  # the launcher kills and reaps what a finished child left behind
    if not os.path.exists(f"/proc/{orphan}"):
        break
    time.sleep(0.05)
print("orphan run:", r.exit_code, "gone:", not os.path.exists(f"/proc/{orphan}"))
r = m.run_python(sid, "open('/etc/shadow')")
print("shadow:", "PermissionError" in r.stderr)
net = CapabilityDeclaration.model_validate({"network_egress_rules": [{"domain": "example.com"}]})
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    nid = m.create_sandbox(net)
print("net warned:", any("gets no network at all" in str(w.message) for w in caught))
r = m.run_python(nid, "import socket\\ntry:\\n    socket.socket()\\n    print('socket made')\\nexcept OSError as e:\\n    print('no socket', e.errno)")
print("net run:", r.stdout.strip(), "no network" in r.stderr)
try:
    m.create_sandbox(net.model_copy(update={"strict": True}))
    print("strict: allowed")
except Exception as exc:
    print("strict:", type(exc).__name__, "network namespace" in str(exc))
m.close()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to set up a user namespace without nested ones")
def test_without_user_namespaces_the_runner_warns_and_leaves_nothing(shared_dir: Path) -> None:
    (shared_dir / "wrap.py").write_text(WITHOUT_USER_NAMESPACES)
    (shared_dir / "run.py").write_text(FALLBACK_RUN)
    done = subprocess.run(
        [_venv_python(), str(shared_dir / "wrap.py"), _venv_python(), str(shared_dir / "run.py"), str(shared_dir)],
        capture_output=True, text=True, timeout=120, cwd=str(shared_dir),
        # The launcher keeps only PATH and LANG of its parent's environment: MARKER rides in PATH.
        env={**os.environ, MARKER_NAME: MARKER, "PATH": f"{os.environ['PATH']}{os.pathsep}/nonexistent-{MARKER}"},
    )
    assert done.returncode == 0, done.stderr
    assert "warned: True" in done.stdout and "namespaces (user namespaces are refused" in done.stdout
    assert "orphan run: 0 gone: True" in done.stdout and "shadow: True" in done.stdout
    # Without a network namespace egress rules hold through the connect broker (seccomp user
    # notification): no warning, and the cell may make its TCP socket.
    assert "net warned: False" in done.stdout and "net run: socket made False" in done.stdout
    assert "strict: SandboxError True" in done.stdout
    # run.py's sandboxes made their homes under shared_dir (its tempdir).
    assert _leftover_sandbox_processes(shared_dir) == []


class _OpensWhenLoaded:
    """An input whose unpickling runs code: `open()` of a path outside the sandbox."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (self.path,))


def test_inputs_are_loaded_after_the_cells_hooks(manager: SandboxManager, shared_dir: Path) -> None:
    """An input's own code meets the same hooks as the cell's: the refusal explains itself
    instead of being the kernel's bare EACCES."""
    secret = shared_dir / "secret.txt"
    secret.write_text("no")
    (shared_dir / "public").mkdir()
    sid = manager.create_sandbox(CapabilityDeclaration(
        filesystem_config=FilesystemConfig(readable_paths=[str(shared_dir / "public")])))
    result = manager.run_python(sid, "print('ran')", inputs={"x": _OpensWhenLoaded(str(secret))})
    assert result.exit_code != 0 and "ran" not in result.stdout
    assert f"read of {secret} denied by the sandbox policy" in result.stderr, result.stderr


@pytest.mark.parametrize("egress", [False, True])
def test_a_name_lookup_says_why_the_sandbox_has_no_answer(manager: SandboxManager,
                                                          egress: bool) -> None:
    """Found by a first-hour user: a fetch failed with "Temporary failure in name
    resolution", as if the host's network were down."""
    policy = CapabilityDeclaration.model_validate(
        {"network_egress_rules": [{"domain": "pypi.org", "ports": [443]}]} if egress else {})
    sid = manager.create_sandbox(policy)
    result = manager.run_python(sid, "import socket\nsocket.getaddrinfo('example.com', 443)")
    assert result.exit_code == 1
    expected = ("its one way out is the proxy named in HTTPS_PROXY and HTTP_PROXY, to pypi.org"
                if egress else "the sandbox has no network (its policy lists no egress rules)")
    assert expected in result.stderr and "'example.com'" in result.stderr, result.stderr
