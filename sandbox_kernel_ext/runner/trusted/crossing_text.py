"""The text rules of every channel a sandbox's text crosses into the trusted side by.

Everything a sandbox sends is hostile, and text is the part people read: a child chooses its
bytes to rewrite a terminal, reorder or hide what is shown, pass for the notebook's own UI,
or make the kernel raise when it sends a message. So every piece of a sandbox's text is
cleaned here, by one set of character classes, with one function per channel:

- `stream_text`: stdout/stderr; newlines, tabs, carriage returns and colours (SGR) stay;
- `display_text`: the text/plain form of a display, a traceback's message and source lines;
- `line_text`: one line, for a name (an exception's type, a function, a file name);
- `prompt_line`: an `input()` prompt, one short line that says it is the sandbox's;
- `variable_value`: a cell's output variables, which are data: only made encodable.

The classes, dropped from every text that is shown:
- control characters (C0 and C1): escape sequences rewrite a terminal (its title, its
  clipboard through OSC 52), and `\\b`/`\\r` rewrite what was shown before them;
- bidi controls (embeddings, overrides, isolates, the LRM/RLM/ALM marks): they reorder text,
  so what shows is not what was written;
- invisible characters that hide text in text: zero-width space, word joiner and invisible
  operators, the BOM inside text, soft hyphen, interlinear annotations, deprecated format
  controls, and the tag characters (a whole ASCII message nobody sees);
- lone surrogates become U+FFFD: JSON carries them, no message encoder can (the kernel would
  raise sending them).
Zero-width joiner and non-joiner stay in streams and displays (emoji sequences, Persian and
Indic writing need them; they join glyphs, they hide nothing) and go from prompts.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

__all__ = ["PROMPT_MARKER", "PROMPT_LIMIT", "valid_unicode", "stream_text", "display_text",
           "line_text", "prompt_line", "variable_value"]

PROMPT_MARKER = "[sandbox] "
PROMPT_LIMIT = 200  # characters of a prompt after the marker, the ellipsis included
LINE_BREAK_MARK = " \u21b5 "  # "↵": where a prompt had a line break

_SURROGATE = re.compile(r"[\ud800-\udfff]")
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_INVISIBLE = ("\u00ad\u180e\u200b\u2060-\u2064\u206a-\u206f\ufeff\ufff9-\ufffb"
              "\U000e0000-\U000e007f")
# Blank letters: Hangul fillers and the blank Braille pattern draw nothing, so in one line a
# run of them pushes the words after it onto a line of their own without a line break. Kept
# in streams and displays (Braille charts in a terminal draw with the blank pattern).
_BLANK_LETTERS = "\u115f\u1160\u3164\uffa0\u2800"
_JOINERS = "\u200c\u200d"
# Line and paragraph separators: a line break wherever text is shown (VT, FF, the file/group/
# record separators and NEL among them, for Python's own str.splitlines).
_SEPARATORS = "\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029"
# Escape sequences: CSI, OSC/DCS/SOS/PM/APC strings (to BEL or ST), and two-character ones.
_ESCAPE_SEQUENCE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -~]?"
    r"|\x9b[0-?]*[ -/]*[@-~]")
_SGR = re.compile(r"\x1b\[[0-9;]*m")
# What each channel drops (after escape sequences, for streams and lines).
_DISPLAY_DROPPED = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}{_INVISIBLE}]")
_STREAM_DROPPED = re.compile(f"[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f-\x9f{_BIDI}{_INVISIBLE}]")
_LINE_DROPPED = re.compile(
    f"[\x00-\x08\x0e-\x1f\x7f-\x9f{_BIDI}{_INVISIBLE}{_JOINERS}{_BLANK_LETTERS}]")
_LINE_BREAKS = re.compile(f"[{_SEPARATORS}]+")
_SPACES = re.compile("[\t \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]+")
MAX_MARKS = 4  # combining marks kept on one character in a line (more stack over other lines)


def valid_unicode(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD: JSON can carry them, and no
    message encoder can (the kernel would raise sending the message)."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def _capped(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def display_text(value: Any, limit: int = 1 << 20) -> str:
    """Text of a display or an error report, safe to show anywhere: newlines and tabs stay;
    control characters, bidi controls and invisible characters go; at most `limit`
    characters (and an ellipsis)."""
    text = valid_unicode(value if isinstance(value, str) else str(value))
    return _capped(_DISPLAY_DROPPED.sub("", text), limit)


def stream_text(text: str) -> str:
    """A sandbox's stdout/stderr text as a terminal or a notebook may show it: newlines,
    tabs, carriage returns (progress bars) and colours (SGR sequences) stay; every other
    escape sequence (a title, the clipboard through OSC 52, the cursor), control character,
    bidi control and invisible character goes."""
    text = _ESCAPE_SEQUENCE.sub(lambda m: m.group(0) if _SGR.fullmatch(m.group(0)) else "",
                                valid_unicode(text))
    return _STREAM_DROPPED.sub("", text)


def line_text(value: Any, limit: int = 200) -> str:
    """One line of a sandbox's text (a name, a prompt): escape sequences gone, each run of
    line breaks a visible mark, other control, bidi and invisible characters gone, runs of
    spaces and tabs one space, combining marks at most `MAX_MARKS` on a character (a taller
    stack draws over the lines around it), at most `limit` characters with the ellipsis."""
    text = valid_unicode(value if isinstance(value, str) else str(value))
    text = _ESCAPE_SEQUENCE.sub("", text)
    text = _LINE_BREAKS.sub(LINE_BREAK_MARK, text)
    text = _SPACES.sub(" ", _LINE_DROPPED.sub("", text)).lstrip(" ")
    text = _few_marks(text[: limit * (MAX_MARKS + 1)])
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _few_marks(text: str) -> str:
    """`text` with at most MAX_MARKS combining marks in a row."""
    if text.isascii():
        return text
    kept, run = [], 0
    for char in text:
        run = run + 1 if unicodedata.category(char) in ("Mn", "Me") else 0
        if run <= MAX_MARKS:
            kept.append(char)
    return "".join(kept)


def prompt_line(prompt: Any, limit: int = PROMPT_LIMIT) -> str:
    """An `input()` prompt as the person answering it sees it: one line (JupyterLab shows a
    prompt in a `<pre>` with the box after its last line, so a prompt of many lines would
    put its last words next to the box, far below any mark), cleaned and capped
    (`line_text`), after `PROMPT_MARKER` on the same line: the sandbox's code chooses the
    words ("session expired, password:"), which must never read as the kernel's or the
    server's own question."""
    return PROMPT_MARKER + line_text(prompt, limit)


def variable_value(value: Any) -> Any:
    """A cell's output variable (decoded JSON: lists, str-keyed dicts, strings, numbers,
    bytes) with every string in it, dict keys too, made encodable: lone surrogates become
    U+FFFD, which a message encoder would refuse (`print(x)` in the kernel would raise in
    ipykernel's flush and lose the cell's other output). Nothing else changes: a variable is
    data, not display, and newlines, controls or bidi characters in it are the cell's result,
    cleaned when (and as) something shows it. Two keys that differ only in their lone
    surrogates become one (the later wins)."""
    if isinstance(value, str):
        return valid_unicode(value)
    if isinstance(value, list):
        return [variable_value(item) for item in value]
    if isinstance(value, tuple):
        return tuple(variable_value(item) for item in value)
    if isinstance(value, dict):
        return {variable_value(key): variable_value(item) for key, item in value.items()}
    return value
