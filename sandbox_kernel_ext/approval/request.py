"""What is asked and what was answered.

Both are frozen so a decision cannot be edited after the broker has logged it, and a
request cannot be retargeted (other path, other access) after someone approved it.
"""

from __future__ import annotations

import enum
import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_SUMMARY_CHARS = 2_000

Operation = Literal["read", "write", "edit", "delete", "move", "copy", "open"]
Access = Literal["read", "write"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ApprovalRequest(_Frozen):
    """One gated operation on one virtual path, as shown to whoever decides."""

    operation: Operation = Field(description="What the caller is about to do")
    path: str = Field(description="Virtual path (never a host path), e.g. 'data/out.csv'")
    access: Access = Field(description="Kind of session grant that would cover it")
    size: int | None = Field(None, ge=0, description="Bytes involved, when known")
    summary: str = Field("", description="Short diff or preview for the person deciding")
    source: str = Field(description="Who asks, e.g. 'toolset:notes' or 'sandbox:3f2a'")
    scope: str = Field(
        "",
        description="What `path` is relative to (the real root it names); a session grant "
        "covers only requests with the same scope, so one 'data' never stands for another",
    )
    location: str = Field(
        "",
        description="The file on this machine, for the person deciding: a virtual name can stand "
        "for another folder than they think (a cell may narrow a root to a subfolder). Never "
        "shown to a model",
    )
    id: str = Field(default_factory=lambda: uuid.uuid4().hex, min_length=1)
    created_at: float = Field(default_factory=time.time)

    @field_validator("path")
    @classmethod
    def _virtual_path(cls, value: str) -> str:
        # Grants match paths exactly, so a relative or NUL-carrying path would only ever
        # produce grants nothing else can match (or be confused with a host path).
        if not value.strip() or "\0" in value or ".." in value.split("/"):
            raise ValueError(f"path {value!r} must be a virtual path like 'data/x' or '/x'")
        return value

    @field_validator("summary")
    @classmethod
    def _cap_summary(cls, value: str) -> str:
        # Callers truncate already; the cap keeps a prompt readable and a log small even
        # when one of them forgets.
        if len(value) <= MAX_SUMMARY_CHARS:
            return value
        return value[: MAX_SUMMARY_CHARS - 1] + "…"


class Decision(str, enum.Enum):
    allow_once = "allow_once"
    allow_session = "allow_session"
    deny = "deny"


class ApprovalDecision(_Frozen):
    """An answer plus who gave it and why, so a refusal can explain itself."""

    decision: Decision
    decided_by: str = Field(description="'widget', 'terminal', 'headless policy', ...")
    reason: str = ""
    decided_at: float = Field(default_factory=time.time)

    @property
    def allowed(self) -> bool:
        return self.decision is not Decision.deny
