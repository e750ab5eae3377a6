"""A tour of the policy and the file toolset on a temporary folder.

Run `python -m sandbox_kernel_ext.demo`. It writes a policy file, lets a scripted
"agent" try a series of file operations, and prints what was allowed, what was asked
(and how it was answered), and what was denied and why.
"""

from __future__ import annotations

import os
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

from . import (
    ApprovalBroker,
    ApprovalRequest,
    CallbackResponder,
    CapabilityParseError,
    CapabilityParser,
    Decision,
    EgressFilter,
    FileSystemToolset,
    SandboxError,
    SandboxManager,
    isolation_report,
)

SANDBOXED_CELL = """\
print("read docs/guide.md:", open(f"{root}/docs/guide.md").readline().strip())
open(f"{root}/scratch/from-sandbox.txt", "w").write("written inside the sandbox\\n")
print("wrote scratch/from-sandbox.txt")
import os, socket, signal
attempts = {
    "read secret.txt (outside the roots)": lambda: open(f"{root}/secret.txt").read(),
    "write docs/guide.md (read-only root)": lambda: open(f"{root}/docs/guide.md", "w"),
    "read /etc/shadow": lambda: open("/etc/shadow").read(),
    "connect to 1.1.1.1:443": lambda: socket.create_connection(("1.1.1.1", 443), timeout=2),
    "kill the kernel": lambda: os.kill(kernel_pid, signal.SIGKILL),
    "read the kernel's API key": lambda: os.environ["DEMO_API_KEY"],
}
for label, attempt in attempts.items():
    try:
        attempt()
        print("  ESCAPED ", label)
    except Exception as exc:
        print("  refused ", label, "--", type(exc).__name__, getattr(exc, "strerror", None) or exc)
"""

POLICY = """\
# Everything a sandbox may do, in one file.
sandbox_tier: seccomp
resource_limits: {max_memory_mb: 256, max_cpu_seconds: 10}
filesystem_config: {mode: read_only, readable_paths: []}   # sandboxed code: only the table below
network_egress_rules:
  - {domain: api.openai.com, ports: [443], rate_limit_per_min: 30}
  - {domain: "*.python.org", ports: [443]}
paths:                      # the agent's virtual folders
  docs:  {root: docs,  mode: ro}
  notes: {root: notes, mode: rw, write_approval: true, suffixes: [.md, .txt]}
  scratch: {root: scratch, mode: rw, write_approval: false}
file_limits:
  max_write_bytes: 4096
  max_total_bytes: 65536
"""

