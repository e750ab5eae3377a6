"""Seed 004's `TerminalTool`, and a shell parser that finds every command a line runs.

The seed checked only the first word of a command line against its blacklist, so
`env rm x`, `a; rm x`, `$(rm x)`, `sh -c 'rm x'` and `/bin/rm x` all went through.
`command_words` parses the line the way a POSIX shell would (plus the common bash
forms) and reports the command word of every simple command it contains, looking
through wrappers such as `sudo`, `xargs` and `find -exec`, and into strings that are
themselves run as shell code (`sh -c`, `eval`).

A blacklist of names can never be a security boundary (a script file, `python -c`,
an alias defined on an earlier line or a copy of `rm` under another name all get
round it), so `TerminalTool` always runs the command under the kernel confinement of
`SandboxManager`; the blacklist only refuses the obvious cases early, with a clear
message.
"""

from __future__ import annotations

import asyncio
import posixpath
import re
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from ..files.filesystem_tool import Tool
from ..policy.errors import ToolError

if TYPE_CHECKING:
    from ..policy.models import CapabilityDeclaration
    from .manager import SandboxManager

__all__ = ["DEFAULT_BLACKLIST", "DYNAMIC", "MAX_DEPTH", "TerminalTool", "command_words"]

#: Reported in place of a command word whose value is only known at run time.
DYNAMIC = "<dynamic>"

#: How many times a string may be re-parsed as shell code (`sh -c`, `eval`, backquotes).
MAX_DEPTH = 8

#: How deeply `( )`, `$( )`, `${ }` and `case` may nest inside one string; this keeps
#: the recursive parser far from Python's recursion limit.
MAX_NESTING = 64

DEFAULT_BLACKLIST: frozenset[str] = frozenset(
    {
        "rm", "rmdir", "mkfs", "dd", "shutdown", "reboot", "halt", "poweroff",
        "kill", "killall", "pkill", "format", "del", "erase", "rd",
    }
)

# Characters that end an unquoted word (besides blanks).
_METACHARS = frozenset(";&|()<>\n")
_BLANKS = frozenset(" \t")
# Operators, longest first so that `;;&` is not read as `;` `;` `&`.
_OPERATORS = (
    ";;&", "&>>", "<<<", "<<-",
    ";;", ";&", "&&", "||", "|&", "&>", "<<", "<>", "<&", ">&", ">>", ">|",
    ";", "&", "|", "(", ")", "<", ">", "\n",
)
_REDIRECTIONS = frozenset({"&>>", "<<<", "<<-", "&>", "<<", "<>", "<&", ">&", ">>", ">|", "<", ">"})
_CASE_ENDS = frozenset({";;", ";&", ";;&"})
# An IO number (`2>`) or bash's `{fd}>` directly before a redirection operator.
_IO_NUMBER = re.compile(r"(?:\d+|\{[A-Za-z_]\w*\})(?=[<>])")
_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*(?:\[[^\]]*\])?\+?")
_NAME = re.compile(r"[A-Za-z_]\w*")

# Reserved words that may precede a command without being one; the parser steps
# over them and keeps looking for the command word. Grouping is not tracked: a
# blacklist needs the commands, not the structure.
_TRANSPARENT = frozenset({"{", "}", "!", "if", "then", "else", "elif", "fi", "while",
                          "until", "do", "done", "in", "esac"})


@dataclass
class _Word:
    """One shell word after quote removal, with what the shell will still do to it."""

    value: str = ""
    quoted: bool = False  # some part was quoted or backslash-escaped
    dynamic: bool = False  # contains an expansion: $x, ${x}, $(...), `...`, <(...)
    glob: bool = False  # contains an unquoted pattern (`*`, `?`, `[..]`) or brace expansion
    assign: bool = False  # a NAME=value assignment word

    @property
    def plain(self) -> bool:
        """Written literally, with no quoting: only such a word can be a reserved word."""
        return not (self.quoted or self.dynamic or self.glob)

    @property
    def static(self) -> bool:
        """Its value is known now (quoting is fine, expansions and patterns are not)."""
        return not (self.dynamic or self.glob)


