"""The policy models of aumai-sandbox, extended so one file describes everything.

A policy file is a `CapabilityDeclaration`: the seed's capability fields, plus the
filesystem-sandbox path table (`paths` or `root`) for the file toolset and `file_limits`.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from .credential_stores import check_store_entry
from .file_limits import FileLimits
from .path_config import PathConfig, RootSandboxConfig, SandboxConfig, check_root_names

RateWindow = tuple[tuple[str, tuple[int, ...]], int]  # ((domain, ports), limit per minute)
_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SandboxTier(str, enum.Enum):
    seccomp = "seccomp"
    gvisor = "gvisor"
    firecracker = "firecracker"


class FilesystemMode(str, enum.Enum):
    read_only = "read_only"
    read_write = "read_write"
    none = "none"


class SandboxStatus(str, enum.Enum):
    created = "created"
    running = "running"
    stopped = "stopped"
    failed = "failed"


def normalize_domain(value: str) -> str:
    """Lower-case a rule's domain and check its shape: a host name, `*.` + a host name,
    or an IP literal. Raises ValueError naming what is wrong."""
    domain = value.strip().lower().rstrip(".")
    if not domain:
        raise ValueError("domain must not be blank")
    try:
        return str(ipaddress.ip_address(domain.strip("[]")))
    except ValueError:
        pass
    host = domain[2:] if domain.startswith("*.") else domain
    labels = host.split(".")
    # A last label of digits is no host name: resolvers read `2130706433` or `01.2.3.4`
    # as (odd spellings of) IP addresses, which a rule would then never match.
    if "*" in host or labels[-1].isdigit() or not all(_LABEL.match(label) for label in labels):
        raise ValueError(
            f"domain {value!r} must be a host name like 'api.example.com', "
            "a wildcard like '*.example.com', or an IP address"
        )
    return domain


def normalize_network(value: str) -> str:
    """The canonical CIDR text of an address range (host bits dropped). Raises ValueError
    naming the value."""
    try:
        return str(ipaddress.ip_network(value.strip(), strict=False))
    except ValueError:
        raise ValueError(
            f"private_networks entry {value!r} is not an IP network in CIDR notation "
            "like '10.0.0.0/8', '127.0.0.1/32' or 'fd00::/8'"
        ) from None


class NetworkEgressRule(_Model):
    """One allow-listed destination: a domain (or `*.` wildcard) and its ports.

    `private_networks` lists the non-public address ranges (CIDR) this rule's names may
    resolve to; the egress proxy refuses loopback, private, link-local and other such
    addresses unless the matching rule names them there (or its domain is that address).
    """

    domain: str
    ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(default_factory=list)
    rate_limit_per_min: int = Field(60, ge=1)
    private_networks: list[Annotated[str, AfterValidator(normalize_network)]] = Field(
        default_factory=list
    )

    # Set by narrowing only, never from a file: the session rules' rate windows a narrowed
    # rule is charged to, so that naming a destination is never a fresh allowance.
    _charged_to: tuple[RateWindow, ...] = PrivateAttr(default=())

    @field_validator("domain")
    @classmethod
    def _domain(cls, value: str) -> str:
        return normalize_domain(value)

    @property
    def rate_windows(self) -> tuple[RateWindow, ...]:
        """The `((domain, ports), limit)` windows a request this rule allows counts against:
        its own, or for a narrowed rule those of the session rules that covered it."""
        own = ((self.domain, tuple(sorted(self.ports))), self.rate_limit_per_min)
        return self._charged_to or (own,)

    def charged_as(self, covering: Iterable[NetworkEgressRule]) -> NetworkEgressRule:
        """This rule, counted against every window of `covering` (what narrowing derives it
        from); returns itself."""
        self._charged_to = tuple(dict.fromkeys(w for rule in covering for w in rule.rate_windows))
        return self


def _store_list(value: Any) -> Any:
    """`never_read_paths` as a list, or why not (an empty key, `null`, is no stores)."""
    if value is None:
        return []
    if isinstance(value, (str, dict)) or not isinstance(value, (list, tuple)):
        kind = {str: "single string", dict: "mapping"}.get(type(value), type(value).__name__)
        raise ValueError(f"never_read_paths must be a list of paths, like "
                         f"[~/.config/acme/token, /srv/keys], not a {kind}")
    return value


_StoreEntry = Annotated[str, BeforeValidator(check_store_entry)]


class FilesystemConfig(_Model):
    """Host paths the sandboxed process may read and write.

    `readable_paths=None` keeps the seed's meaning (reads everywhere the mode allows;
    the runner still withholds credential stores). A list limits reads to those paths.
    `never_read_paths`: this policy's own credential stores, added to the built-in list for
    its sandboxes and its file toolset (an absolute path, or `~/` and a path for that path
    beneath every home folder); they win over `readable_paths` and `writable_paths`.
    """

    mode: FilesystemMode = FilesystemMode.read_only
    writable_paths: list[str] = Field(default_factory=list)
    readable_paths: list[str] | None = None
    never_read_paths: Annotated[list[_StoreEntry], BeforeValidator(_store_list)] = Field(
        default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> FilesystemConfig:
        if self.writable_paths and self.mode is not FilesystemMode.read_write:
            raise ValueError("writable_paths must be empty unless mode is read_write")
        if self.readable_paths and self.mode is FilesystemMode.none:
            raise ValueError("readable_paths must be empty when mode is none")
        for path in [*self.writable_paths, *(self.readable_paths or [])]:
            if not path.strip():
                raise ValueError("paths must not be blank")
        return self


class ResourceLimits(_Model):
    """Budgets of one sandbox. The first four are aumai-sandbox's; the rest bound what the
    runner enforces with rlimits and the monitor (processes in the tree, size of one
    written file, open descriptors per process, output kept in memory per stream)."""

    max_memory_mb: int = Field(512, ge=1)
    max_cpu_seconds: float = Field(30.0, gt=0)
    max_cost_usd: float = Field(0.10, gt=0)
    max_tokens: int = Field(100_000, ge=1)
    max_processes: int = Field(256, ge=1)
    max_file_size_mb: int = Field(1024, ge=1)
    max_open_files: int = Field(256, ge=16)
    max_output_mb: float = Field(8.0, gt=0)


class CapabilityDeclaration(_Model):
    """Everything a sandbox may do: the aumai-sandbox fields and the file toolset's table."""

    sandbox_tier: SandboxTier = SandboxTier.seccomp
    network_egress_rules: list[NetworkEgressRule] = Field(default_factory=list)
    filesystem_config: FilesystemConfig = Field(default_factory=FilesystemConfig)
    resource_limits: ResourceLimits = Field(default_factory=ResourceLimits)
    permissions: list[str] = Field(default_factory=list)
    env_allowlist: list[str] | None = None
    # Refuse to run where a confinement layer is missing, instead of warning and running.
    strict: bool = False
    # Extensions: the filesystem-sandbox path table for the file toolset, and its quotas.
    paths: dict[str, PathConfig] | None = None
    root: RootSandboxConfig | None = None
    file_limits: FileLimits = Field(default_factory=FileLimits)

    _base_path: Path | None = PrivateAttr(default=None)
    _source_file: Path | None = PrivateAttr(default=None)
    _paths_resolved: bool = PrivateAttr(default=False)
    _names = field_validator("paths")(check_root_names)

    @model_validator(mode="after")
    def _one_table(self) -> CapabilityDeclaration:
        if self.paths is not None and self.root is not None:
            raise ValueError("give at most one of 'root' or 'paths'")
        return self

    @property
    def base_path(self) -> Path:
        """Where relative roots resolve: the policy file's folder, else the cwd."""
        return self._base_path or Path.cwd()

    @property
    def source_file(self) -> Path | None:
        """The file this policy was read from (`CapabilityParser.from_file`), if any: it stays
        read-only inside the sandbox's writable folders."""
        return self._source_file

    @property
    def paths_resolved(self) -> bool:
        """Whether every path here was resolved and checked already (a cell's narrowing):
        one that resolves anywhere else when the sandbox is made is refused, not followed."""
        return self._paths_resolved

    def sandbox_config(self) -> SandboxConfig | None:
        """The filesystem-sandbox config this policy describes, or None when it has no path table."""
        if self.paths is None and self.root is None:
            return None
        return SandboxConfig(root=self.root, paths=self.paths)

    @classmethod
    def workspace_only(cls, workspace: str) -> CapabilityDeclaration:
        """The safest policy that is still useful, for a session with no policy file.

        No network; writes only to `workspace` (a folder made for the session); reads only the
        workspace (plus the interpreter and system libraries the runner always grants); the
        default budgets. Data comes in as cell inputs or by copying it into the workspace;
        anything more needs a policy file. Its `paths` table names the same folder
        `workspace`, so the file tools of the session see what its cells see.
        """
        return cls(
            filesystem_config=FilesystemConfig(
                mode=FilesystemMode.read_write, writable_paths=[workspace], readable_paths=[]),
            paths={"workspace": PathConfig(root=workspace, mode="rw", write_approval=False)},
        )


class SandboxResult(_Model):
    exit_code: int
    stdout: str = ""
    stderr: str = ""
    duration_ms: float = Field(ge=0)
    resource_usage: dict[str, Any] = Field(default_factory=dict)
    # Extensions: why the sandbox killed the run (None when it ended by itself) and the
    # output variables of a Python run (JSON-safe data only).
    killed: str | None = None
    variables: dict[str, Any] = Field(default_factory=dict)
    # Of a session's cell: its displays in order (each {"kind": "display" | "update" |
    # "result" | "clear", "data", "metadata", "display_id"}, already made safe to show) and
    # its error ({"ename", "evalue", "traceback": [lines]}), None when it ran through.
    outputs: list[dict[str, Any]] = Field(default_factory=list)
    error: dict[str, Any] | None = None

    @property
    def result(self) -> dict[str, Any] | None:
        """The data of the cell's last expression's value (a MIME bundle), if it had one."""
        found = [o for o in self.outputs if o.get("kind") == "result"]
        return found[-1]["data"] if found else None
