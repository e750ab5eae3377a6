"""The policy's differential check, as long as you like: random realistic host trees and
policies, every probe through execute, run_python, a session and the file toolset, judged
by the effect on the host against the policy reference (`tests/policy_oracle.py`).

    .venv/bin/python scripts/policy_differential.py --policies 2000 [--seed 1] [--hours H]

Prints each mismatch with its tree and policy, then one summary line; exits 1 if any
policy mismatched. Run it as root for a root kernel's children (uid of the sandboxes'
own, folders of root and of uid 1000) and as another user for a non-root kernel's.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import policy_oracle  # noqa: E402

from sandbox_kernel_ext import SandboxManager  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", type=int, default=2000, help="how many (default 2000)")
    parser.add_argument("--seed", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument("--hours", type=float, default=None,
                        help="run until this much time has passed instead of --policies")
    args = parser.parse_args()
    warnings.simplefilter("ignore", UserWarning)
    deadline = time.monotonic() + args.hours * 3600 if args.hours else None
    outcomes: collections.Counter[str] = collections.Counter()
    mismatched = 0
    started = time.monotonic()
    with SandboxManager() as manager:
        seed = args.seed
        while (deadline is None and seed < args.seed + args.policies) or (
                deadline is not None and time.monotonic() < deadline):
            problems = policy_oracle.check(random.Random(seed), manager, label=f"seed {seed} ")
            if problems:
                mismatched += 1
                print("\n".join(problems), flush=True)
            outcomes["policies"] += 1
            seed += 1
    elapsed = time.monotonic() - started
    print(f"{outcomes['policies']} policies (seeds {args.seed}..{seed - 1}), 4 interfaces each, "
          f"{mismatched} with a mismatch, in {elapsed:.0f} s, as uid {manager.child_uid or 'own'}")
    return 1 if mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
