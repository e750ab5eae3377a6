"""A cell's narrowing of the session policy: lowering works, every widening is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_kernel_ext.policy import CapabilityDeclaration, CapabilityParser
from sandbox_kernel_ext.policy.narrowing import Narrowing, NarrowingError, lower_only, narrow


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for name in ("ro", "rw", "rw/sub", "gated_read", "gated_write", "other", "secret"):
        (tmp_path / name).mkdir()
    return tmp_path


def _ceiling(tree: Path, **extra: object) -> CapabilityDeclaration:
    data: dict[str, object] = {
        "filesystem_config": {"mode": "read_write", "writable_paths": [str(tree / "rw")],
                              "readable_paths": [str(tree / "ro")]},
        "network_egress_rules": [
            {"domain": "api.example.com", "ports": [443], "rate_limit_per_min": 30},
            {"domain": "*.python.org"},
        ],
        "resource_limits": {"max_memory_mb": 256, "max_cpu_seconds": 10},
    }
    data.update(extra)
    return CapabilityDeclaration.model_validate(data)


# -- budgets ------------------------------------------------------------------------------------

def test_budgets_may_be_lowered_and_nothing_else_changes(tree: Path) -> None:
    ceiling = _ceiling(tree)
    cell = narrow(ceiling, Narrowing(max_memory_mb=64, max_cpu_seconds=2.5))
    assert cell.resource_limits.max_memory_mb == 64 and cell.resource_limits.max_cpu_seconds == 2.5
    assert cell.resource_limits.max_tokens == ceiling.resource_limits.max_tokens
    assert cell.filesystem_config == ceiling.filesystem_config
    assert ceiling.resource_limits.max_memory_mb == 256  # the ceiling itself is untouched


@pytest.mark.parametrize(
    ("narrowing", "field", "words"),
    [
        (Narrowing(max_memory_mb=257), "max_memory_mb", "257 MB is above the session policy's "
                                                        "ceiling of 256 MB"),
        (Narrowing(max_cpu_seconds=10.5), "max_cpu_seconds", "ceiling of 10 s"),
        (Narrowing(max_memory_mb=0), "max_memory_mb", "must be a positive number"),
        (Narrowing(max_cpu_seconds=float("nan")), "max_cpu_seconds", "positive"),
        (Narrowing(max_cpu_seconds=float("inf")), "max_cpu_seconds", "positive"),
    ],
)
def test_raising_a_budget_is_refused(tree: Path, narrowing: Narrowing, field: str,
                                     words: str) -> None:
    with pytest.raises(NarrowingError) as caught:
        narrow(_ceiling(tree), narrowing)
    assert caught.value.field == field and words in str(caught.value)


def test_lower_only_accepts_the_ceiling_itself() -> None:
    assert lower_only("timeout", 60.0, 60.0, " s") == 60.0
    with pytest.raises(NarrowingError, match="timeout 61 s is above"):
        lower_only("timeout", 61.0, 60.0, " s")


def test_no_request_returns_the_ceiling(tree: Path) -> None:
    ceiling = _ceiling(tree)
    assert narrow(ceiling, Narrowing()) is ceiling


# -- network ------------------------------------------------------------------------------------

def test_destinations_within_the_rules_narrow_the_allowlist(tree: Path) -> None:
    cell = narrow(_ceiling(tree), Narrowing(allow_net=("api.example.com", "docs.python.org:8443",
                                                         "*.pypi.python.org")))
    rules = {(r.domain, tuple(r.ports), r.rate_limit_per_min) for r in cell.network_egress_rules}
    assert rules == {("api.example.com", (443,), 30), ("docs.python.org", (8443,), 60),
                     ("*.pypi.python.org", (), 60)}


@pytest.mark.parametrize(
    "destination",
    ["evil.com", "api.example.com:80", "python.org", "*.example.com", "*.python.org.evil.com",
     "127.0.0.1", "api.example.com:99999", "not a host"],
)
def test_destinations_beyond_the_rules_are_refused(tree: Path, destination: str) -> None:
    with pytest.raises(NarrowingError) as caught:
        narrow(_ceiling(tree), Narrowing(allow_net=(destination,)))
    assert caught.value.field == "allow_net" and repr(destination) in str(caught.value)


def test_no_network_in_the_ceiling_means_no_destination_at_all(tree: Path) -> None:
    with pytest.raises(NarrowingError, match="no network at all"):
        narrow(_ceiling(tree, network_egress_rules=[]), Narrowing(allow_net=("example.com",)))


def test_the_same_wildcard_is_allowed(tree: Path) -> None:
    cell = narrow(_ceiling(tree), Narrowing(allow_net=("*.python.org",)))
    assert [r.domain for r in cell.network_egress_rules] == ["*.python.org"]


# -- paths --------------------------------------------------------------------------------------

def test_named_paths_are_all_the_cell_gets(tree: Path) -> None:
    cell = narrow(_ceiling(tree), Narrowing(allow_write=(str(tree / "rw" / "sub"),),
                                            allow_read=(str(tree / "ro"),)))
    assert cell.filesystem_config.writable_paths == [str(tree / "rw" / "sub")]
    assert cell.filesystem_config.readable_paths == [str(tree / "ro")]
    only_read = narrow(_ceiling(tree), Narrowing(allow_read=(str(tree / "rw"),)))
    assert only_read.filesystem_config.writable_paths == []
    assert only_read.filesystem_config.mode.value == "read_only"


def test_relative_paths_resolve_against_cwd(tree: Path) -> None:
    cell = narrow(_ceiling(tree), Narrowing(allow_write=("rw/sub",)), cwd=str(tree))
    assert cell.filesystem_config.writable_paths == [str(tree / "rw" / "sub")]


@pytest.mark.parametrize(
    ("field", "name"),
    [("allow_write", "ro"), ("allow_write", "other"), ("allow_read", "other"),
     ("allow_write", "."), ("allow_read", ".")],
)
def test_paths_beyond_the_ceiling_are_refused(tree: Path, field: str, name: str) -> None:
    with pytest.raises(NarrowingError) as caught:
        narrow(_ceiling(tree), Narrowing(**{field: (str(tree / name),)}))
    assert caught.value.field == field and str(tree / name).rstrip("/.") in str(caught.value)


def test_a_symlink_is_judged_by_where_it_leads(tree: Path) -> None:
    (tree / "rw" / "link").symlink_to(tree / "other")
    with pytest.raises(NarrowingError, match="outside what the session policy lets a sandbox"):
        narrow(_ceiling(tree), Narrowing(allow_write=(str(tree / "rw" / "link"),)))


def test_missing_path_is_named(tree: Path) -> None:
    with pytest.raises(NarrowingError, match="does not exist"):
        narrow(_ceiling(tree), Narrowing(allow_read=(str(tree / "nope"),)))


def test_everywhere_minus_denied(tree: Path) -> None:
    ceiling = _ceiling(tree, filesystem_config={"mode": "read_only"})
    denied = [str(tree / "secret")]
    cell = narrow(ceiling, Narrowing(allow_read=(str(tree / "other"),)), denied=denied)
    assert cell.filesystem_config.readable_paths == [str(tree / "other")]
    for inside_or_holding in (tree / "secret", tree):
        with pytest.raises(NarrowingError, match="never lets a sandbox read"):
            narrow(ceiling, Narrowing(allow_read=(str(inside_or_holding),)), denied=denied)
    with pytest.raises(NarrowingError, match="outside what the session policy lets a sandbox w"):
        narrow(ceiling, Narrowing(allow_write=(str(tree / "other"),)), denied=denied)


def test_gated_roots_stay_gated(tree: Path) -> None:
    (tree / "gated_write" / "inner").mkdir()
    policy_file = tree / "policy.yaml"
    policy_file.write_text(
        "paths:\n"
        "  docs: {root: ro, mode: ro}\n"
        "  inbox: {root: gated_read, mode: ro, read_approval: true}\n"
        "  notes: {root: gated_write, mode: rw, write_approval: true}\n"
        "  scratch: {root: rw, mode: rw, write_approval: false}\n"
    )
    ceiling = CapabilityParser.from_file(policy_file)  # relative roots: next to the file
    cell = narrow(ceiling, Narrowing(
        allow_read=(str(tree / "gated_read"), str(tree / "ro")),
        allow_write=(str(tree / "gated_write" / "inner"), str(tree / "rw")),
    ), cwd="/")
    assert cell.filesystem_config.writable_paths == [str(tree / "rw")]
    assert cell.filesystem_config.readable_paths == [str(tree / "ro")]
    assert cell.paths is not None and set(cell.paths) == {"inbox", "notes"}
    assert cell.paths["inbox"].read_approval and cell.paths["inbox"].mode == "ro"
    notes = cell.paths["notes"]
    assert notes.write_approval and notes.mode == "rw"
    assert notes.root == str(tree / "gated_write" / "inner")
    with pytest.raises(NarrowingError, match="read-only root"):
        narrow(ceiling, Narrowing(allow_write=(str(tree / "ro"),)))


def test_a_narrowed_policy_is_a_valid_policy(tree: Path) -> None:
    cell = narrow(_ceiling(tree), Narrowing(max_memory_mb=32, allow_net=("api.example.com",),
                                            allow_write=(str(tree / "rw"),)))
    again = CapabilityDeclaration.model_validate(cell.model_dump())
    assert again.model_dump() == cell.model_dump()  # the rate windows it is charged to are
    assert again != cell  # a link to the session's rules, made by narrowing, never by a file
    assert os.path.isabs(cell.filesystem_config.writable_paths[0])


def test_nested_paths_in_one_gated_root(tree: Path) -> None:
    (tree / "gated_write" / "a").mkdir()
    (tree / "gated_write" / "a" / "b").mkdir()
    ceiling = _ceiling(tree, paths={"notes": {"root": str(tree / "gated_write"), "mode": "rw",
                                              "read_approval": True}})
    outer, inner = str(tree / "gated_write" / "a"), str(tree / "gated_write" / "a" / "b")
    cell = narrow(ceiling, Narrowing(allow_write=(inner, outer), allow_read=(inner,)))
    assert cell.paths is not None and {n: c.root for n, c in cell.paths.items()} == {"notes": outer}
    with pytest.raises(NarrowingError, match="holds allow_write"):
        narrow(ceiling, Narrowing(allow_write=(inner,), allow_read=(outer,)))
    sibling = tree / "gated_write" / "c"
    sibling.mkdir()
    two = narrow(ceiling, Narrowing(allow_write=(inner,), allow_read=(str(sibling),)))
    assert two.paths is not None and {n: c.mode for n, c in two.paths.items()} == {
        "notes": "rw", "notes-2": "ro"}


def test_narrowed_rules_keep_only_the_private_ranges_every_covering_rule_names() -> None:
    from sandbox_kernel_ext.policy.models import NetworkEgressRule
    from sandbox_kernel_ext.policy.narrowing import narrow_network

    rules = [
        NetworkEgressRule(domain="localhost", ports=[8000], private_networks=["127.0.0.0/8"]),
        NetworkEgressRule(domain="*.corp.test", private_networks=["10.0.0.0/8", "127.0.0.0/8"]),
        NetworkEgressRule(domain="api.corp.test", private_networks=["10.0.0.0/8"]),
    ]
    local, api = narrow_network(rules, ["localhost:8000", "api.corp.test"])
    assert local.private_networks == ["127.0.0.0/8"]
    assert api.private_networks == ["10.0.0.0/8"]  # 127/8 is named by only one of the two


# -- found in review: narrowing that widened ----------------------------------------------------

def test_a_folder_holding_a_gated_root_is_refused_under_read_everywhere(tree: Path) -> None:
    """Naming the folder around a read-approval root gave a plain read of everything in it:
    the narrowed policy had no path table left to gate it."""
    ceiling = _ceiling(tree, filesystem_config={"mode": "read_only"},
                       paths={"inbox": {"root": str(tree / "gated_read"), "mode": "ro",
                                        "read_approval": True}})
    with pytest.raises(NarrowingError, match="approval-gated") as caught:
        narrow(ceiling, Narrowing(allow_read=(str(tree),)))
    assert caught.value.field == "allow_read" and str(tree / "gated_read") in str(caught.value)
    beside = narrow(ceiling, Narrowing(allow_read=(str(tree / "other"),)))
    assert beside.filesystem_config.readable_paths == [str(tree / "other")]
    kept = narrow(ceiling, Narrowing(allow_read=(str(tree / "gated_read"),)))
    assert kept.paths is not None and kept.paths["inbox"].read_approval


def _charge(rules: list, host: str, times: int) -> list[bool]:
    from sandbox_kernel_ext.policy.egress import EgressFilter, RateLimiter

    egress = EgressFilter(rules, limiter=RateLimiter())
    return [egress.acquire_authority(host, 443).allowed for _ in range(times)]


def test_a_wildcard_keeps_the_stricter_rules_for_hosts_under_it() -> None:
    """`--allow-net '*.zone'` dropped the session's own rule for `h.zone`, so that host got
    the wildcard's private ranges and rate instead of its own."""
    from sandbox_kernel_ext.policy.egress import EgressFilter
    from sandbox_kernel_ext.policy.models import NetworkEgressRule
    from sandbox_kernel_ext.policy.narrowing import narrow_network

    ceiling = [
        NetworkEgressRule(domain="*.example.test", rate_limit_per_min=100,
                          private_networks=["127.0.0.1/32"]),
        NetworkEgressRule(domain="h.example.test", rate_limit_per_min=3),
    ]
    cell = narrow_network(ceiling, ["*.example.test:443"])
    decided = EgressFilter(cell).decide_authority("h.example.test", 443)
    assert decided.allowed and decided.rule is not None
    assert decided.rule.private_networks == [] and decided.rule.rate_limit_per_min == 3
    assert _charge(cell, "h.example.test", 4) == [True, True, True, False]
    other = EgressFilter(cell).decide_authority("x.example.test", 443)
    assert other.rule is not None and other.rule.private_networks == ["127.0.0.1/32"]


def test_a_narrowed_destination_is_charged_as_the_session_rules_that_cover_it() -> None:
    """Each narrowed destination had a rate window of its own, so naming hosts one by one
    (or in a later cell) multiplied the session's rate."""
    from sandbox_kernel_ext.policy.egress import EgressFilter, RateLimiter
    from sandbox_kernel_ext.policy.models import NetworkEgressRule
    from sandbox_kernel_ext.policy.narrowing import narrow_network

    ceiling = [NetworkEgressRule(domain="*.example.test", rate_limit_per_min=3)]
    limiter = RateLimiter()  # one per session, shared by all its sandboxes
    session = EgressFilter(ceiling, limiter=limiter)
    cells = [EgressFilter(narrow_network(ceiling, [f"h{i}.example.test"]), limiter=limiter)
             for i in range(4)]
    assert session.acquire_authority("h9.example.test", 443).allowed
    verdicts = [cell.acquire_authority(f"h{i}.example.test", 443) for i, cell in enumerate(cells)]
    assert [v.allowed for v in verdicts] == [True, True, False, False]
    assert "rate limit 3/min for *.example.test reached" in verdicts[2].reason
