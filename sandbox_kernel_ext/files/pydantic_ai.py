"""PydanticAI adapter for FileSystemToolset (filesystem-sandbox), kept optional.

Nothing in `sandbox_kernel_ext` imports this module eagerly, so the package works without
pydantic-ai (and does not pay its import time); `sandbox_kernel_ext.FileSystemToolset` loads
it on first use when pydantic-ai is installed, because filesystem-sandbox's toolset is a
PydanticAI toolset and its users pass it to agents and approval wrappers directly.

The adapter is an `AbstractToolset` rather than a `FunctionToolset`: the tool names,
descriptions and JSON schemas come straight from `FileSystemToolset.tool_definitions()`
(the `FILE_TOOLS` table), arguments are validated by each tool's own args model, and one
`call_tool` dispatches through `FileSystemToolset.call`, so no per-tool Python function
(and no signature introspection) is needed.
"""

from __future__ import annotations

from functools import lru_cache, partial
from typing import Annotated, Any

try:
    import anyio.to_thread
    from pydantic_ai import ModelRetry, RunContext
    from pydantic_ai.tools import ToolDefinition
    from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "sandbox_kernel_ext.files.pydantic_ai needs pydantic-ai; "
        "install it with: pip install 'sandbox_kernel_ext[pydantic-ai]'"
    ) from exc

from pydantic import AfterValidator, BaseModel, TypeAdapter

from ..policy.errors import SandboxError
from .call_approval import call_key, take_ticket
from .tool_schemas import TOOLS_BY_NAME
from .toolset import FileSystemToolset as PlainFileSystemToolset

__all__ = ["FileSystemToolset", "PydanticAIFileSystemToolset", "as_pydantic_ai_toolset"]


@lru_cache(maxsize=None)
def _args_validator(args_model: type[BaseModel]) -> Any:
    """The args model's validator, returning a plain dict because PydanticAI passes the
    validated arguments on as keyword arguments (and to hooks) as a dict."""
    dump = AfterValidator(lambda model: model.model_dump())
    return TypeAdapter(Annotated[args_model, dump]).validator


class _AgentTools(AbstractToolset[Any]):
    """The PydanticAI face of a FileSystemToolset (`_files`): its tools, their calls, and
    the approval-wrapper protocol. Works with any agent deps type (the file tools never
    read `ctx.deps`). Policy refusals come back to the model as retry prompts carrying the
    sandbox's message, which already says what was refused and what is allowed."""

    _files: PlainFileSystemToolset

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        """Recomputed per step from `tool_definitions()`, so write tools are absent
        exactly when the sandbox has nothing writable, with the same descriptions."""
        tools: dict[str, ToolsetTool[Any]] = {}
        for definition in self._files.tool_definitions():
            fn = definition["function"]
            spec = TOOLS_BY_NAME[fn["name"]]
            tools[spec.name] = ToolsetTool(
                toolset=self,
                tool_def=ToolDefinition(
                    name=spec.name,
                    description=fn["description"],
                    parameters_json_schema=fn["parameters"],
                    metadata={"writes": spec.writes},
                ),
                max_retries=self._files.max_retries,
                args_validator=_args_validator(spec.args),
            )
        return tools

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        """Run the blocking file operation in a worker thread so the event loop (and
        other tool calls) keep going; sandbox refusals, approval denials included,
        become `ModelRetry` so the model reads why and can change course. A call an
        approval wrapper around this toolset approved (it asked `needs_approval` first, in
        this task) is not asked about again."""
        call = partial(self._files.call, name, tool_args)
        if take_ticket(call_key(self._files, name, tool_args)):
            call = partial(call, approved_by="the approval wrapper")
        try:
            return await anyio.to_thread.run_sync(call)
        except SandboxError as exc:  # includes ApprovalDeniedError and ToolError
            raise ModelRetry(str(exc)) from exc

    # The approval-wrapper protocol (pydantic-ai-blocking-approval's `ApprovalToolset`).
    def needs_approval(
        self, name: str, tool_args: dict[str, Any], ctx: Any = None, config: Any = None
    ) -> Any:
        return self._files.needs_approval(name, tool_args, ctx, config)

    def get_approval_description(self, name: str, tool_args: dict[str, Any], ctx: Any = None) -> str:
        return self._files.get_approval_description(name, tool_args, ctx)


class PydanticAIFileSystemToolset(_AgentTools):
    """An existing FileSystemToolset seen by a PydanticAI agent (the toolset's lifetime,
    policy, broker and limits stay the caller's)."""

    def __init__(self, toolset: PlainFileSystemToolset) -> None:
        self._files = toolset

    @property
    def id(self) -> str | None:
        return self._files.id

    @property
    def toolset(self) -> PlainFileSystemToolset:
        """The wrapped toolset (whose lifetime the caller owns)."""
        return self._files

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._files!r})"


class _AnyFileSystemToolset(type(AbstractToolset)):  # type: ignore[misc]
    """`isinstance(t, sandbox_kernel_ext.FileSystemToolset)` holds for every toolset of this
    package, including those it makes as the plain class (`session_toolset()`,
    `FilesystemTool.toolset`), as it did before this class stood behind the name."""

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, PlainFileSystemToolset) or super().__instancecheck__(instance)


class FileSystemToolset(PlainFileSystemToolset, _AgentTools, metaclass=_AnyFileSystemToolset):
    """filesystem-sandbox's `FileSystemToolset` as that library has it: the toolset is itself
    a PydanticAI toolset, so `Agent(toolsets=[FileSystemToolset(sandbox)])` and an approval
    wrapper's `ApprovalToolset(inner=FileSystemToolset(sandbox), ...)` work unchanged.
    `sandbox_kernel_ext.FileSystemToolset` is this class when PydanticAI is installed. A
    toolset made as the plain class goes to an agent through `as_pydantic_ai_toolset`."""

    @property
    def _files(self) -> PlainFileSystemToolset:
        return self

    @property
    def id(self) -> str | None:
        return self._id

    @id.setter
    def id(self, value: str | None) -> None:
        self._id = value


def as_pydantic_ai_toolset(toolset: PlainFileSystemToolset) -> PydanticAIFileSystemToolset:
    """Adapt `toolset` for `pydantic_ai.Agent(toolsets=[...])`; it keeps the toolset's
    `id`, `max_retries`, policy, broker and limits."""
    return PydanticAIFileSystemToolset(toolset)
