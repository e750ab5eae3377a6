"""Agent tools (orbiter's shapes) over the file layer and the runner.

`FilesystemTool` reads and writes through the file toolset; `TerminalTool` runs a shell line
under the runner's confinement, after the blacklist checks every command word the parser
finds (`shell_words.py`, with the wrapper table in `shell_wrappers.py`). Importing this
package loads the runner only when `TerminalTool` is first used.
"""

from __future__ import annotations

from .base import Tool
from .filesystem_tool import FilesystemTool
from .shell_wrappers import command_words
from .terminal import DEFAULT_BLACKLIST, TerminalTool

__all__ = ["DEFAULT_BLACKLIST", "FilesystemTool", "TerminalTool", "Tool", "command_words"]
