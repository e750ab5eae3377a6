from __future__ import annotations

import threading
import time

import pytest
from pydantic import ValidationError

from sandbox_kernel_ext.policy.egress import (
    EgressFilter,
    MalformedTargetError,
    RateLimiter,
    check_egress,
    normalize_host,
    parse_authority,
)
from sandbox_kernel_ext.policy.models import NetworkEgressRule


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


OPENAI = NetworkEgressRule(domain="api.openai.com", ports=[443], rate_limit_per_min=30)
ANTHROPIC = NetworkEgressRule(domain="*.anthropic.com")
RULES = [OPENAI, ANTHROPIC]


@pytest.fixture
def egress() -> EgressFilter:
    return EgressFilter(RULES)


def test_seed_example() -> None:
    rules = [NetworkEgressRule(domain="api.openai.com", ports=[443])]
    assert check_egress("https://api.openai.com/v1/chat", rules) is True
    assert check_egress("https://malicious.io/steal", rules) is False


def test_empty_rules_deny_everything() -> None:
    decision = EgressFilter([]).decide("https://api.openai.com/")
    assert not decision.allowed
    assert "allowlist is empty" in decision.reason
    assert check_egress("https://api.openai.com/", []) is False


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://a.anthropic.com/", True),
        ("https://a.b.anthropic.com/x", True),
        ("https://anthropic.com/", False),
        ("https://badanthropic.com/", False),
        ("https://anthropic.com.evil.com/", False),
        ("https://evil.com/a.anthropic.com", False),
        ("https://A.Anthropic.COM./", True),
    ],
)
def test_wildcard_matches_strict_subdomains_only(
    egress: EgressFilter, url: str, allowed: bool
) -> None:
    assert egress.is_allowed(url) is allowed


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://api.openai.com/v1/chat/completions", True),
        ("https://API.OPENAI.COM/v1", True),
        ("https://api.openai.com./v1", True),
        ("https://x.api.openai.com/", False),
        ("https://openai.com/", False),
        ("https://api.openai.com.evil.com/", False),
    ],
)
def test_exact_domain_matches_only_itself(egress: EgressFilter, url: str, allowed: bool) -> None:
    assert egress.is_allowed(url) is allowed


def test_wildcard_over_ip_digits_is_refused_and_wildcards_never_match_ips() -> None:
    with pytest.raises(ValidationError, match="must be a host name"):
        NetworkEgressRule(domain="*.0.0.1")
    egress = EgressFilter([NetworkEgressRule(domain="*.example.com")])
    assert not egress.is_allowed("http://127.0.0.1/")
    assert not egress.is_allowed("http://[::1]/")


@pytest.mark.parametrize(
    ("rule_domain", "url", "allowed"),
    [
        ("10.0.0.5", "http://10.0.0.5/", True),
        ("10.0.0.5", "http://10.0.0.6/", False),
        ("127.0.0.1", "http://2130706433/", True),
        ("127.0.0.1", "http://0x7f.1/", True),
        ("127.0.0.1", "http://127.1/", True),
        ("::1", "http://[::1]/", True),
        ("::1", "http://[0:0:0:0:0:0:0:1]:8080/", True),
        ("[2001:DB8::1]", "http://[2001:db8:0::1]/", True),
        ("2001:db8::1", "http://[2001:db8::2]/", False),
        ("10.0.0.5", "http://10.0.0.5.evil.com/", False),
    ],
)
def test_ip_literal_rules(rule_domain: str, url: str, allowed: bool) -> None:
    assert check_egress(url, [NetworkEgressRule(domain=rule_domain)]) is allowed


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://api.openai.com/", True),
        ("https://api.openai.com:443/", True),
        ("http://api.openai.com/", False),
        ("https://api.openai.com:8443/", False),
        ("wss://api.openai.com/", True),
        ("ws://api.openai.com/", False),
        ("ws://api.openai.com:443/", True),
        ("https://api.openai.com:/", True),
    ],
)
def test_ports_and_scheme_defaults(egress: EgressFilter, url: str, allowed: bool) -> None:
    assert egress.is_allowed(url) is allowed


