"""Character slices of UTF-8 files without loading the file.

Offsets in `read` count characters, which cannot be seeked to directly. Files up to
`SMALL_FILE_BYTES` are decoded whole. Larger ones get a checkpoint index (character
count → byte position every `CHECKPOINT_BYTES`), built once by streaming and cached by
file identity, so later slices seek near their offset and decode only a little.
"""

from __future__ import annotations

import bisect
import codecs
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

SMALL_FILE_BYTES = 1 << 20
CHECKPOINT_BYTES = 1 << 14
_CACHE_SIZE = 64


@dataclass(frozen=True)
class TextIndex:
    total_chars: int
    chars: tuple[int, ...]  # character offset of each checkpoint, ascending
    bytes_: tuple[int, ...]  # byte position of each checkpoint

    def locate(self, char_offset: int) -> tuple[int, int]:
        """The last checkpoint at or before `char_offset`: (chars, byte position)."""
        i = bisect.bisect_right(self.chars, char_offset) - 1
        return self.chars[i], self.bytes_[i]


def _decoder() -> codecs.IncrementalDecoder:
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


def build_index(f: BinaryIO, check: Callable[[], None]) -> TextIndex:
    f.seek(0)
    decoder = _decoder()
    chars, consumed = 0, 0
    marks_c, marks_b = [0], [0]
    while True:
        check()
        chunk = f.read(CHECKPOINT_BYTES)
        if not chunk:
            chars += len(decoder.decode(b"", final=True))
            break
        consumed += len(chunk)
        chars += len(decoder.decode(chunk))
        pending = len(decoder.getstate()[0])
        marks_c.append(chars)
        marks_b.append(consumed - pending)
    return TextIndex(chars, tuple(marks_c), tuple(marks_b))


class _IndexCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple, TextIndex] = OrderedDict()

    def get(self, key: tuple, f: BinaryIO, check: Callable[[], None]) -> TextIndex:
        with self._lock:
            index = self._items.get(key)
            if index is not None:
                self._items.move_to_end(key)
                return index
        index = build_index(f, check)
        with self._lock:
            self._items[key] = index
            while len(self._items) > _CACHE_SIZE:
                self._items.popitem(last=False)
        return index


_cache = _IndexCache()


@dataclass(frozen=True)
class TextSlice:
    text: str
    total_chars: int
    offset: int


def read_text_slice(
    f: BinaryIO,
    *,
    size: int,
    identity: tuple,
    offset: int,
    max_chars: int,
    max_bytes: int,
    check: Callable[[], None],
) -> TextSlice:
    """Up to `max_chars` characters from character `offset`, never more than `max_bytes`
    of UTF-8. Invalid bytes decode to U+FFFD."""
    if size <= SMALL_FILE_BYTES:
        f.seek(0)
        text = f.read().decode("utf-8", errors="replace")
        piece = text[offset : offset + max_chars]
        return TextSlice(_cap_bytes(piece, max_bytes), len(text), offset)
    index = _cache.get(identity, f, check)
    start_chars, start_byte = index.locate(offset)
    f.seek(start_byte)
    decoder = _decoder()
    skip = offset - start_chars
    out: list[str] = []
    wanted = min(max_chars, max(index.total_chars - offset, 0))
    have = 0
    while have < wanted:
        check()
        chunk = f.read(CHECKPOINT_BYTES)
        text = decoder.decode(chunk, final=not chunk)
        if skip:
            cut = min(skip, len(text))
            text, skip = text[cut:], skip - cut
        if text:
            text = text[: wanted - have]
            out.append(text)
            have += len(text)
        if not chunk:
            break
    return TextSlice(_cap_bytes("".join(out), max_bytes), index.total_chars, offset)


def _cap_bytes(text: str, max_bytes: int) -> str:
    """Trim to at most `max_bytes` of UTF-8 without splitting a character."""
    if len(text) * 4 <= max_bytes:
        return text
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes].decode("utf-8", errors="ignore")
