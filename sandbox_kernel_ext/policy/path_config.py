"""The filesystem-sandbox path table: which host directories become which virtual paths."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_ROOT_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def _check_suffixes(value: list[str] | None) -> list[str] | None:
    if value is None:
        return None
    out = []
    for suffix in value:
        if not isinstance(suffix, str) or not suffix.startswith(".") or "/" in suffix:
            raise ValueError(f"suffix {suffix!r} must look like '.txt'")
        out.append(suffix.lower())
    return out


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RootSandboxConfig(_Strict):
    """Single-root mode: one host directory becomes virtual `/`."""

    root: Path = Field(description="Host directory that becomes virtual '/'")
    readonly: bool = Field(False, description="If true, no writes anywhere")
    suffixes: list[str] | None = Field(None, description="Allowed file extensions (None = all)")
    max_file_bytes: int | None = Field(None, ge=0, description="Max file size (None = no limit)")

    _suffixes = field_validator("suffixes")(_check_suffixes)


class PathConfig(_Strict):
    """One named root in multi-path mode; its files are virtual `/<name>/...`."""

    root: str = Field(description="Host directory (relative roots resolve against the base path)")
    mode: Literal["ro", "rw"] = Field("ro", description="Access mode")
    suffixes: list[str] | None = Field(None, description="Allowed file extensions (None = all)")
    max_file_bytes: int | None = Field(None, ge=0, description="Max file size (None = no limit)")
    write_approval: bool = Field(True, description="Writes need an approval")
    read_approval: bool = Field(False, description="Reads need an approval")

    _suffixes = field_validator("suffixes")(_check_suffixes)

    @field_validator("root")
    @classmethod
    def _root_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("root must not be blank")
        return value


def check_root_names(paths: dict[str, PathConfig] | None) -> dict[str, PathConfig] | None:
    """Root names become the first component of virtual paths, so they are one word."""
    for name in paths or {}:
        if not _ROOT_NAME.match(name) or name in {".", ".."}:
            raise ValueError(
                f"path name {name!r} must be a single word of letters, digits, '_', '-' or '.'"
            )
    return paths


class SandboxConfig(_Strict):
    """Exactly one of `root` (single-root mode) or `paths` (multi-path mode)."""

    root: RootSandboxConfig | None = None
    paths: dict[str, PathConfig] | None = None

    _names = field_validator("paths")(check_root_names)

    @model_validator(mode="after")
    def _exactly_one(self) -> SandboxConfig:
        if (self.root is None) == (self.paths is None):
            raise ValueError("give exactly one of 'root' or 'paths'")
        return self
