"""Quotas and options of the file toolset, from the policy file and the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import ConfigurationError

ENV_PREFIX = "SANDBOX_KERNEL_EXT_FS_"


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
        """The fields set by `SANDBOX_KERNEL_EXT_FS_*` variables, validated."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            var = ENV_PREFIX + name.upper()
            raw = environ.get(var)
            if raw is None:
                continue
            raw = raw.strip()
            if name in ("max_total_bytes", "max_file_bytes") and raw.lower() in ("", "none"):
                values[name] = None
                continue
            try:
                cls.model_validate({name: raw})
            except ValidationError as exc:
                reason = exc.errors()[0]["msg"]
                raise ConfigurationError(f"environment variable {var}={raw!r} is invalid: {reason}") from None
            values[name] = raw
        return cls.model_validate(values).model_dump(include=set(values))

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
