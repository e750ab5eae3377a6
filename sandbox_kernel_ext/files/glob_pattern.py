"""Glob patterns over '/'-separated relative paths, as the file tools' `find_files` takes
them: `**/` any number of folders, `*` and `?` within one name, `[...]` a class of literal
members that never matches '/'."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

__all__ = ["glob_matcher"]


@lru_cache(maxsize=128)
def glob_matcher(pattern: str) -> Callable[[str], re.Match[str] | None]:
    """Compile a glob to a full-match function over '/'-separated relative paths."""
    i, out = 0, []
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            negate = pattern[i + 1 : i + 2] in ("!", "^")
            start = i + 2 if negate else i + 1
            end = pattern.find("]", start + 1)  # a ']' first in the class is a member
            if end == -1:
                out.append(re.escape(c))
            else:
                # Members are literal: no regex escapes, nested sets or set operations.
                body = re.sub(r"([\\\[&~|])", r"\\\1", pattern[start:end])
                # A class never matches '/', whatever it names: a negation, a range such as
                # [.-0], or '/' itself would otherwise let one segment's wildcard cross folders.
                out.append(f"(?!/)[{'^' if negate else ''}{body}]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL).fullmatch
