"""`sandbox-run`: run one command under a policy file, or report what this host enforces.

    sandbox-run --policy policy.yaml [--timeout S] [--json] -- CMD ARGS...
    sandbox-run --check [--json]

The exit code is the child's (1 for a run the sandbox killed, 2 for bad usage or a bad policy).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from ...policy.errors import CapabilityParseError, SandboxError
from ...policy.models import CapabilityDeclaration
from ...policy.parser import CapabilityParser
from .isolation import isolation_report
from .manager import SandboxManager


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sandbox-run",
        description="Run a command confined by the Linux kernel (Landlock, seccomp, namespaces, rlimits).",
    )
    parser.add_argument("--policy", help="policy YAML file (default: the safe defaults)")
    parser.add_argument("--timeout", type=float, default=30.0, help="wall-clock seconds (default 30)")
    parser.add_argument("--json", action="store_true", help="print the SandboxResult (or report) as JSON")
    parser.add_argument("--check", action="store_true", help="print what this host enforces and exit")
    parser.add_argument("--strict", action="store_true", help="refuse to run if a layer is missing")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    return parser


def _print_report(as_json: bool) -> None:
    report = isolation_report()
    if as_json:
        print(json.dumps(report, indent=2))
        return
    print(f"platform: {report['platform']} (Python {report['python']})")
    print(f"landlock ABI: {report['landlock_abi']}")
    print(f"child identity: {report['child_identity']}")
    for layer, enforced in report["layers"].items():
        print(f"  {'yes' if enforced else 'NO '}  {layer}")
    for tier, state in report["tiers"].items():
        print(f"tier {tier}: {state}")
    print("missing: " + ("; ".join(report["missing"]) or "nothing"))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.check:
        _print_report(args.json)
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        _parser().print_usage(sys.stderr)
        print("sandbox-run: give a command after --, or --check", file=sys.stderr)
        return 2
    try:
        policy = CapabilityParser.from_file(args.policy) if args.policy else CapabilityDeclaration()
    except CapabilityParseError as exc:
        print(f"sandbox-run: {exc}", file=sys.stderr)
        return 2
    stream = None if args.json else (lambda name, text: (sys.stdout if name == "stdout" else sys.stderr).write(text))
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        try:
            with SandboxManager(strict=args.strict) as manager:
                sandbox_id = manager.create_sandbox(policy)
                result = manager.execute(sandbox_id, command, timeout=args.timeout, on_output=stream)
        except SandboxError as exc:
            print(f"sandbox-run: {exc}", file=sys.stderr)
            return 2
    if args.json:
        print(result.model_dump_json(indent=2))
    elif result.killed:
        print(f"[sandbox] killed: {result.killed}", file=sys.stderr)
    if result.exit_code == -1:
        return 1
    return result.exit_code if result.exit_code >= 0 else 128 - result.exit_code


if __name__ == "__main__":
    sys.exit(main())