class _Parser:
    """Recursive-descent reader of one shell string; appends command words to `out`.

    It shares one position over the source, so a `$(` met inside a word is parsed in
    place by the same code that parses the top level: nesting, quotes inside
    substitutions and `case` patterns all come out right without a separate tokenizer
    pass. Only operators are peeked; words are read once, because reading a word also
    records the commands of the substitutions inside it.
    """

    def __init__(self, src: str, out: list[str], depth: int = 0, nesting: int = 0) -> None:
        self.src = src
        self.pos = 0
        self.out = out
        self.depth = depth
        self.nesting = nesting
        # Here-documents whose bodies start after the next newline: (delimiter, strip tabs, expand).
        self.heredocs: list[tuple[str, bool, bool]] = []
        # Offsets where `((` turned out not to start arithmetic.
        self._not_arithmetic: set[int] = set()

    # ----------------------------------------------------------------- lexing helpers

    def _at_end(self) -> bool:
        return self.pos >= len(self.src)

    def _char(self, offset: int = 0) -> str:
        i = self.pos + offset
        return self.src[i] if i < len(self.src) else ""

    def _skip_blanks(self) -> None:
        """Skip blanks, backslash-newline continuations and `#` comments (not newlines)."""
        src = self.src
        while self.pos < len(src):
            c = src[self.pos]
            if c in _BLANKS:
                self.pos += 1
            elif c == "\\" and self._char(1) == "\n":
                self.pos += 2
            elif c == "#":  # only reached at the start of a word, so it is a comment
                end = src.find("\n", self.pos)
                self.pos = len(src) if end < 0 else end
            else:
                return

    def _peek_op(self) -> str | None:
        """The operator at the current position, without consuming it."""
        for op in _OPERATORS:
            if self.src.startswith(op, self.pos):
                return op
        return None

    def _peek_redirection(self) -> tuple[str, int] | None:
        """A redirection here (with any IO number before it): (operator, length)."""
        start = self.pos
        m = _IO_NUMBER.match(self.src, start)
        at = m.end() if m else start
        for op in _OPERATORS:
            if op in _REDIRECTIONS and self.src.startswith(op, at):
                if self.src.startswith("(", at + len(op)) and op in ("<", ">"):
                    return None  # `<(` / `>(` is a process substitution, a word
                return op, at + len(op) - start
        return None

    def _peek_literal(self, word: str) -> bool:
        """Whether an unquoted `word` (a reserved word) stands at the current position."""
        end = self.pos + len(word)
        if not self.src.startswith(word, self.pos):
            return False
        return end >= len(self.src) or self.src[end] in _METACHARS or self.src[end] in _BLANKS

    def _consume_newline(self) -> None:
        """Step over a newline; here-document bodies start right after it."""
        self.pos += 1
        pending, self.heredocs = self.heredocs, []
        for delimiter, strip_tabs, expand in pending:
            self._read_heredoc(delimiter, strip_tabs, expand)

    def _enter(self) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise ValueError(f"command nests deeper than {MAX_NESTING} levels of (), $(), ${{}} or case")

    def _leave(self) -> None:
        self.nesting -= 1

    def _reparse(self, text: str) -> None:
        """Parse `text` as shell code run by this command (sh -c, eval, backquotes)."""
        if self.depth + 1 > MAX_DEPTH:
            raise ValueError(
                f"command is nested more than {MAX_DEPTH} levels deep "
                "(sh -c, eval or backquotes inside each other)"
            )
        child = _Parser(text, self.out, self.depth + 1, self.nesting)
        child.parse_list(frozenset(), frozenset())

    # ----------------------------------------------------------------- words

    def read_word(self) -> _Word:
        """Read one word from the current position, removing quotes.

        Substitutions inside the word are parsed on the spot, so their commands are
        recorded even when the word itself is an argument or a redirection target.
        """
        src = self.src
        w = _Word()
        buf: list[str] = []
        literal_prefix = True  # everything so far was an unquoted literal (for NAME=)
        seen_equals = False
        bracket_open = False
        brace_at: int | None = None
        while self.pos < len(src):
            c = src[self.pos]
            if c in _BLANKS or c in _METACHARS:
                if c in "<>" and self._char(1) == "(":  # process substitution, bash
                    self.pos += 2
                    self._nested_list()
                    w.dynamic = True
                    literal_prefix = False
                    continue
                if c == "(" and w.assign and literal_prefix and buf and buf[-1] == "=":
                    self._read_array()  # NAME=(a b c), bash
                    w.dynamic = True
                break
            if c == "\\":
                nxt = self._char(1)
                if nxt == "\n":  # line continuation: removed entirely
                    self.pos += 2
                    continue
                buf.append(nxt or "\\")
                self.pos += 2 if nxt else 1
                w.quoted, literal_prefix = True, False
            elif c == "'":
                end = src.find("'", self.pos + 1)
                if end < 0:
                    raise ValueError(f"unterminated single quote (opened at offset {self.pos})")
                buf.append(src[self.pos + 1 : end])
                self.pos = end + 1
                w.quoted, literal_prefix = True, False
            elif c == '"':
                self._read_dquote(w, buf)
                literal_prefix = False
            elif c == "$":
                self._read_dollar(w, buf, in_dquote=False)
                literal_prefix = False
            elif c == "`":
                self._read_backquote(in_dquote=False)
                w.dynamic, literal_prefix = True, False
            else:
                if c in "*?":
                    w.glob = True
                elif c == "[":
                    bracket_open = True
                elif c == "]" and bracket_open:
                    w.glob = True
                elif c == "{":
                    brace_at = len(buf)
                elif c == "}" and brace_at is not None:
                    inside = "".join(buf[brace_at + 1 :])
                    if "," in inside or ".." in inside:
                        w.glob = True  # brace expansion: {rm,-rf,x} runs rm in bash
                elif c == "=" and not seen_equals:
                    seen_equals = True
                    if literal_prefix and _ASSIGNMENT.fullmatch("".join(buf)):
                        w.assign = True
                buf.append(c)
                self.pos += 1
        w.value = "".join(buf)
        return w

    def _read_dquote(self, w: _Word, buf: list[str]) -> None:
        """Read a "double-quoted" part: only $, ` and \\ keep a meaning inside."""
        start = self.pos
        self.pos += 1
        src = self.src
        w.quoted = True
        while self.pos < len(src):
            c = src[self.pos]
            if c == '"':
                self.pos += 1
                return
            if c == "\\":
                nxt = self._char(1)
                if nxt == "\n":
                    self.pos += 2
                elif nxt in ('$', '`', '"', '\\'):
                    buf.append(nxt)
                    self.pos += 2
                else:
                    buf.append("\\")
                    self.pos += 1
            elif c == "$":
                self._read_dollar(w, buf, in_dquote=True)
            elif c == "`":
                self._read_backquote(in_dquote=True)
                w.dynamic = True
            else:
                buf.append(c)
                self.pos += 1
        raise ValueError(f"unterminated double quote (opened at offset {start})")

    def _read_dollar(self, w: _Word, buf: list[str], *, in_dquote: bool) -> None:
        """Read an expansion starting at `$`; a `$` that starts none is literal."""
        nxt = self._char(1)
        if nxt == "'" and not in_dquote:  # $'...' (bash, newer dash): escapes we do not decode
            start, i = self.pos, self.pos + 2
            while i < len(self.src) and self.src[i] != "'":
                i += 2 if self.src[i] == "\\" else 1
            if i >= len(self.src):
                raise ValueError(f"unterminated $'...' quote (opened at offset {start})")
            body = self.src[start + 2 : i]
            if "\\" in body:
                w.dynamic = True
            buf.append(body)
            w.quoted = True
            self.pos = i + 1
        elif nxt == '"' and not in_dquote:  # $"..." (locale translation): a double quote
            self.pos += 1
            self._read_dquote(w, buf)
        elif nxt == "(":
            w.dynamic = True
            if self._char(2) == "(" and self._try_arithmetic(self.pos + 3):
                return
            self.pos += 2
            self._nested_list()
        elif nxt == "{":
            w.dynamic = True
            self._read_braced_parameter(in_dquote)
        elif nxt.isdigit() or nxt in ("@", "*", "#", "?", "-", "$", "!"):
            w.dynamic = True
            self.pos += 2
        elif nxt and _NAME.match(nxt):
            w.dynamic = True
            m = _NAME.match(self.src, self.pos + 1)
            assert m is not None
            self.pos = m.end()
        else:
            buf.append("$")
            self.pos += 1

    def _read_braced_parameter(self, in_dquote: bool) -> None:
        """Skip `${...}`, recording commands in any substitution inside it."""
        start = self.pos
        self.pos += 2
        self._enter()
        scratch = _Word()
        src = self.src
        while self.pos < len(src):
            c = src[self.pos]
            if c == "}":
                self.pos += 1
                self._leave()
                return
            if c == "\\":
                self.pos += 2
            elif c == "'" and not in_dquote:
                end = src.find("'", self.pos + 1)
                if end < 0:
                    raise ValueError(f"unterminated single quote (opened at offset {self.pos})")
                self.pos = end + 1
            elif c == '"':
                self._read_dquote(scratch, [])
            elif c == "$":
                self._read_dollar(scratch, [], in_dquote=in_dquote)
            elif c == "`":
                self._read_backquote(in_dquote=in_dquote)
            else:
                self.pos += 1
        raise ValueError(f"unterminated '${{' (opened at offset {start})")

    def _read_backquote(self, *, in_dquote: bool) -> None:
        """Read `...`, undo its backslash escapes and parse the result as shell code."""
        start = self.pos
        self.pos += 1
        src = self.src
        escapable = '$`\\"' if in_dquote else "$`\\"
        inner: list[str] = []
        while self.pos < len(src):
            c = src[self.pos]
            if c == "`":
                self.pos += 1
                self._reparse("".join(inner))
                return
            if c == "\\" and self._char(1) in escapable and self._char(1):
                inner.append(self._char(1))
                self.pos += 2
            else:
                inner.append(c)
                self.pos += 1
        raise ValueError(f"unterminated backquote (opened at offset {start})")

    def _try_arithmetic(self, body: int) -> bool:
        """Read `((...))` whose body starts at `body`.

        Returns False, having consumed nothing, when the parentheses do not close with
        `))`: then, as in bash, the text is a subshell inside a subshell (or `$(`).
        """
        if body in self._not_arithmetic:
            return False
        saved = (self.pos, len(self.out), self.nesting)
        self.pos = body
        depth = 0
        scratch = _Word()
        src = self.src
        try:
            self._enter()
            while self.pos < len(src):
                c = src[self.pos]
                if c == "(":
                    depth += 1
                elif c == ")":
                    if depth == 0:
                        if self._char(1) == ")":
                            self.pos += 2
                            self._leave()
                            return True
                        break
                    depth -= 1
                elif c == "$":
                    self._read_dollar(scratch, [], in_dquote=False)
                    continue
                elif c == "`":
                    self._read_backquote(in_dquote=False)
                    continue
                elif c == '"':
                    self._read_dquote(scratch, [])
                    continue
                elif c == "'":
                    end = src.find("'", self.pos + 1)
                    if end < 0:
                        break
                    self.pos = end
                elif c == "\\":
                    self.pos += 1
                self.pos += 1
        except ValueError:
            pass  # not arithmetic after all; the subshell reading reports the real error
        self.pos, out_len, self.nesting = saved
        del self.out[out_len:]
        # Remembered, so that `$(($((...` does not retry each level exponentially often.
        self._not_arithmetic.add(body)
        return False

    def _read_array(self) -> None:
        """Read the `(a b c)` of a bash array assignment, recording substitutions."""
        start = self.pos
        self.pos += 1
        while True:
            self._skip_blanks()
            c = self._char()
            if c == "":
                raise ValueError(f"unbalanced '(' in array assignment at offset {start}")
            if c == ")":
                self.pos += 1
                return
            if c == "\n":
                self._consume_newline()
            else:
                self.read_word()
                if self.pos < len(self.src) and self._char() in _METACHARS and self._char() not in ")\n":
                    self.pos += 1  # a stray operator inside the list; bash would refuse it

    def _read_heredoc(self, delimiter: str, strip_tabs: bool, expand: bool) -> None:
        """Consume a here-document body; an unquoted delimiter means $ and ` still work."""
        src = self.src
        body_start = self.pos
        while self.pos < len(src):
            end = src.find("\n", self.pos)
            line_end = len(src) if end < 0 else end
            line = src[self.pos : line_end]
            self.pos = line_end + 1 if end >= 0 else line_end
            if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                body_end = line_end - len(line)
                break
        else:
            body_end = len(src)  # like bash: an unterminated here-document runs to the end
        if expand:
            scanner = _Parser(src[body_start:body_end], self.out, self.depth, self.nesting)
            scanner._scan_expansions()

    def _scan_expansions(self) -> None:
        """Record the commands of every $(...) and `...` in text that is not shell code."""
        scratch = _Word()
        while self.pos < len(self.src):
            c = self.src[self.pos]
            if c == "\\":
                self.pos += 2
            elif c == "$":
                self._read_dollar(scratch, [], in_dquote=True)
            elif c == "`":
                self._read_backquote(in_dquote=True)
            else:
                self.pos += 1

    def _nested_list(self) -> None:
        """Parse a list up to its closing `)`: $(...), <(...), >(...) and subshells."""
        start = self.pos
        self._enter()
        if self.parse_list(frozenset({")"}), frozenset()) is None:
            raise ValueError(f"unbalanced parentheses: '(' at offset {start - 1} is never closed")
        self._leave()

    # ----------------------------------------------------------------- grammar

    def parse_list(self, stop_ops: frozenset[str], stop_words: frozenset[str]) -> str | None:
        """Parse commands until one of `stop_ops` / `stop_words` (returned) or the end (None).

        Separators (`;` `&` `&&` `||` `|` newline) only divide simple commands here;
        the blacklist needs each command word, not how they are combined.
        """
        while True:
            self._skip_blanks()
            if self._at_end():
                return None
            op = self._peek_op()
            if op is not None and op in stop_ops:
                self.pos += len(op)
                return op
            if op == "\n":
                self._consume_newline()
            elif op in (";", "&", "&&", "||", "|", "|&"):
                self.pos += len(op)
            elif op == ")":
                raise ValueError(f"unbalanced parentheses: ')' at offset {self.pos} has no matching '('")
            elif op in _CASE_ENDS:
                raise ValueError(f"'{op}' at offset {self.pos} is outside a case statement")
            elif op == "(":
                if not (self._char(1) == "(" and self._try_arithmetic(self.pos + 2)):
                    self.pos += 1
                    self._nested_list()  # a subshell
            else:
                start = self.pos
                stop = self._parse_simple(stop_words)
                if stop is not None:
                    return stop
                if self.pos == start:  # a guard: every step must consume something
                    raise ValueError(f"unexpected {self.src[start]!r} at offset {start}")

    def _parse_simple(self, stop_words: frozenset[str]) -> str | None:
        """Parse one simple command (or step over a reserved word) and analyse it."""
        argv: list[_Word] = []
        while True:
            self._skip_blanks()
            if self._at_end():
                break
            redirection = self._peek_redirection()
            if redirection is not None:
                op, length = redirection
                self.pos += length
                self._skip_blanks()
                c = self._char()
                if c == "" or (c in _METACHARS and not (c in "<>" and self._char(1) == "(")):
                    raise ValueError(f"redirection '{op}' at offset {self.pos} has no target")
                target = self.read_word()
                if op in ("<<", "<<-"):
                    self.heredocs.append((target.value, op == "<<-", not (target.quoted or target.dynamic)))
                continue
            op = self._peek_op()
            if op in ("<", ">") and self._char(1) == "(":
                op = None  # a process substitution: a word
            if op is not None:
                if op == "(" and len(argv) == 1 and argv[0].static and self._function_parens():
                    return None  # `name () body`: the body is parsed as the next command
                break
            word = self.read_word()
            if argv:
                argv.append(word)
                continue
            # Command position: skip assignments, step over or handle reserved words.
            if word.assign:
                continue
            if word.plain:
                value = word.value
                if value in stop_words:
                    return value
                if value in _TRANSPARENT:
                    continue
                special = _RESERVED.get(value)
                if special is not None:
                    special(self)
                    return None
            argv.append(word)
        self._analyse(argv)
        return None

    def _parse_for(self) -> None:
        """After `for`/`select`: the loop variable and word list are not commands."""
        self._skip_blanks()
        if self.src.startswith("((", self.pos) and self._try_arithmetic(self.pos + 2):
            return  # for ((i = 0; i < n; i++))
        self.read_word()  # the variable name
        self._skip_blanks_and_newlines()
        if not self._peek_literal("in"):
            return  # `for x do ...`: the parser steps over `do` as a reserved word
        self.pos += 2
        while True:  # the word list, up to `;` or a newline
            self._skip_blanks()
            if self._at_end() or self._peek_op() is not None:
                return
            self.read_word()

    def _parse_case(self) -> None:
        """`case WORD in [(]PATTERN[|PATTERN]...) LIST ;; ... esac`.

        Patterns are read here so that their `)` is not taken for the end of a
        substitution; each item's body is an ordinary list.
        """
        start = self.pos
        self._enter()
        self._skip_blanks()
        self.read_word()  # the subject
        self._skip_blanks_and_newlines()
        if self._peek_literal("in"):
            self.pos += 2
        while True:
            self._skip_blanks_and_newlines()
            if self._at_end():
                raise ValueError(f"'case' before offset {start} has no matching 'esac'")
            if self._peek_literal("esac"):
                self.pos += 4
                self._leave()
                return
            if self._char() == "(":
                self.pos += 1
            while True:  # PATTERN | PATTERN ... )
                self._skip_blanks()
                if self._at_end():
                    raise ValueError(f"'case' before offset {start} has no matching 'esac'")
                op = self._peek_op()
                if op == ")":
                    self.pos += 1
                    break
                if op == "|":
                    self.pos += 1
                    continue
                if op is not None:
                    shown = "newline" if op == "\n" else op
                    raise ValueError(f"unexpected '{shown}' in a case pattern at offset {self.pos}")
                self.read_word()
            stop = self.parse_list(_CASE_ENDS, frozenset({"esac"}))
            if stop is None:
                raise ValueError(f"'case' before offset {start} has no matching 'esac'")
            if stop == "esac":
                self._leave()
                return

    def _skip_blanks_and_newlines(self) -> None:
        self._skip_blanks()
        while self._char() == "\n":
            self._consume_newline()
            self._skip_blanks()

    def _parse_test(self) -> None:
        """`[[ ... ]]` holds an expression, not commands: read up to the closing `]]`."""
        start = self.pos
        while True:
            self._skip_blanks_and_newlines()
            if self._at_end():
                raise ValueError(f"'[[' before offset {start} has no matching ']]'")
            op = self._peek_op()
            if op is not None and not (op in "<>" and self._char(1) == "("):
                self.pos += len(op)
                continue
            word = self.read_word()
            if word.plain and word.value == "]]":
                return

    def _parse_function(self) -> None:
        """`function NAME [()]`: the name is not a command; the body follows."""
        self._skip_blanks()
        self.read_word()
        self._skip_blanks()
        if self._char() == "(":
            self._function_parens()

    def _function_parens(self) -> bool:
        """Consume the `()` of a function definition `name ()`; False if it is not one."""
        i = self.pos + 1
        while i < len(self.src) and self.src[i] in _BLANKS:
            i += 1
        if i < len(self.src) and self.src[i] == ")":
            self.pos = i + 1
            return True
        return False

    def _analyse(self, argv: list[_Word]) -> None:
        """Record the command word of `argv`, then of any command it wraps."""
        while argv:
            head = argv[0]
            if not head.static:
                self.out.append(DYNAMIC)
                return
            name = posixpath.basename(head.value.rstrip("/")) or head.value
            self.out.append(name)
            handler = _WRAPPERS.get(name)
            if handler is None:
                return
            nxt = handler(self, argv[1:])
            if nxt is None:
                return
            argv = nxt


