"""Click-to-resume latency of the approval widget in a real kernel.

One kernel started through jupyter_client (the test suite's harness); this script acts as
the frontend. For each sample a cell asks for approval, the script waits for the widget in
that cell's output, acknowledges its render, then measures from sending the Approve click
(a comm_msg on the shell channel) to:
- "resumed": the buttons' `disabled` update (the asking thread woke up and recorded the
  answer), and
- "cell output": the cell's own print after the write returned (what a person sees next).
Four askers: a `%%sandbox` cell (the confined child waits; the kernel's control thread asks),
the main thread in a synchronous cell, a background thread while the main thread blocks, and
an async cell through asyncio.to_thread.
Goal from issue 5: under 50 ms. Prints medians; asserts nothing.

Run: `python benchmarks/bench_approval.py [-n 20]`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "notebook"))
from conftest import KernelSession, running_kernel  # noqa: E402  (the tests' kernel harness)

from _common import fmt_ns  # noqa: E402

SETUP = """
from sandbox_kernel_ext import ApprovalBroker, FileSystemToolset, PathConfig, Sandbox, SandboxConfig
from sandbox_kernel_ext.notebook.approval_widget import responder_for
import asyncio, threading
config = SandboxConfig(paths={"data": PathConfig(root=%r, mode="rw")})
tk = FileSystemToolset(Sandbox(config), broker=ApprovalBroker(responder_for(get_ipython())))

def in_thread(path):
    worker = threading.Thread(target=tk.write, args=(path, "x"))
    worker.start()
    worker.join()
"""

SANDBOX_SETUP = """
import os
os.chmod({root!r}, 0o755)  # a root kernel's sandboxes run as an unprivileged uid
with open({root!r} + "/policy.yaml", "w") as f:
    f.write("filesystem_config: {{mode: read_only, readable_paths: []}}\\n"
            "paths: {{data: {{root: {root}, mode: rw}}}}\\n")
%load_ext sandbox_kernel_ext
%config SandboxMagics.policy = {root!r} + "/policy.yaml"
"""

ASKERS = {
    "%%sandbox cell": "%%sandbox --quiet\nopen({root!r} + '/{name}', 'w').write('x')",
    "main thread, sync cell": 'tk.write("/data/{name}", "x")',
    "background thread": 'in_thread("/data/{name}")',
    "async cell (to_thread)": 'await asyncio.to_thread(tk.write, "/data/{name}", "x")',
}


def sample(k: KernelSession, code: str) -> tuple[float, float]:
    msg_id = k.execute(code + '\nprint("resumed", flush=True)')
    root = k.wait_for_widget(msg_id)
    k.wait_idle(k.acknowledge_render(root))  # handled: the click below is timed alone
    approve = k.button(root, "Approve")
    start = time.perf_counter_ns()
    k.click(root, "Approve")
    k.wait_for(lambda _m: k.states[approve].get("disabled") is True, "the buttons to disable")
    resumed = time.perf_counter_ns() - start
    k.wait_for(lambda _m: "resumed" in k.text(msg_id, "stdout"), "the cell's print")
    printed = time.perf_counter_ns() - start
    k.wait_idle(msg_id)
    assert k.error(msg_id) is None, k.error(msg_id)
    return resumed, printed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="clicks per asker")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-approval-", dir="/tmp") as root:
        with running_kernel() as k:
            k.run(SETUP % root)
            k.run(SANDBOX_SETUP.format(root=root))
            for label, template in ASKERS.items():
                # The first request of the session starts the subshell: not timed.
                sample(k, template.format(root=root, name=f"warm-{len(label)}"))
                resumed, printed = [], []
                for i in range(args.n):
                    r, p = sample(k, template.format(root=root, name=f"{label[:4]}-{i}.txt"))
                    resumed.append(r)
                    printed.append(p)
                print(
                    f"{label:24s} click->resumed median {fmt_ns(statistics.median(resumed)):>9s}"
                    f"  click->cell output median {fmt_ns(statistics.median(printed)):>9s}"
                    f"  (n={args.n}, max {fmt_ns(max(printed))})"
                )


if __name__ == "__main__":
    main()
