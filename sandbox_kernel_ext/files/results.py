"""Typed results of the file tools; each has a `summary` a model can read."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, computed_field


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True)


class ReadResult(_Result):
    """A slice of a file. Text is UTF-8 (invalid bytes replaced); binary content is
    base64 and then `offset`, `chars_read` and `total_chars` count bytes."""

    content: str
    truncated: bool
    total_chars: int
    offset: int
    chars_read: int
    path: str = ""
    mime_type: str | None = None
    content_encoding: Literal["utf-8", "base64"] = "utf-8"

    @computed_field
    @property
    def summary(self) -> str:
        unit = "bytes" if self.content_encoding == "base64" else "characters"
        end = self.offset + self.chars_read
        more = f"; continue with offset={end}" if self.truncated else ""
        return f"Read {unit} {self.offset}-{end} of {self.total_chars} from {self.path}{more}"


class FileView(_Result):
    """Numbered lines (`cat -n` style), each capped at the configured length."""

    path: str
    lines: list[str]
    start_line: int
    end_line: int
    truncated: bool
    summary: str


class WriteResult(_Result):
    path: str
    bytes_written: int
    created: bool
    summary: str


class EditResult(_Result):
    path: str
    replaced: int
    summary: str


class ChangeResult(_Result):
    """Outcome of delete, move and copy."""

    path: str
    source: str | None = None
    summary: str


class DirEntry(_Result):
    name: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int


class ListResult(_Result):
    files: list[str]
    summary: str