# --------------------------------------------------------------------- wrappers
#
# A wrapper is a command whose arguments contain another command. Each handler gets
# the wrapper's arguments and returns the wrapped argv (analysed in turn, so wrappers
# of wrappers work), or None after recording what it found itself.

_Handler = Callable[[_Parser, list[_Word]], "list[_Word] | None"]


def _skip_options(args: list[_Word], short_arg: str = "", long_arg: frozenset[str] = frozenset()) -> int:
    """Index of the first operand after getopt-style options.

    `short_arg` lists short options that take an argument (attached or as the next
    word); `long_arg` lists long options that take one (`--opt=V` or `--opt V`). A
    word whose value is unknown ends the options: it is then taken as the command,
    which reports it as dynamic rather than skipping something that may run.
    """
    i = 0
    while i < len(args):
        word = args[i]
        value = word.value
        if not word.static or value == "-" or not value.startswith("-"):
            return i
        if value == "--":
            return i + 1
        i += 1
        if value.startswith("--"):
            if "=" not in value and value in long_arg:
                i += 1
            continue
        for k, flag in enumerate(value[1:]):
            if flag in short_arg:
                if k == len(value) - 2:  # the argument is the next word
                    i += 1
                break
    return i


def _options_then_command(short_arg: str = "", long_arg: frozenset[str] = frozenset(), operands: int = 0) -> _Handler:
    """A handler for `wrapper [options] [N operands] command ...`."""

    def handler(parser: _Parser, args: list[_Word]) -> list[_Word] | None:
        return args[_skip_options(args, short_arg, long_arg) + operands :]

    return handler