BROKEN_POLICY = """\
sandbox_tier: seccomp
resource_limits:
  max_memroy_mb: 256
"""


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="sandbox-demo-") as tmp:
        root = Path(tmp)
        for name in ("docs", "notes", "scratch"):
            (root / name).mkdir()
        (root / "docs" / "guide.md").write_text("# Guide\nBe kind to files.\n")
        (root / "secret.txt").write_text("the host's secret\n")
        os.symlink(root / "secret.txt", root / "scratch" / "shortcut.txt")
        (root / "policy.yaml").write_text(POLICY)

        print("Policy file (policy.yaml):")
        print(textwrap.indent(POLICY, "    "))
        policy = CapabilityParser.from_file(root / "policy.yaml")

        def person(request: ApprovalRequest) -> Decision:
            """Stands in for the person at the notebook: approves Markdown, nothing else."""
            answer = Decision.allow_once if request.path.endswith(".md") else Decision.deny
            print(f"      asked: {request.operation} {request.path} -> {answer.value}")
            return answer

        broker = ApprovalBroker(CallbackResponder(person, name="demo person"))
        tools = FileSystemToolset.from_policy(policy, id="demo", broker=broker)
        print(f"The agent sees {tools.sandbox!r}\n")

        steps: list[tuple[str, Callable[[], object]]] = [
            ("list every file", lambda: tools.list_files()),
            ("read /docs/guide.md", lambda: tools.read("/docs/guide.md").content.splitlines()[0]),
            ("write /scratch/plan.txt", lambda: tools.write("/scratch/plan.txt", "step 1\n")),
            ("write /notes/summary.md (approval)", lambda: tools.write("/notes/summary.md", "# Summary\n")),
            ("write /notes/todo.txt (approval)", lambda: tools.write("/notes/todo.txt", "later\n")),
            ("write /notes/run.sh (suffix)", lambda: tools.write("/notes/run.sh", "echo hi\n")),
            ("write /docs/guide.md (read-only)", lambda: tools.write("/docs/guide.md", "mine now\n")),
            ("read ../secret.txt (traversal)", lambda: tools.read("/docs/../secret.txt")),
            ("read a host path", lambda: tools.read(str(root / "secret.txt"))),
            ("read /scratch/shortcut.txt (symlink out)", lambda: tools.read("/scratch/shortcut.txt")),
            ("write 10 KB to /scratch (per-write quota)", lambda: tools.write("/scratch/big.txt", "x" * 10_000)),
            ("edit /scratch/plan.txt", lambda: tools.edit("/scratch/plan.txt", "step 1", "step 1: read")),
        ]
        counts = {"allowed": 0, "denied": 0}
        for title, step in steps:
            try:
                result = step()
            except SandboxError as exc:
                counts["denied"] += 1
                print(f"  DENIED   {title}\n      {exc}")
            else:
                counts["allowed"] += 1
                print(f"  ALLOWED  {title}\n      {result}")
        asked = len(broker.log)
        print(
            f"\n{counts['allowed']} allowed, {counts['denied']} denied, {asked} asked "
            f"(of which {sum(r.decision.allowed for r in broker.log)} approved)."
        )

        egress = EgressFilter(policy.network_egress_rules)
        print("\nNetwork allowlist (enforced by the runner's proxy in later releases):")
        for url in ("https://api.openai.com/v1/chat", "https://docs.python.org/3/", "https://python.org/",
                    "http://api.openai.com@evil.example/", "https://api.openai.com:8443/"):
            decision = egress.decide(url)
            print(f"  {'allow' if decision.allowed else 'deny '}  {url}  ({decision.reason})")

        print("\nA policy file with a typo is refused with its line and field:")
        (root / "broken.yaml").write_text(BROKEN_POLICY)
        try:
            CapabilityParser.from_file(root / "broken.yaml")
        except CapabilityParseError as exc:
            print(f"  {exc}".replace(str(root) + "/", ""))
        print(f"\nLLM tool definitions offered: {', '.join(t['function']['name'] for t in tools.tool_definitions())}")
        tools.close()
        runner_tour(root, policy)


def runner_tour(root: Path, policy: object) -> None:
    """The same policy confining arbitrary code: a Python cell run by the kernel's rules."""
    report = isolation_report()
    print(f"\nSandboxed code under the same policy (Landlock ABI {report['landlock_abi']}; "
          f"missing layers: {', '.join(report['missing']) or 'none'}):")
    if os.geteuid() == 0:  # the child runs as uid 65534: let it reach the demo's folders
        os.chmod(root, 0o755)
        for name in ("docs", "notes"):
            os.chmod(root / name, 0o755)
        os.chmod(root / "scratch", 0o777)
    os.environ["DEMO_API_KEY"] = "sk-demo-not-for-sandboxes"
    with SandboxManager() as manager:
        sandbox_id = manager.create_sandbox(policy)
        result = manager.run_python(
            sandbox_id, SANDBOXED_CELL, inputs={"root": str(root), "kernel_pid": os.getpid()},
            on_output=lambda stream, text: print(textwrap.indent(text, "    "), end=""),
        )
        print(f"  exit code {result.exit_code}; {result.resource_usage['cpu_seconds']} s CPU, "
              f"peak {result.resource_usage['peak_memory_mb']} MB")
        print("  the file the sandbox wrote, read by the kernel:",
              (root / "scratch" / "from-sandbox.txt").read_text().strip())
        hog = manager.run_python(sandbox_id, "blocks = []\nwhile True: blocks.append(bytearray(2**24))",
                                 timeout=10)
        print(f"  a cell that eats memory: exit code {hog.exit_code}, killed: {hog.killed}")
        print("  a cell that sleeps past its timeout:",
              manager.run_python(sandbox_id, "import time; time.sleep(60)", timeout=1).killed)


if __name__ == "__main__":
    main()
