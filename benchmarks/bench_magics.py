"""A confined `%%sandbox` cell against IPython's own unconfined `%%script`, in one real kernel.

One kernel started through jupyter_client (the test suite's harness). Each round runs, in
turn, a plain cell, `%%script python -I -S`, `%%sandbox --quiet` and `%%sandbox` (with its
gauges), each printing 1, and times execute_request -> the kernel going idle (what a person
waits for). Interleaved, so load from elsewhere hits every kind alike. Goal from issue 5: the
confined cell no slower than `%%script` (about 27 ms for it on this kind of machine, a plain
cell about 8 ms). Prints medians and ratios; asserts nothing.

Run: `python benchmarks/bench_magics.py [-n 30]`.
"""

from __future__ import annotations

import argparse
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
}


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
                start = time.perf_counter_ns()
                msg_id = k.run(code)
                times[label].append(time.perf_counter_ns() - start)
                assert "1" in k.text(msg_id, "stdout"), k.text(msg_id)
    base = statistics.median(times["%%script python -I -S"])
    print(f"{'cell printing 1':24s} {'median':>10s} {'vs %%script':>12s}   (n={args.n}, interleaved)")
    for label, samples in times.items():
        median = statistics.median(samples)
        print(f"{label:24s} {fmt_ns(median):>10s} {median / base:>11.2f}x")


if __name__ == "__main__":
    main()