def _env(parser: _Parser, args: list[_Word]) -> list[_Word] | None:
    """`env [-i] [-u NAME] [-C DIR] [-S STRING] [NAME=V]... command`."""
    long_arg = frozenset({"--unset", "--chdir", "--argv0", "--split-string"})
    i = 0
    while i < len(args):
        word, value = args[i], args[i].value
        if not word.static or not value.startswith("-"):
            break
        i += 1
        if value == "--":
            break
        split: _Word | None = None  # -S STRING: split into the command and its first args
        if value.startswith("--"):
            key = value.split("=", 1)[0]
            if key == "--split-string":
                split = _Word(value.split("=", 1)[1]) if "=" in value else (args[i] if i < len(args) else _Word())
            elif "=" not in value and key in long_arg:
                i += 1
        else:
            for k, flag in enumerate(value[1:]):
                attached = value[k + 2 :]
                if flag == "S":
                    split = _Word(attached) if attached else (args[i] if i < len(args) else _Word())
                    break
                if flag in "uCPa":
                    if not attached:
                        i += 1
                    break
        if split is not None:
            if not split.static:
                parser.out.append(DYNAMIC)
            else:
                parser._reparse(split.value)
            return None
    while i < len(args) and args[i].static and "=" in args[i].value:
        i += 1  # env takes every NAME=V word as an assignment, quoted or not
    return args[i:]