def test_empty_ports_allow_any_port(egress: EgressFilter) -> None:
    assert egress.is_allowed("http://x.anthropic.com:8080/")
    assert egress.is_allowed("http://x.anthropic.com:1/")
    assert egress.is_allowed("https://x.anthropic.com:65535/")


def test_unknown_scheme_needs_explicit_port(egress: EgressFilter) -> None:
    decision = egress.decide("ftp://x.anthropic.com/file")
    assert not decision.allowed
    assert "no default port" in decision.reason
    assert egress.is_allowed("ftp://x.anthropic.com:21/file")


def test_userinfo_is_not_the_host(egress: EgressFilter) -> None:
    decision = egress.decide("http://api.openai.com@evil.com/")
    assert not decision.allowed
    assert decision.host == "evil.com"
    assert decision.reason.startswith("domain evil.com is not in the allowlist")
    assert not egress.is_allowed("https://api.openai.com:443@evil.com/")
    assert not egress.is_allowed("https://a@b@evil.com/")
    assert egress.is_allowed("https://user:secret@api.openai.com/")


@pytest.mark.parametrize(
    "url",
    [
        "api.openai.com",
        "api.openai.com:443",
        "//api.openai.com/",
        "https:/api.openai.com/",
        "https://",
        "https:///path",
        "https://@/",
        "https://:443/",
        "https://api.openai.com:0/",
        "https://api.openai.com:65536/",
        "https://api.openai.com:-1/",
        "https://api.openai.com:4a3/",
        "https://api.openai.com:443:443/",
        "https://api.openai.com:\u0664\u0664\u0663/",
        "https://api .openai.com/",
        "https://api.openai.com /",
        " https://api.openai.com/",
        "https://api.openai.com/\n",
        "https://api.openai.com\t/",
        "https://api.openai.com\x00.evil.com/",
        "https://api.openai\u200b.com/",
        "http://evil.com\\@api.openai.com/",
        "https://%61pi.openai.com/",
        "https://*.anthropic.com/",
        "https://[::1/",
        "https://[api.openai.com]/",
        "https://1.2.3.4.5/",
        "https://1.2.3.999/",
        "",
    ],
)
def test_malformed_urls_are_denied(egress: EgressFilter, url: str) -> None:
    decision = egress.decide(url)
    assert not decision.allowed
    assert decision.rule is None
    assert decision.reason.startswith("malformed URL")
    assert check_egress(url, RULES) is False


@pytest.mark.parametrize("url", [None, 443, b"https://api.openai.com/"])
def test_non_string_urls_are_denied(egress: EgressFilter, url: object) -> None:
    decision = egress.decide(url)  # type: ignore[arg-type]
    assert not decision.allowed and decision.reason.startswith("malformed URL")


def test_fragment_and_query_cannot_smuggle_a_host(egress: EgressFilter) -> None:
    assert egress.decide("https://evil.com#@api.openai.com/").host == "evil.com"
    assert egress.decide("https://evil.com?@api.openai.com/").host == "evil.com"
    assert not egress.is_allowed("https://evil.com#@api.openai.com/")


def test_international_names_compare_as_punycode() -> None:
    rules = [NetworkEgressRule(domain="xn--bcher-kva.example")]
    assert check_egress("https://bücher.example/", rules)
    # Cyrillic 'а' is not Latin 'a'.
    assert not check_egress("https://\u0430pi.openai.com/", [OPENAI])


def test_denial_reasons_are_specific(egress: EgressFilter) -> None:
    assert egress.decide("https://evil.com/").reason == (
        "domain evil.com is not in the allowlist (allowed: api.openai.com:443, *.anthropic.com)"
    )
    assert egress.decide("https://api.openai.com:8080/").reason == (
        "port 8080 not allowed for api.openai.com (allowed: 443)"
    )
    assert egress.decide("https://10.1.2.3/").reason.startswith("address 10.1.2.3 is not")
    assert egress.decide("https://[::1]/").reason.startswith("address [::1] is not")


