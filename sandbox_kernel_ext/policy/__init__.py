"""Policy layer: models, the YAML parser, virtual paths, egress and limit checks.

No processes and no file I/O beyond reading a policy file.
"""

from .egress import EgressDecision, EgressFilter, RateLimiter, check_egress
from .errors import (
    ApprovalDeniedError,
    CapabilityParseError,
    ConfigurationError,
    EditError,
    FilesystemError,
    FileSizeExceeded,
    FilesystemTimeoutError,
    FileTooLargeError,
    MissingPathError,
    NotAFileError,
    PathExistsError,
    PathNotFoundError,
    PathNotInSandboxError,
    PathNotWritableError,
    QuotaExceededError,
    QuotaSettingError,
    SandboxError,
    SandboxPermissionEscalationError,
    SandboxViolationError,
    SuffixNotAllowedError,
    ToolError,
)
from .file_limits import FileLimits
from .filesystem import FilesystemPolicy, validate_path_access
from .limits import check_limits
from .models import (
    CapabilityDeclaration,
    FilesystemConfig,
    FilesystemMode,
    NetworkEgressRule,
    ResourceLimits,
    SandboxResult,
    SandboxStatus,
    SandboxTier,
)
from .parser import CapabilityParser
from .path_config import PathConfig, RootSandboxConfig, SandboxConfig
from .sandbox import Sandbox, VirtualPath

__all__ = [
    "ApprovalDeniedError", "CapabilityDeclaration", "CapabilityParseError", "CapabilityParser",
    "ConfigurationError", "EditError", "EgressDecision", "EgressFilter", "FileLimits",
    "FileSizeExceeded", "FileTooLargeError", "FilesystemConfig", "FilesystemError",
    "FilesystemMode", "FilesystemPolicy", "FilesystemTimeoutError", "NetworkEgressRule",
    "MissingPathError", "NotAFileError", "PathConfig", "PathExistsError", "PathNotFoundError", "PathNotInSandboxError", "PathNotWritableError",
    "QuotaExceededError", "QuotaSettingError", "RateLimiter", "ResourceLimits", "RootSandboxConfig", "Sandbox",
    "SandboxConfig", "SandboxError", "SandboxPermissionEscalationError", "SandboxResult",
    "SandboxStatus", "SandboxTier", "SandboxViolationError", "SuffixNotAllowedError",
    "ToolError", "VirtualPath", "check_egress", "check_limits", "validate_path_access",
]