def _sudo(parser: _Parser, args: list[_Word]) -> list[_Word] | None:
    """`sudo [options] [NAME=V]... command`."""
    long_arg = frozenset({"--user", "--group", "--close-from", "--chdir", "--prompt", "--role",
                          "--type", "--command-timeout", "--other-user", "--chroot", "--host"})
    i = _skip_options(args, "ugCDprtTUR", long_arg)
    while i < len(args) and args[i].assign:
        i += 1
    return args[i:]


def _timeout(parser: _Parser, args: list[_Word]) -> list[_Word] | None:
    """`timeout [options] DURATION command`."""
    i = _skip_options(args, "sk", frozenset({"--signal", "--kill-after"}))
    return args[i + 1 :]


def _chroot(parser: _Parser, args: list[_Word]) -> list[_Word] | None:
    """`chroot [options] DIR [command]` (no command runs an interactive shell)."""
    i = _skip_options(args, "", frozenset({"--userspec", "--groups"}))
    return args[i + 1 :]


def _xargs(parser: _Parser, args: list[_Word]) -> list[_Word] | None:
    """`xargs [options] [command]`: the command defaults to echo; with -I R an R in the
    command word is replaced by input, so that word is unknown."""
    long_arg = frozenset({"--arg-file", "--delimiter", "--max-lines", "--max-args", "--max-procs",
                          "--max-chars", "--process-slot-var"})
    replace: str | None = None
    i = 0
    while i < len(args):
        word, value = args[i], args[i].value
        if not word.static or value == "-" or not value.startswith("-"):
            break
        i += 1
        if value == "--":
            break
        if value.startswith("--"):
            if value.startswith("--replace"):
                replace = value.split("=", 1)[1] if "=" in value else "{}"
            elif "=" not in value and value in long_arg:
                i += 1
            continue
        for k, flag in enumerate(value[1:]):
            attached = value[k + 2 :]
            if flag == "I":
                if attached:
                    replace = attached
                elif i < len(args):
                    replace = args[i].value
                    i += 1
                break
            if flag == "i":
                replace = attached or "{}"
                break
            if flag in "adELnPs":
                if not attached:
                    i += 1
                break
            if flag in "el":
                break  # optional argument, attached only
    rest = args[i:]
    if not rest:
        parser.out.append("echo")
        return None
    if replace and replace in rest[0].value:
        parser.out.append(DYNAMIC)
        return None
    return rest


