"""Quotas and options of the file toolset, from the policy file and the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import QuotaSettingError

ENV_PREFIX = "SANDBOX_KERNEL_EXT_FS_"

# The seeds' own names for the same settings (ATLAS's filesystem_io, DeepAgents' file tools),
# so an environment written for them keeps its meaning; where several are set, the stricter
# value wins, as between the policy file and the environment.
SEED_VARIABLES: dict[str, tuple[str, ...]] = {
    "max_read_bytes": ("ATLAS_FILESYSTEM_MAX_READ_BYTES",),
    "max_write_bytes": ("ATLAS_FILESYSTEM_MAX_WRITE_BYTES",),
    "max_list_entries": ("ATLAS_FILESYSTEM_MAX_LIST_ENTRIES",),
    "operation_timeout": ("ATLAS_FILESYSTEM_OPERATION_TIMEOUT",),
    "max_total_bytes": ("ATLAS_FILESYSTEM_MAX_TOTAL_BYTES",),
    "max_file_bytes": ("INSPECT_AGENTS_FS_MAX_BYTES",),
}


class FileLimits(BaseModel):
    """Per-operation quotas, the aggregate storage quota and backend options.

    Defaults follow ATLAS's and DeepAgents' file tools. `None` means no limit.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_read_bytes: int = Field(262_144, ge=1, description="Bytes returned by one read")
    max_write_bytes: int = Field(262_144, ge=0, description="Bytes accepted by one write")
    max_list_entries: int = Field(512, ge=1, description="Entries returned by one listing")
    operation_timeout: float = Field(2.0, gt=0, description="Seconds one operation may take")
    max_total_bytes: int | None = Field(
        10_485_760, ge=0, description="Aggregate bytes stored under each writable root"
    )
    max_file_bytes: int | None = Field(
        5_000_000, ge=0, description="Size ceiling for any file read, written or edited"
    )
    max_line_chars: int = Field(2000, ge=1, description="Line cap in the numbered view")
    deny_symlinks: bool = Field(False, description="Refuse every symlink, even inside a root")
    backend: Literal["host", "store"] = Field(
        "host", description="'host' files, or 'store': an in-memory tree per toolset"
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The fields set by `SANDBOX_KERNEL_EXT_FS_*` variables (or the seeds' names for
        them, `SEED_VARIABLES`), validated; the stricter value where several are set.
        An invalid value raises QuotaSettingError naming the variable."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            for var in (ENV_PREFIX + name.upper(), *SEED_VARIABLES.get(name, ())):
                raw = environ.get(var)
                if raw is None:
                    continue
                value = cls._env_value(name, var, raw.strip())
                values[name] = _stricter(name, values[name], value) if name in values else value
        return values

    @classmethod
    def _env_value(cls, name: str, var: str, raw: str) -> Any:
        if name in ("max_total_bytes", "max_file_bytes") and raw.lower() in ("", "none"):
            return None
        try:
            return getattr(cls.model_validate({name: raw}), name)
        except ValidationError as exc:
            reason = exc.errors()[0]["msg"]
            raise QuotaSettingError(f"environment variable {var}={raw!r} is invalid: {reason}") from None

    @classmethod
    def effective(
        cls, policy: FileLimits | None = None, environ: Mapping[str, str] | None = None
    ) -> FileLimits:
        """Merge policy and environment: the environment replaces defaults, and where both
        set a value the stricter one wins, so neither can loosen what the other tightened."""
        env = cls.from_env(environ)
        explicit = dict(policy.model_dump(include=policy.model_fields_set)) if policy else {}
        merged: dict[str, Any] = dict(env)
        for name, value in explicit.items():
            if name not in env:
                merged[name] = value
            else:
                merged[name] = _stricter(name, value, env[name])
        return cls(**merged)


def _stricter(name: str, a: Any, b: Any) -> Any:
    if name == "deny_symlinks":
        return a or b
    if name == "backend":
        return "store" if "store" in (a, b) else "host"
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
