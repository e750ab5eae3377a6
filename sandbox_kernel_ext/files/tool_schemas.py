"""One table of the file tools: argument models, descriptions and the toolset method
each calls. The JSON schemas, the dispatcher and the PydanticAI adapter all read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


_PATH = "Virtual path, e.g. 'data/notes.txt'"


class ReadArgs(_Args):
    path: str = Field(description=_PATH)
    offset: int = Field(0, ge=0, description="First character (bytes for binary files) to return")
    max_chars: int = Field(20_000, ge=0, description="Most characters (bytes for binary) to return")


class ViewArgs(_Args):
    path: str = Field(description=_PATH)
    start_line: int = Field(1, ge=1, description="First line number to show (1-based)")
    max_lines: int = Field(200, ge=1, description="Most lines to show")


class WriteArgs(_Args):
    path: str = Field(description=_PATH)
    content: str = Field(description="The whole new content of the file")


class EditArgs(_Args):
    path: str = Field(description=_PATH)
    old_text: str = Field(description="Exact text to replace; must occur exactly once")
    new_text: str = Field(description="Text to put in its place")


class PathArgs(_Args):
    path: str = Field(description=_PATH)


class TransferArgs(_Args):
    source: str = Field(description="Virtual path of the existing file")
    destination: str = Field(description="Virtual path to create (must not exist)")


class ListFilesArgs(_Args):
    path: str = Field(".", description="Folder to search ('.' or '/' means every root)")
    pattern: str = Field("**/*", description="Glob relative to path; '**' spans folders")


class ListDirectoryArgs(_Args):
    path: str = Field(".", description="Folder to list ('.' or '/' lists the roots)")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    method: str  # FileSystemToolset method returning a pydantic result
    args: type[_Args]
    description: str
    writes: bool
    # (argument, access) pairs the call may need approved: what an approval wrapper is told.
    gates: tuple[tuple[str, str], ...] = ()


FILE_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec("read_file", "read", ReadArgs,
             "Read part of a file. Text comes back as UTF-8; binary files as base64 "
             "(content_encoding='base64'). If truncated, call again with the returned offset.", False,
             (("path", "read"),)),
    ToolSpec("view_file", "view", ViewArgs,
             "Show a text file's lines with line numbers; very long lines are cut.", False,
             (("path", "read"),)),
    ToolSpec("write_file", "write_file", WriteArgs,
             "Create or replace a text file. Parent folders are created. The write is atomic.", True,
             (("path", "write"),)),
    ToolSpec("edit_file", "edit_file", EditArgs,
             "Replace old_text with new_text in a file; old_text must appear exactly once.", True,
             (("path", "read"), ("path", "write"))),
    ToolSpec("delete_file", "delete_file", PathArgs, "Delete a file (not a folder).", True,
             (("path", "write"),)),
    ToolSpec("move_file", "move_file", TransferArgs,
             "Move or rename a file. Fails if the destination exists.", True,
             (("source", "read"), ("source", "write"), ("destination", "write"))),
    ToolSpec("copy_file", "copy_file", TransferArgs,
             "Copy a file; the source may be read-only. Fails if the destination exists.", True,
             (("source", "read"), ("destination", "write"))),
    ToolSpec("list_files", "find_files", ListFilesArgs,
             "List files under a folder whose relative path matches a glob pattern.", False),
    ToolSpec("list_directory", "list_directory", ListDirectoryArgs,
             "List one folder's entries with their type and size.", False),
)

TOOLS_BY_NAME = {spec.name: spec for spec in FILE_TOOLS}


def json_schema(args: type[_Args]) -> dict[str, Any]:
    """The model's JSON schema without pydantic's titles (noise in a prompt)."""
    schema = args.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema["additionalProperties"] = False
    return schema


def function_definition(spec: ToolSpec, context: str = "") -> dict[str, Any]:
    """A function-calling tool definition (the `{"type": "function", ...}` format)."""
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description + (f" {context}" if context else ""),
            "parameters": json_schema(spec.args),
        },
    }