def _find(parser: _Parser, args: list[_Word]) -> list[_Word] | None:
    """`find ... -exec command ... ;` (also -execdir, -ok, -okdir, ending in `;` or `+`)."""
    i = 0
    while i < len(args):
        if args[i].static and args[i].value in ("-exec", "-execdir", "-ok", "-okdir"):
            j = i + 1
            while j < len(args) and not (args[j].static and args[j].value in (";", "+")):
                j += 1
            sub = args[i + 1 : j]
            if sub and "{}" in sub[0].value:
                parser.out.append(DYNAMIC)  # the found file itself is run
            else:
                parser._analyse(sub)
            i = j
        i += 1
    return None


_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "yash", "posh", "rbash", "fish"})


def _shell(parser: _Parser, args: list[_Word]) -> list[_Word] | None:
    """`sh [options] -c STRING [name [args]]`: STRING is shell code, parsed in turn.

    Without -c a shell runs a script file or standard input, which cannot be seen here.
    """
    has_c = False
    i = 0
    while i < len(args):
        word, value = args[i], args[i].value
        if not word.static:
            break
        if value in ("--", "-"):
            i += 1
            break
        if len(value) < 2 or value[0] not in "-+":
            break
        i += 1
        if value.startswith("--"):
            if value in ("--rcfile", "--init-file"):
                i += 1
            elif value == "--command":
                has_c = True
            continue
        flags = value[1:]
        has_c = has_c or "c" in flags
        i += sum(1 for f in flags if f in "oO")  # -o OPTION, -O SHOPT
    if has_c:
        if i >= len(args):
            return None
        if not args[i].static:
            parser.out.append(DYNAMIC)
        else:
            parser._reparse(args[i].value)
    return None