def test_allowed_decision_carries_rule_host_and_port(egress: EgressFilter) -> None:
    decision = egress.decide("https://API.openai.com/v1")
    assert decision.allowed
    assert decision.rule is OPENAI
    assert (decision.host, decision.port) == ("api.openai.com", 443)
    assert decision.reason == "allowed by rule api.openai.com:443"


def test_most_specific_rule_wins() -> None:
    wildcard = NetworkEgressRule(domain="*.example.com")
    deeper = NetworkEgressRule(domain="*.api.example.com")
    exact = NetworkEgressRule(domain="v1.api.example.com", ports=[443])
    egress = EgressFilter([wildcard, deeper, exact])
    assert egress.decide("https://v1.api.example.com/").rule is exact
    assert egress.decide("https://v2.api.example.com/").rule is deeper
    assert egress.decide("https://www.example.com/").rule is wildcard
    # The exact rule's port list does not hide the wildcard's "any port".
    assert egress.decide("http://v1.api.example.com:8080/").rule is deeper


def test_port_union_across_matching_rules() -> None:
    egress = EgressFilter(
        [
            NetworkEgressRule(domain="*.example.com", ports=[443]),
            NetworkEgressRule(domain="api.example.com", ports=[80, 8443]),
        ]
    )
    assert egress.is_allowed("http://api.example.com/")
    assert egress.is_allowed("https://api.example.com/")
    assert egress.decide("https://api.example.com:22/").reason == (
        "port 22 not allowed for api.example.com (allowed: 80, 443, 8443)"
    )


def test_rules_for_domain(egress: EgressFilter) -> None:
    assert egress.rules_for_domain("API.openai.com.") == [OPENAI]
    assert egress.rules_for_domain("x.y.anthropic.com") == [ANTHROPIC]
    assert egress.rules_for_domain("anthropic.com") == []
    assert egress.rules_for_domain("not a host") == []


def test_filter_accepts_rule_dicts() -> None:
    rule = {"domain": "API.Example.com", "ports": [443]}
    egress = EgressFilter([rule])  # type: ignore[list-item]
    assert egress.is_allowed("https://api.example.com/")


# --- authority form (proxy CONNECT targets) -----------------------------------------------


@pytest.mark.parametrize(
    ("host", "port", "allowed"),
    [
        ("api.openai.com", 443, True),
        ("API.OPENAI.COM.", 443, True),
        ("api.openai.com", 80, False),
        ("x.anthropic.com", 8080, True),
        ("anthropic.com", 443, False),
    ],
)
def test_decide_authority(egress: EgressFilter, host: str, port: int, allowed: bool) -> None:
    assert egress.decide_authority(host, port).allowed is allowed


@pytest.mark.parametrize(
    ("host", "port"),
    [("", 443), ("api.openai.com", 0), ("api.openai.com", 70000), ("api.openai.com", "443"),
     ("api.openai.com", True), ("api.openai.com:443", 443), ("a b.com", 443), ("[::1", 443)],
)  # fmt: skip
def test_decide_authority_rejects_malformed(egress: EgressFilter, host: str, port: object) -> None:
    decision = egress.decide_authority(host, port)  # type: ignore[arg-type]
    assert not decision.allowed
    assert decision.reason.startswith("malformed destination")


def test_ipv6_authority_with_or_without_brackets() -> None:
    egress = EgressFilter([NetworkEgressRule(domain="2001:db8::1", ports=[443])])
    assert egress.decide_authority("[2001:DB8::1]", 443).allowed
    assert egress.decide_authority("2001:db8:0::1", 443).allowed


