"""File layer: the agent toolset over race-free host or in-memory backends."""

from .handlers import filesystem_list, filesystem_read, filesystem_write
from .results import ChangeResult, DirEntry, EditResult, FileView, ListResult, ReadResult, WriteResult
from .tool_schemas import FILE_TOOLS, ToolSpec
from .toolset import FileSystemToolset

__all__ = [
    "FILE_TOOLS", "ChangeResult", "DirEntry", "EditResult", "FileSystemToolset", "FileView",
    "ListResult", "filesystem_list", "filesystem_read", "filesystem_write", "ReadResult", "ToolSpec", "WriteResult",
]