def _eval(parser: _Parser, args: list[_Word]) -> list[_Word] | None:
    """`eval ARGS...`: the arguments, joined by spaces, are shell code."""
    if any(not a.static for a in args):
        parser.out.append(DYNAMIC)
    elif args:
        parser._reparse(" ".join(a.value for a in args))
    return None


def _trap(parser: _Parser, args: list[_Word]) -> list[_Word] | None:
    """`trap [--] ACTION SIGNAL...`: ACTION is shell code run later."""
    i = 1 if args and args[0].static and args[0].value == "--" else 0
    if len(args) - i >= 2:
        if not args[i].static:
            parser.out.append(DYNAMIC)
        elif not args[i].value.startswith("-") or args[i].value == "-":
            parser._reparse(args[i].value if args[i].value != "-" else "")
    return None


def _alias(parser: _Parser, args: list[_Word]) -> list[_Word] | None:
    """`alias NAME=VALUE`: VALUE replaces NAME at the start of later commands."""
    for word in args:
        if "=" in word.value:
            if not word.static:
                parser.out.append(DYNAMIC)
            else:
                parser._reparse(word.value.split("=", 1)[1])
    return None


def _watch(parser: _Parser, args: list[_Word]) -> list[_Word] | None:
    """`watch [options] command...`: joined and run with `sh -c`, unless -x/--exec."""
    i = _skip_options(args, "nq", frozenset({"--interval", "--equexit", "--differences"}))
    exec_mode = any(a.value in ("-x", "--exec") or (a.value.startswith("-") and not a.value.startswith("--")
                                                     and "x" in a.value) for a in args[:i])
    rest = args[i:]
    if exec_mode:
        return rest
    return _eval(parser, rest)


def _su(parser: _Parser, args: list[_Word]) -> list[_Word] | None:
    """`su [options] [user] -c STRING` (also runuser): STRING is shell code."""
    for k, word in enumerate(args):
        value = word.value
        if value in ("-c", "--command", "--session-command") and k + 1 < len(args):
            string = args[k + 1]
        elif value.startswith(("--command=", "--session-command=")):
            string = _Word(value.split("=", 1)[1], dynamic=not word.static)
        else:
            continue
        if not string.static:
            parser.out.append(DYNAMIC)
        else:
            parser._reparse(string.value)
    return None


def _flock(parser: _Parser, args: list[_Word]) -> list[_Word] | None:
    """`flock [options] FILE command...` or `flock [options] FILE -c STRING`."""
    i = _skip_options(args, "wE", frozenset({"--timeout", "--conflict-exit-code"}))
    rest = args[i + 1 :]
    if rest and rest[0].value in ("-c", "--command"):
        return _su(parser, rest)
    return rest


def _taskset(parser: _Parser, args: list[_Word]) -> list[_Word] | None:
    """`taskset [-c] MASK command...`; with -p it changes a running process."""
    i = _skip_options(args)
    if any(a.value.startswith("-") and not a.value.startswith("--") and "p" in a.value for a in args[:i]):
        return None
    return args[i + 1 :]


_WRAPPERS: dict[str, _Handler] = {
    "env": _env,
    "sudo": _sudo,
    "doas": _options_then_command("uC"),
    "nice": _options_then_command("n", frozenset({"--adjustment"})),
    "nohup": _options_then_command(),
    "time": _options_then_command("fo", frozenset({"--format", "--output"})),
    "timeout": _timeout,
    "xargs": _xargs,
    "exec": _options_then_command("a"),
    "command": _options_then_command(),
    "builtin": _options_then_command(),
    "coproc": _options_then_command(),
    "stdbuf": _options_then_command("ioe", frozenset({"--input", "--output", "--error"})),
    "setsid": _options_then_command(),
    "chroot": _chroot,
    "busybox": _options_then_command(),
    "ionice": _options_then_command("cnP", frozenset({"--class", "--classdata"})),
    "find": _find,
    "eval": _eval,
    "trap": _trap,
    "alias": _alias,
    "watch": _watch,
    "su": _su,
    "runuser": _su,
    "flock": _flock,
    "taskset": _taskset,
    **{shell: _shell for shell in _SHELLS},
}

_RESERVED: dict[str, Callable[[_Parser], None]] = {
    "for": _Parser._parse_for,
    "select": _Parser._parse_for,
    "case": _Parser._parse_case,
    "[[": _Parser._parse_test,
    "function": _Parser._parse_function,
}