def test_parse_authority() -> None:
    assert parse_authority("API.openai.com:443") == ("api.openai.com", 443)
    assert parse_authority("user:pw@[::1]:8080") == ("::1", 8080)
    assert parse_authority("example.com") == ("example.com", None)
    for bad in ["", ":443", "[::1]x", "a.com:1:2", "a.com:99999"]:
        with pytest.raises(MalformedTargetError):
            parse_authority(bad)


def test_normalize_host() -> None:
    assert normalize_host("Example.COM.") == "example.com"
    assert normalize_host("[0::1]") == "::1"
    assert normalize_host("017.0.0.1") == "15.0.0.1"  # octal, as inet_aton and browsers read it
    for bad in ["", ".", "a..b", "-a.com", "a_b c", "x" * 64 + ".com", "256.1.1.1"]:
        with pytest.raises(MalformedTargetError):
            normalize_host(bad)


# --- rate limiting --------------------------------------------------------------------------


def test_rate_limit_trips_at_exactly_the_limit_and_recovers() -> None:
    clock = FakeClock()
    rule = NetworkEgressRule(domain="*.example.com", rate_limit_per_min=30)
    egress = EgressFilter([rule], clock=clock)
    for second in range(30):
        clock.now = 1000.0 + second
        assert egress.acquire("https://a.example.com/").allowed, second
    clock.now = 1030.0
    denied = egress.acquire("https://b.example.com/")
    assert not denied.allowed
    assert denied.reason == "rate limit 30/min for *.example.com reached"
    assert denied.rule is rule
    assert denied.retry_after == pytest.approx(30.0)
    # The first hit (t=1000) leaves the window at t=1060, freeing exactly one slot.
    clock.now = 1059.999
    assert not egress.acquire("https://a.example.com/").allowed
    clock.now = 1060.0
    assert egress.acquire("https://a.example.com/").allowed
    assert not egress.acquire("https://a.example.com/").allowed
    clock.now = 1200.0
    assert all(egress.acquire("https://a.example.com/").allowed for _ in range(30))
    assert not egress.acquire("https://a.example.com/").allowed


def test_decide_and_is_allowed_do_not_count() -> None:
    egress = EgressFilter(
        [NetworkEgressRule(domain="a.com", rate_limit_per_min=1)], clock=FakeClock()
    )
    for _ in range(5):
        assert egress.is_allowed("https://a.com/")
        assert egress.decide("https://a.com/").allowed
    assert egress.acquire("https://a.com/").allowed
    assert not egress.acquire("https://a.com/").allowed
    assert egress.is_allowed("https://a.com/")  # still within policy, just not now


def test_limits_are_per_rule() -> None:
    clock = FakeClock()
    egress = EgressFilter(
        [
            NetworkEgressRule(domain="a.com", rate_limit_per_min=2),
            NetworkEgressRule(domain="b.com", rate_limit_per_min=1),
        ],
        clock=clock,
    )
    assert egress.acquire("https://a.com/").allowed
    assert egress.acquire_authority("a.com", 443).allowed
    assert not egress.acquire("https://a.com/").allowed
    assert egress.acquire("https://b.com/").allowed
    assert not egress.acquire_authority("b.com", 8443).allowed


def test_denied_requests_are_not_counted() -> None:
    egress = EgressFilter(
        [NetworkEgressRule(domain="a.com", ports=[443], rate_limit_per_min=1)], clock=FakeClock()
    )
    for url in ["http://a.com/", "https://b.com/", "not a url"]:
        assert not egress.acquire(url).allowed
    assert egress.acquire("https://a.com/").allowed


def test_rate_limiter_directly() -> None:
    clock = FakeClock(0.0)
    limiter = RateLimiter(window=10.0, clock=clock)
    assert limiter.try_acquire("k", 2) == (True, 0.0)
    clock.now = 4.0
    assert limiter.try_acquire("k", 2) == (True, 0.0)
    assert limiter.try_acquire("k", 2) == (False, 6.0)
    assert limiter.try_acquire("other", 2)[0]
    clock.now = 10.0
    assert limiter.try_acquire("k", 2)[0]


