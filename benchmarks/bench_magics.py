"""Confined `%%sandbox` cells against a plain cell and IPython's unconfined `%%script`, in one
real kernel.

One kernel started through jupyter_client (the test suite's harness). Each round runs, in
turn, a plain cell, `%%script python -I -S`, a `%%sandbox --quiet` cell in the warm session,
the same with its gauges, the first cell of a new session (after an untimed
`%sandbox restart` of it), a `%%sandbox --fresh --quiet` cell (a session started for the
cell and ended after it) and a one-shot
`%%sandbox --shell` cell, each printing 1, and times execute_request -> the kernel going idle
(what a person waits for). Interleaved, so load from elsewhere hits every kind alike. Goals:
a warm session cell at most 1.2x a plain cell, and at most 1.1x with its default gauges; a
new session's first cell no slower than `%%script`. Also reports the idle session's memory (its process tree's resident
set). Prints medians and ratios; asserts nothing.

Run: `python benchmarks/bench_magics.py [-n 30]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "notebook"))
from conftest import running_kernel  # noqa: E402  (the tests' kernel harness)

from _common import fmt_ns  # noqa: E402

CELLS = {
    "plain cell": "print(1)",
    "%%script python -I -S": f"%%script {sys.executable} -I -S\nprint(1)",
    "%%sandbox --quiet": "%%sandbox --quiet\nprint(1)",
    "%%sandbox (gauges)": "%%sandbox\nprint(1)",
    "first cell of a new session": "%%sandbox --session bench --quiet\nprint(1)",
    "%%sandbox --fresh --quiet": "%%sandbox --fresh --quiet\nprint(1)",
    "%%sandbox --shell --quiet": "%%sandbox --shell --quiet\necho 1",
}
BASELINES = {"%%sandbox --quiet": "plain cell", "%%sandbox (gauges)": "plain cell",
             "first cell of a new session": "%%script python -I -S",
             "%%sandbox --fresh --quiet": "%%script python -I -S",
             "%%sandbox --shell --quiet": "%%script python -I -S"}
IDLE_MEMORY = ("[e.session.memory_mb() for e in get_ipython().magics_manager"
               ".registry['SandboxMagics']._resources.sessions.values() if e.session]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=30, help="rounds")
    args = parser.parse_args()
    times: dict[str, list[int]] = {label: [] for label in CELLS}
    with running_kernel() as k:
        k.run("%load_ext sandbox_kernel_ext")
        for code in CELLS.values():  # warm: the launcher starts, modules load
            k.run(code)
        for _ in range(args.n):
            for label, code in CELLS.items():
                if label == "first cell of a new session":  # not timed: ends the last one
                    k.run("%sandbox restart bench")
                start = time.perf_counter_ns()
                msg_id = k.run(code)
                times[label].append(time.perf_counter_ns() - start)
                assert "1" in k.text(msg_id, "stdout"), k.text(msg_id)
        idle = json.loads(k.text(k.run(f"import json; print(json.dumps({IDLE_MEMORY}))"),
                                 "stdout").strip().splitlines()[-1])
    medians = {label: statistics.median(samples) for label, samples in times.items()}
    print(f"{'cell printing 1':28s} {'median':>10s}  ratio   (n={args.n}, interleaved)")
    for label, median in medians.items():
        base = BASELINES.get(label)
        ratio = f"{median / medians[base]:.2f}x {base}" if base else ""
        print(f"{label:28s} {fmt_ns(median):>10s}  {ratio}")
    print(f"idle session memory (resident, whole tree): {idle[0]:.1f} MB")


if __name__ == "__main__":
    main()