def command_words(line: str) -> list[str]:
    """Every command word that running `line` in a POSIX shell may execute.

    Words are given as basenames with quoting removed (`"/bin/r\\m"` gives `rm`), in
    the order they are met; a command word whose value is only known at run time
    (`$CMD`, `$(...)`, a glob or brace expansion) is given as `DYNAMIC`
    (`"<dynamic>"`). Raises ValueError for unbalanced quotes or parentheses, and for
    shell code nested (through `sh -c`, `eval`, backquotes) more than `MAX_DEPTH` deep.
    """
    out: list[str] = []
    parser = _Parser(line, out)
    parser.parse_list(frozenset(), frozenset())
    if parser.heredocs:  # a here-document on the last line has an empty body
        parser.heredocs = []
    return out


# --------------------------------------------------------------------- the tool


class TerminalTool(Tool):
    """Run a shell command (`/bin/sh -c`) inside a kernel-confined sandbox.

    The sandbox (`SandboxManager` under the given `CapabilityDeclaration`, by default
    one that allows nothing extra) is what keeps the command in bounds. The blacklist
    is only a convenience on top of it, never instead of it: it refuses, before
    anything runs, a command line in which any command word (found by `command_words`,
    through pipes, substitutions, `sh -c`, `sudo`, `find -exec` and the like) is
    blacklisted or is computed at run time. A name matches in any letter case, and
    `NAME.suffix` matches NAME (`mkfs.ext4`). Scripts, interpreters (`python -c`) and
    renamed copies of a program are not seen by it; the confinement still applies.

    The sandbox is created on first use and kept for later calls; `close()` (or a
    `with` block) destroys it when this tool created the manager.
    """

    name = "terminal"
    description = "Execute a shell command in the sandbox."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "Shell command to execute."}},
        "required": ["command"],
    }

    def __init__(
        self,
        *,
        blacklist: frozenset[str] | None = None,
        timeout: float = 30.0,
        policy: CapabilityDeclaration | None = None,
        manager: SandboxManager | None = None,
        cwd: str | None = None,
    ) -> None:
        self.blacklist: frozenset[str] = DEFAULT_BLACKLIST if blacklist is None else frozenset(blacklist)
        self._blocked_names = frozenset(name.lower() for name in self.blacklist)
        self.timeout = timeout
        self.policy = policy
        self.cwd = cwd
        self._manager = manager
        self._owns_manager = manager is None
        self._sandbox_id: str | None = None
        self._lock = threading.Lock()

    @property
    def platform(self) -> str:
        return sys.platform

    def is_blocked(self, word: str) -> bool:
        """Whether a command word (as given by `command_words`) is on the blacklist."""
        lowered = word.lower()
        return lowered in self._blocked_names or lowered.split(".", 1)[0] in self._blocked_names

    def check(self, command: str) -> list[str]:
        """The command words of `command`; ToolError if the blacklist refuses it."""
        try:
            words = command_words(command)
        except ValueError as exc:
            raise ToolError(f"Cannot parse the command: {exc}") from exc
        for word in words:
            if word != DYNAMIC and self.is_blocked(word):
                raise ToolError(f"Command '{word}' is blocked")
        if DYNAMIC in words:
            raise ToolError(
                "A command word is computed at run time (from a variable, $(...), backquotes, "
                "a glob or a brace expansion), so it cannot be checked against the blacklist; "
                "write the command name literally."
            )
        return words

    async def execute(self, **kwargs: Any) -> dict[str, Any]:
        command = kwargs.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ToolError("'command' is required and must be a non-empty string.")
        self.check(command)
        manager, sandbox_id = await asyncio.to_thread(self._sandbox)
        result = await asyncio.to_thread(
            manager.execute, sandbox_id, ["/bin/sh", "-c", command], timeout=self.timeout, cwd=self.cwd
        )
        killed = getattr(result, "killed", None)
        if killed and str(killed).startswith("timeout"):
            raise ToolError(f"Command timed out after {self.timeout} s")
        return {
            "exit_code": result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "platform": self.platform,
        }

    def _sandbox(self) -> tuple[SandboxManager, str]:
        """The manager and sandbox, created on first use (once, even under concurrent calls)."""
        with self._lock:
            if self._manager is None:
                from .manager import SandboxManager

                self._manager = SandboxManager()
            if self._sandbox_id is None:
                if self.policy is None:
                    from ..policy.models import CapabilityDeclaration

                    self.policy = CapabilityDeclaration()
                self._sandbox_id = self._manager.create_sandbox(self.policy)
            return self._manager, self._sandbox_id

    def close(self) -> None:
        """Destroy the sandbox and stop the manager, if this tool created the manager
        (a caller's manager, and the sandboxes in it, stay the caller's to manage).
        A later `execute` starts afresh."""
        with self._lock:
            if not self._owns_manager or self._manager is None:
                return
            manager, sandbox_id = self._manager, self._sandbox_id
            self._manager = self._sandbox_id = None
            try:
                if sandbox_id is not None:
                    manager.destroy(sandbox_id)
            finally:
                manager.close()

    def __enter__(self) -> TerminalTool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