class SlowClock:
    """A clock that notices being read by two threads at once.

    The limiter must read the clock and update its log in one critical section, or
    timestamps land out of order and the sliding window miscounts.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._inside = 0
        self.max_inside = 0

    def __call__(self) -> float:
        with self._guard:
            self._inside += 1
            self.max_inside = max(self.max_inside, self._inside)
        time.sleep(0.0002)
        with self._guard:
            self._inside -= 1
        return 1000.0


def test_rate_limiter_is_thread_safe() -> None:
    limit, threads_count, attempts_each = 40, 8, 10
    clock = SlowClock()
    egress = EgressFilter(
        [NetworkEgressRule(domain="a.com", rate_limit_per_min=limit)], clock=clock
    )
    allowed: list[bool] = []
    allowed_lock = threading.Lock()
    start = threading.Barrier(threads_count)

    def worker() -> None:
        start.wait()
        results = [egress.acquire("https://a.com/").allowed for _ in range(attempts_each)]
        with allowed_lock:
            allowed.extend(results)

    threads = [threading.Thread(target=worker) for _ in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(allowed) == threads_count * attempts_each
    assert sum(allowed) == limit
    assert clock.max_inside == 1


# --- private_networks: the address ranges a rule lets the egress proxy connect to ------------


def test_private_networks_default_to_none_and_are_canonical() -> None:
    assert NetworkEgressRule(domain="a.com").private_networks == []
    rule = NetworkEgressRule(
        domain="a.com", private_networks=["127.0.0.1", " 10.1.2.3/8", "FD00::1/8", "::1"]
    )
    assert rule.private_networks == ["127.0.0.1/32", "10.0.0.0/8", "fd00::/8", "::1/128"]


@pytest.mark.parametrize("bad", ["localhost", "10.0.0.0/33", "10.0.0.0/8/8", "", "*.x.com", "::g"])
def test_bad_private_networks_name_the_value(bad: str) -> None:
    with pytest.raises(ValidationError, match="private_networks entry") as info:
        NetworkEgressRule(domain="a.com", private_networks=["10.0.0.0/8", bad])
    assert repr(bad) in str(info.value)
    assert info.value.errors()[0]["loc"] == ("private_networks", 1)


def test_bad_private_networks_in_a_policy_file_name_line_and_field() -> None:
    from sandbox_kernel_ext.policy.errors import CapabilityParseError
    from sandbox_kernel_ext.policy.parser import CapabilityParser

    text = (
        "network_egress_rules:\n"
        "  - domain: db.internal\n"
        "    private_networks: [10.0.0.0/8, 10.0.0.0/40]\n"
    )
    with pytest.raises(CapabilityParseError) as info:
        CapabilityParser.from_string(text)
    message = str(info.value)
    assert "line 3" in message
    assert "network_egress_rules[0].private_networks[1]" in message
    assert "'10.0.0.0/40' is not an IP network" in message
    ok = CapabilityParser.from_string(text.replace("/40", "/16"))
    assert ok.network_egress_rules[0].private_networks == ["10.0.0.0/8", "10.0.0.0/16"]


def test_policy_files_cannot_reach_the_proxys_resolver_hook() -> None:
    """The egress proxy's resolver is a constructor argument for tests; a policy that tries
    to set one (or any unknown field) is refused."""
    for extra in ("resolver", "hosts", "dns"):
        with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
            NetworkEgressRule.model_validate({"domain": "a.com", extra: {"a.com": "127.0.0.1"}})


def test_private_networks_do_not_change_which_names_match() -> None:
    rule = NetworkEgressRule(domain="*.internal.test", private_networks=["10.0.0.0/8"])
    egress = EgressFilter([rule])
    assert egress.is_allowed("http://db.internal.test/")
    assert not egress.is_allowed("http://10.1.2.3/")  # a range is not an allowlisted host
