"""Reading and copying files in bounded pieces: a line never longer than asked, a copy never
longer than the size checked against the quota (a file that grows meanwhile is copied as it
was), and a look at a file's first bytes to tell text from binary."""

from __future__ import annotations

import os
from collections.abc import Iterator

__all__ = ["CHUNK", "capped_lines", "copy_at_most", "read_chunks", "looks_binary"]

CHUNK = 1 << 16


def capped_lines(f, max_bytes: int) -> Iterator[tuple[bytes, bool]]:
    """Lines of at most `max_bytes`, and whether the rest of a longer line was skipped,
    so one huge line is never held in memory."""
    while True:
        line = f.readline(max_bytes)
        if not line:
            return
        dropped = False
        while not line.endswith(b"\n"):
            rest = f.readline(max_bytes)
            if not rest:
                break
            dropped = True
            if rest.endswith(b"\n"):
                break
        yield line, dropped

def copy_at_most(source: int, target: int, size: int) -> int:
    """Copy the first `size` bytes of `source` (whatever it grew to since) into `target`."""
    done = 0
    while done < size:
        chunk = os.pread(source, min(CHUNK, size - done), done)
        if not chunk:
            break
        os.write(target, chunk)
        done += len(chunk)
    return done

def read_chunks(f, size: int) -> Iterator[bytes]:
    """At most `size` bytes of `f`, the size checked and reserved for (a file that grows
    meanwhile is copied as it was)."""
    left = size
    while left > 0:
        chunk = f.read(min(CHUNK, left))
        if not chunk:
            return
        left -= len(chunk)
        yield chunk

def looks_binary(head: bytes, mime: str | None) -> bool:
    if b"\0" in head:
        return True
    if mime and mime.startswith("text/"):
        return False  # invalid bytes in a text file are replaced, as ATLAS's handlers do
    if mime and mime.split("/")[0] in ("image", "audio", "video", "font"):
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start < len(head) - 3  # a character cut at the sniff boundary is fine
    return False
