"""sandbox_kernel_ext: run untrusted Jupyter cells and agent tools under a policy that
the operating system enforces.

Every name a seed API promises for the policy and file layers is importable from here.
"""

from .approval import (
    ApprovalBroker,
    ApprovalDecision,
    ApprovalRecord,
    ApprovalRequest,
    ApprovalResponder,
    CallbackResponder,
    Decision,
    HeadlessResponder,
    TerminalResponder,
    default_responder,
    set_default_responder,
)
from .files import (
    ChangeResult,
    DirEntry,
    EditResult,
    FileView,
    ListResult,
    ReadResult,
    WriteResult,
    filesystem_list,
    filesystem_read,
    filesystem_write,
)
from .policy import (
    ApprovalDeniedError,
    CapabilityDeclaration,
    CapabilityParseError,
    CapabilityParser,
    ConfigurationError,
    EditError,
    EgressDecision,
    EgressFilter,
    FileLimits,
    FileSizeExceeded,
    FilesystemConfig,
    FilesystemError,
    FilesystemMode,
    FilesystemPolicy,
    FilesystemTimeoutError,
    FileTooLargeError,
    NetworkEgressRule,
    PathConfig,
    MissingPathError,
    NotAFileError,
    PathExistsError,
    PathNotFoundError,
    PathNotInSandboxError,
    PathNotWritableError,
    QuotaExceededError,
    QuotaSettingError,
    RateLimiter,
    ResourceLimits,
    RootSandboxConfig,
    Sandbox,
    SandboxConfig,
    SandboxError,
    SandboxPermissionEscalationError,
    SandboxResult,
    SandboxStatus,
    SandboxTier,
    SandboxViolationError,
    SuffixNotAllowedError,
    ToolError,
    check_egress,
    check_limits,
    validate_path_access,
)
from .notebook import load_ipython_extension, unload_ipython_extension
from .runner.child.inside import report_usage
from .runner.trusted.isolation import isolation_report
from .runner.trusted.manager import SandboxManager
from .runner.trusted.monitor import ResourceMonitor
from .tools import FilesystemTool, TerminalTool, Tool

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """`FileSystemToolset`, made on first use: filesystem-sandbox's toolset is a PydanticAI
    toolset, so ours is one too where PydanticAI is installed (its import takes a few hundred
    milliseconds, paid only by code that asks for this name), and the plain one elsewhere."""
    if name != "FileSystemToolset":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from .files.pydantic_ai import FileSystemToolset as toolset_class
    except ImportError:
        from .files.toolset import FileSystemToolset as toolset_class
    globals()[name] = toolset_class
    return toolset_class


def __dir__() -> list[str]:
    """The module's names with the lazy one, so code that imports every public name by
    iterating `dir()` finds `FileSystemToolset` too."""
    return sorted({*globals(), *__all__})

__all__ = [
    "ApprovalBroker", "ApprovalDecision", "ApprovalDeniedError", "ApprovalRecord",
    "ApprovalRequest", "ApprovalResponder", "CallbackResponder", "CapabilityDeclaration",
    "CapabilityParseError", "CapabilityParser", "ChangeResult", "ConfigurationError", "Decision",
    "DirEntry", "EditError", "EditResult", "EgressDecision", "EgressFilter", "FileLimits",
    "FileSizeExceeded", "FileSystemToolset", "FileTooLargeError", "FileView", "FilesystemConfig",
    "FilesystemError", "FilesystemMode", "FilesystemPolicy", "FilesystemTimeoutError",
    "FilesystemTool", "HeadlessResponder", "ListResult", "NetworkEgressRule", "PathConfig",
    "MissingPathError", "NotAFileError", "PathExistsError", "PathNotFoundError", "PathNotInSandboxError", "PathNotWritableError", "QuotaExceededError", "QuotaSettingError",
    "RateLimiter", "ReadResult", "ResourceLimits", "RootSandboxConfig", "Sandbox", "SandboxConfig",
    "ResourceMonitor", "SandboxError", "SandboxManager", "SandboxPermissionEscalationError", "SandboxResult", "SandboxStatus",
    "SandboxTier", "SandboxViolationError", "SuffixNotAllowedError", "TerminalResponder", "TerminalTool", "Tool",
    "ToolError", "WriteResult", "check_egress", "filesystem_list", "filesystem_read",
    "filesystem_write", "check_limits", "isolation_report", "load_ipython_extension",
    "report_usage", "unload_ipython_extension", "default_responder", "set_default_responder",
    "validate_path_access",
]
