"""Which outbound destinations a sandbox may reach, and how often (aumai-sandbox's EgressFilter).

This is the decision logic only; the runner's proxy enforces it. Parsing is strict on
purpose: any URL we are not sure how a client would read is denied rather than guessed
at, and hosts are compared in one canonical form (lower-case ASCII, no trailing dot,
IP literals in `ipaddress`/`inet_aton` canonical text) so that spelling tricks such as
`http://API.openai.com.`, `http://2130706433/` or `http://api.openai.com@evil.com/`
are judged by the host a client would actually connect to.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
import time
import unicodedata
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from .models import NetworkEgressRule

__all__ = [
    "DEFAULT_PORTS",
    "EgressDecision",
    "EgressFilter",
    "MalformedTargetError",
    "RateLimiter",
    "check_egress",
    "normalize_host",
    "parse_authority",
    "parse_url",
]

DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
RATE_WINDOW_SECONDS = 60.0

_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)(?:[/?#].*)?\Z", re.DOTALL)
_PORT = re.compile(r"[0-9]{1,5}\Z")
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)\Z")
# WHATWG URL parsing reads a host whose last label is a number as IPv4, in any
# inet_aton spelling (2130706433, 0x7f.1, 127.1); so must we.
_NUMBER = re.compile(r"(0x[0-9a-f]*|[0-9]+)\Z")
_SHOWN_URL_CHARS = 120


class MalformedTargetError(ValueError):
    """A URL or host/port that does not name exactly one destination."""


@dataclass(frozen=True)
class EgressDecision:
    """The answer for one request, with a reason a person can act on.

    `host` and `port` are the canonical destination (None when the target was
    malformed); `rule` is the rule that matched, also on a rate-limit denial;
    `retry_after` is the seconds until the rate limit frees a slot.
    """

    allowed: bool
    reason: str
    rule: NetworkEgressRule | None = None
    host: str | None = None
    port: int | None = None
    retry_after: float | None = None


def normalize_host(host: str) -> str:
    """The canonical form of a host: lower-case ASCII name, or canonical IP text."""
    if not isinstance(host, str):
        raise MalformedTargetError("host must be a string")
    if host.startswith("[") or host.endswith("]"):
        if not (host.startswith("[") and host.endswith("]")):
            raise MalformedTargetError(f"unbalanced brackets in host {host!r}")
        return _ipv6(host[1:-1])
    if ":" in host:
        return _ipv6(host)
    if _has_unsafe_character(host):
        raise MalformedTargetError(f"host {host!r} contains spaces or control characters")
    try:
        name = host if host.isascii() else host.encode("idna").decode("ascii")
    except UnicodeError:
        raise MalformedTargetError(f"host {host!r} is not a valid international name") from None
    name = name.lower()
    name = name[:-1] if name.endswith(".") else name
    if not name:
        raise MalformedTargetError("empty host")
    labels = name.split(".")
    if _NUMBER.match(labels[-1]):
        try:
            return socket.inet_ntoa(socket.inet_aton(name))
        except OSError:
            raise MalformedTargetError(f"host {host!r} is not a valid IPv4 address") from None
    if len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise MalformedTargetError(f"host {host!r} is not a valid host name")
    return name


def _ipv6(text: str) -> str:
    try:
        return str(ipaddress.IPv6Address(text))
    except ValueError:
        raise MalformedTargetError(
            f"host {text!r} is not a host name and not a valid IPv6 address"
        ) from None


def _has_unsafe_character(text: str) -> bool:
    return any(
        char <= " " or char == "\\" or char.isspace() or unicodedata.category(char) in ("Cc", "Cf")
        for char in text
    )


def _check_port(port: Any) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise MalformedTargetError(f"port {port!r} is not a number from 1 to 65535")
    return port


def parse_authority(authority: str) -> tuple[str, int | None]:
    """Split `[userinfo@]host[:port]` into the canonical host and the port (None if absent).

    The host is what follows the LAST '@', as every client reads it.
    """
    _, _, host_port = authority.rpartition("@")
    if host_port.startswith("["):
        end = host_port.find("]") + 1
        if not end:
            raise MalformedTargetError(f"unbalanced brackets in {authority!r}")
        host, rest = host_port[:end], host_port[end:]
        if rest and not rest.startswith(":"):
            raise MalformedTargetError(f"unexpected text after IPv6 address in {authority!r}")
        port_text = rest[1:] if rest else ""
    else:
        host, _, port_text = host_port.partition(":")
        if ":" in port_text:
            raise MalformedTargetError(f"too many ':' in {authority!r}")
    if not host:
        raise MalformedTargetError("empty host")
    if not port_text:  # RFC 3986 allows `host:` to mean the default port
        return normalize_host(host), None
    if not _PORT.match(port_text):
        raise MalformedTargetError(f"port {port_text!r} is not a number from 1 to 65535")
    return normalize_host(host), _check_port(int(port_text))


def parse_url(url: str) -> tuple[str, str, int | None]:
    """`(scheme, canonical host, explicit port or None)` of an absolute URL."""
    if not isinstance(url, str):
        raise MalformedTargetError("URL must be a string")
    if _has_unsafe_character(url):
        raise MalformedTargetError("contains spaces, backslashes or control characters")
    match = _URL.match(url)
    if not match:
        raise MalformedTargetError("expected scheme://host[:port][/path]")
    host, port = parse_authority(match.group(2))
    return match.group(1).lower(), host, port


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _domain_specificity(pattern: str, host: str) -> int | None:
    """How closely `pattern` matches canonical `host`: None for no match, higher = closer.

    `*.example.com` matches strict subdomains only, never `example.com` itself,
    `badexample.com`, or an IP address.
    """
    if pattern == host:
        return 1_000
    if pattern.startswith("*.") and host.endswith(pattern[1:]) and not _is_ip(host):
        return len(pattern)
    return None


def _shown_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _describe_rule(rule: NetworkEgressRule) -> str:
    ports = "/".join(str(port) for port in rule.ports)
    return _shown_host(rule.domain) + (f":{ports}" if ports else "")


class RateLimiter:
    """At most `limit` acquisitions per key in any `window` seconds (a sliding log).

    A sliding log is exact where a token bucket would let a burst of up to twice the
    limit through at a window edge. Thread-safe; the clock is injectable for tests.
    """

    def __init__(
        self,
        *,
        window: float = RATE_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._hits: dict[Hashable, deque[float]] = {}

    def try_acquire(self, key: Hashable, limit: int) -> tuple[bool, float]:
        """Count one use of `key` if under `limit`: `(acquired, seconds until a slot frees)`."""
        acquired, wait, _ = self.try_acquire_all([(key, limit)])
        return acquired, wait

    def try_acquire_all(
        self, windows: Iterable[tuple[Hashable, int]]
    ) -> tuple[bool, float, tuple[Hashable, int] | None]:
        """Count one use in every `(key, limit)` window, or in none if any is full:
        `(acquired, seconds until every one has a slot, the first full window)`."""
        with self._lock:
            now = self._clock()
            logs, wait, full = [], 0.0, None
            for key, limit in windows:
                hits = self._hits.setdefault(key, deque())
                while hits and hits[0] <= now - self._window:
                    hits.popleft()
                if len(hits) >= limit:
                    wait = max(wait, hits[len(hits) - limit] + self._window - now)
                    full = full or (key, limit)
                logs.append(hits)
            if full is not None:
                return False, wait, full
            for hits in logs:
                hits.append(now)
            return True, 0.0, None


class EgressFilter:
    """An allowlist of destinations with per-rule rate limits. No rules = deny everything.

    When several rules match, the most specific wins (exact host over wildcard, longer
    wildcard over shorter, then the earlier rule), and its rate limit is the one charged.
    A rule's window is kept by its destination (domain and ports; a narrowed rule is charged
    to the windows of the session rules it came from), so filters sharing one `limiter`
    (every sandbox of a session) share them: a new sandbox is no fresh allowance.
    """

    def __init__(
        self,
        rules: Iterable[NetworkEgressRule],
        *,
        clock: Callable[[], float] = time.monotonic,
        limiter: RateLimiter | None = None,
    ) -> None:
        self._rules = tuple(
            rule if isinstance(rule, NetworkEgressRule) else NetworkEgressRule.model_validate(rule)
            for rule in rules
        )
        self._limiter = limiter if limiter is not None else RateLimiter(clock=clock)

    @property
    def rules(self) -> tuple[NetworkEgressRule, ...]:
        return self._rules

    def is_allowed(self, url: str) -> bool:
        """Whether `url` is allowed; does not count against rate limits."""
        return self.decide(url).allowed

    def rules_for_domain(self, hostname: str) -> list[NetworkEgressRule]:
        """Rules whose domain pattern matches `hostname`, in declaration order."""
        try:
            host = normalize_host(hostname)
        except MalformedTargetError:
            return []
        return [rule for rule in self._rules if _domain_specificity(rule.domain, host) is not None]

    def decide(self, url: str) -> EgressDecision:
        """Allow or deny a full URL, without counting it against rate limits."""
        try:
            scheme, host, port = parse_url(url)
        except MalformedTargetError as exc:
            shown = repr(url)
            if len(shown) > _SHOWN_URL_CHARS:
                shown = shown[:_SHOWN_URL_CHARS] + "..."
            return EgressDecision(False, f"malformed URL {shown}: {exc}")
        if port is None:
            port = DEFAULT_PORTS.get(scheme)
            if port is None:
                return EgressDecision(
                    False,
                    f"URL scheme {scheme!r} has no default port; give the port explicitly",
                    host=host,
                )
        return self.decide_authority(host, port)

    def decide_authority(self, host: str, port: int) -> EgressDecision:
        """Allow or deny a `host:port` destination, e.g. a proxy's CONNECT target."""
        try:
            host = normalize_host(host)
            port = _check_port(port)
        except MalformedTargetError as exc:
            return EgressDecision(False, f"malformed destination {host!r} port {port!r}: {exc}")
        shown = _shown_host(host)
        matches = self._ranked_matches(host)
        if not matches:
            kind = "address" if _is_ip(host) else "domain"
            allowed = ", ".join(map(_describe_rule, self._rules))
            allowed = allowed or "nothing; the allowlist is empty"
            reason = f"{kind} {shown} is not in the allowlist (allowed: {allowed})"
            return EgressDecision(False, reason, host=host, port=port)
        for rule in matches:
            if not rule.ports or port in rule.ports:
                reason = f"allowed by rule {_describe_rule(rule)}"
                return EgressDecision(True, reason, rule=rule, host=host, port=port)
        ports = ", ".join(str(p) for p in sorted({p for rule in matches for p in rule.ports}))
        reason = f"port {port} not allowed for {shown} (allowed: {ports})"
        return EgressDecision(False, reason, host=host, port=port)

    def _ranked_matches(self, host: str) -> list[NetworkEgressRule]:
        """Rules matching canonical `host`, most specific first, then in declaration order."""
        ranked = [
            (specificity, -index, rule)
            for index, rule in enumerate(self._rules)
            if (specificity := _domain_specificity(rule.domain, host)) is not None
        ]
        ranked.sort(key=lambda entry: entry[:2], reverse=True)
        return [rule for _, _, rule in ranked]

    def acquire(self, url: str) -> EgressDecision:
        """Decide a URL and, if allowed, count it against its rule's rate limit."""
        return self._charge(self.decide(url))

    def acquire_authority(self, host: str, port: int) -> EgressDecision:
        """Decide a `host:port` and, if allowed, count it against its rule's rate limit."""
        return self._charge(self.decide_authority(host, port))

    def _charge(self, decision: EgressDecision) -> EgressDecision:
        rule = decision.rule
        if not decision.allowed or rule is None:
            return decision
        acquired, retry_after, full = self._limiter.try_acquire_all(rule.rate_windows)
        if acquired:
            return decision
        assert full is not None
        (domain, _), per_minute = full
        limit = f"{per_minute}/min for {_shown_host(domain)}"
        return replace(
            decision, allowed=False, reason=f"rate limit {limit} reached", retry_after=retry_after
        )


def check_egress(url: str, rules: Iterable[NetworkEgressRule]) -> bool:
    """Whether `url` is allowed by `rules` (aumai-sandbox's helper; no rate limiting)."""
    return EgressFilter(rules).is_allowed(url)
