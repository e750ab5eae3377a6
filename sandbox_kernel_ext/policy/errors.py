"""Every error the package raises on purpose.

Messages are read by people and by LLMs: each says what was refused, why, and what
*is* allowed, and names only virtual paths (never a host path). Each also carries the phrase
filesystem-sandbox's callers match ("outside sandbox", "not found", "text not found",
"found N times", "suffix '.png' not allowed", "already exists", "read-only", "too large"),
and each file error is also the built-in exception Python code expects for it
(FileNotFoundError, FileExistsError, IsADirectoryError, PermissionError, TimeoutError).
"""

from __future__ import annotations

from collections.abc import Sequence


def _allowed(readable: Sequence[str] | None, writable: Sequence[str] | None) -> str:
    if readable is None and writable is None:
        return ""
    read = ", ".join(readable or ()) or "nothing"
    write = ", ".join(writable or ()) or "nothing"
    return f" Readable: {read}. Writable: {write}."


class SandboxError(Exception):
    """Base of every sandbox error (filesystem-sandbox); also the aumai-sandbox lifecycle error."""


class ConfigurationError(SandboxError, ValueError):
    """A setting (environment variable, argument, policy value) is invalid."""


class UnreadableWorkdirError(ConfigurationError):
    """A run was asked to start in a folder its policy does not let it read."""


class CapabilityParseError(SandboxError, ValueError):
    """A policy file or string cannot be parsed or fails validation.

    `source`, `line` and `field` say where; `line` is 1-based and None when unknown.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str = "<string>",
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.source = source
        self.line = line
        self.field = field
        where = source if line is None else f"{source}, line {line}"
        if field:
            where += f", field '{field}'"
        super().__init__(f"{where}: {message}")


class FilesystemError(SandboxError):
    """Base of file-operation failures (ATLAS filesystem_io)."""


class PathNotFoundError(FilesystemError, FileNotFoundError):
    """The virtual path names nothing (or the wrong kind of thing)."""

    def __init__(self, path: str, what: str = "does not exist") -> None:
        self.path = path
        self.what = what
        super().__init__(f"File not found: '{path}' {what}. List the folder to see what is there.")


class PathExistsError(FilesystemError, FileExistsError):
    """The destination of a create, move or copy is already there (nothing is overwritten)."""

    def __init__(self, path: str, operation: str = "create") -> None:
        self.path = path
        super().__init__(
            f"Cannot {operation} '{path}': it already exists; delete it first or pick another name."
        )


class NotAFileError(FilesystemError, IsADirectoryError):
    """A file operation named a folder (or a root)."""

    def __init__(self, path: str, hint: str = "give a file path") -> None:
        self.path = path
        super().__init__(f"Not a file: '{path}' is a directory; {hint}.")


class SandboxViolationError(FilesystemError, PermissionError):
    """An operation tried to leave what the policy allows (ATLAS filesystem_io)."""


class MissingPathError(PathNotFoundError, SandboxViolationError):
    """A missing path as ATLAS's handlers report it: their callers catch SandboxViolationError
    for it, other code FileNotFoundError; this is both."""


class PathNotInSandboxError(SandboxViolationError):
    """The path is outside every root the sandbox grants."""

    def __init__(
        self,
        path: str,
        reason: str,
        readable: Sequence[str] | None = None,
        writable: Sequence[str] | None = None,
    ) -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            f"Cannot access '{path}': path is outside sandbox ({reason}).{_allowed(readable, writable)}"
        )


class PathNotWritableError(SandboxViolationError):
    """The path is inside the sandbox but may not be written."""

    def __init__(
        self,
        path: str,
        reason: str = "it is read-only",
        writable: Sequence[str] | None = None,
    ) -> None:
        self.path = path
        where = ", ".join(writable or ()) or "nothing (this sandbox is read-only)"
        super().__init__(f"Cannot write to '{path}': path is read-only here ({reason}). "
                         f"Writable: {where}.")


class SandboxPermissionEscalationError(SandboxViolationError):
    """A derived sandbox asked for more than its parent has."""


class SuffixNotAllowedError(SandboxViolationError):
    def __init__(self, path: str, suffix: str, allowed: Sequence[str]) -> None:
        self.path = path
        self.suffix = suffix
        self.allowed = list(allowed)
        shown = f"suffix '{suffix}'" if suffix else "suffix '' (a name without one)"
        super().__init__(
            f"Cannot access '{path}': {shown} not allowed here. "
            f"Allowed suffixes: {', '.join(allowed) or 'none'}."
        )


class QuotaExceededError(FilesystemError):
    """A per-operation or aggregate quota would be exceeded (ATLAS filesystem_io)."""

    def __init__(self, message: str, *, actual: int | None = None, limit: int | None = None):
        self.actual = actual
        self.limit = limit
        super().__init__(message)


class QuotaSettingError(ConfigurationError, QuotaExceededError):
    """A quota's setting (an environment variable) is invalid: a configuration error, and
    the QuotaExceededError ATLAS's handlers raise for it, so either handler catches it."""


class FileTooLargeError(QuotaExceededError):
    """A file is over its size ceiling; `actual` and `limit` are byte counts."""

    def __init__(self, path: str, actual: int, limit: int) -> None:
        self.path = path
        super().__init__(
            f"Cannot use '{path}': file too large ({actual:,} bytes). "
            f"Maximum allowed for this path: {limit:,} bytes.",
            actual=actual,
            limit=limit,
        )


FileSizeExceeded = FileTooLargeError  # DeepAgents' name for the same refusal


class FilesystemTimeoutError(FilesystemError, TimeoutError):
    """An operation ran past its time budget and was stopped (ATLAS filesystem_io)."""


class EditError(FilesystemError):
    """An edit's old text was not found exactly once."""

    def __init__(self, path: str, matches: int) -> None:
        self.path = path
        self.matches = matches
        if matches == 0:
            hint = "text not found in file; read the file and copy old_text exactly"
        else:
            hint = (
                f"text found {matches} times (must be unique); include more surrounding "
                "text in old_text so it matches exactly once"
            )
        super().__init__(f"Cannot edit '{path}': {hint}.")


class ApprovalDeniedError(SandboxViolationError):
    """An approval-gated operation was refused (by a person, a timeout or the headless policy)."""

    def __init__(self, operation: str, path: str, reason: str) -> None:
        self.operation = operation
        self.path = path
        self.reason = reason
        super().__init__(f"{operation} of '{path}' was not approved: {reason}.")


class ToolError(SandboxError):
    """A tool call failed; the message is meant for the model that made the call (orbiter.sandbox.tools)."""
