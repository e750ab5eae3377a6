"""A shell parser that finds every command word a line may run.

`ShellParser` reads a line the way a POSIX shell would, plus the common bash forms, and
records the command word of every simple command in it: through lists and pipelines,
subshells, `$(...)`, backquotes and process substitution, `case`, `for`, `[[ ]]`,
`$((...))`, function bodies, and `$(...)` inside unquoted here-documents. A word whose
value is only known at run time is recorded as `DYNAMIC`. What a command does with its own
arguments (`sudo CMD`, `sh -c STRING`, `find -exec`) is the wrapper table's business
(`shell_wrappers.py`), handed to the parser, so the grammar and the knowledge of programs
stay apart. (A general-purpose library such as bashlex fails on `case`, `$((...))` and
`[[ ]]`, and misses `$(...)` in here-documents, so the parser is ours.)

Its limits, by design: it does not expand anything (variables, globs, braces, tilde), so a
computed command word is only reported as dynamic; it does not remember definitions from
earlier in the line (`alias`, functions, `PATH=`), so a function named `ls` that runs `rm`
reports `ls` where it is defined and called, and `rm` inside its body; it knows the wrappers
in the table and no others (`strace rm` reports only `strace`); and it never reads files (a
script run by name or `source`d reports its name only). None of this matters for safety:
the command runs under the sandbox's confinement whatever the parser found.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

__all__ = ["DYNAMIC", "MAX_DEPTH", "MAX_NESTING", "Handler", "ShellParser", "ShellWord"]

#: Reported in place of a command word whose value is only known at run time.
DYNAMIC = "<dynamic>"

#: How many times a string may be re-parsed as shell code (`sh -c`, `eval`, backquotes).
MAX_DEPTH = 8

#: How deeply `( )`, `$( )`, `${ }` and `case` may nest inside one string; this keeps
#: the recursive parser far from Python's recursion limit.
MAX_NESTING = 64

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
class ShellWord:
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


class ShellParser:
    """Recursive-descent reader of one shell string; appends command words to `out`.

    It shares one position over the source, so a `$(` met inside a word is parsed in
    place by the same code that parses the top level: nesting, quotes inside
    substitutions and `case` patterns all come out right without a separate tokenizer
    pass. Only operators are peeked; words are read once, because reading a word also
    records the commands of the substitutions inside it.
    """

    def __init__(self, src: str, out: list[str], wrappers: Mapping[str, Handler],
                 depth: int = 0, nesting: int = 0) -> None:
        self.src = src
        self.wrappers = wrappers
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

    def reparse(self, text: str) -> None:
        """Parse `text` as shell code run by this command (sh -c, eval, backquotes)."""
        if self.depth + 1 > MAX_DEPTH:
            raise ValueError(
                f"command is nested more than {MAX_DEPTH} levels deep "
                "(sh -c, eval or backquotes inside each other)"
            )
        child = ShellParser(text, self.out, self.wrappers, self.depth + 1, self.nesting)
        child.parse_list(frozenset(), frozenset())

    # ----------------------------------------------------------------- words

    def read_word(self) -> ShellWord:
        """Read one word from the current position, removing quotes.

        Substitutions inside the word are parsed on the spot, so their commands are
        recorded even when the word itself is an argument or a redirection target.
        """
        src = self.src
        w = ShellWord()
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

    def _read_dquote(self, w: ShellWord, buf: list[str]) -> None:
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

    def _read_dollar(self, w: ShellWord, buf: list[str], *, in_dquote: bool) -> None:
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
        scratch = ShellWord()
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
                self.reparse("".join(inner))
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
        scratch = ShellWord()
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
            scanner = ShellParser(src[body_start:body_end], self.out, self.wrappers, self.depth,
                                  self.nesting)
            scanner._scan_expansions()

    def _scan_expansions(self) -> None:
        """Record the commands of every $(...) and `...` in text that is not shell code."""
        scratch = ShellWord()
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
        argv: list[ShellWord] = []
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
        self.analyse(argv)
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

    def analyse(self, argv: list[ShellWord]) -> None:
        """Record the command word of `argv`, then of any command it wraps."""
        while argv:
            head = argv[0]
            if not head.static:
                self.out.append(DYNAMIC)
                return
            name = posixpath.basename(head.value.rstrip("/")) or head.value
            self.out.append(name)
            handler = self.wrappers.get(name)
            if handler is None:
                return
            nxt = handler(self, argv[1:])
            if nxt is None:
                return
            argv = nxt


_RESERVED: dict[str, Callable[[ShellParser], None]] = {
    "for": ShellParser._parse_for,
    "select": ShellParser._parse_for,
    "case": ShellParser._parse_case,
    "[[": ShellParser._parse_test,
    "function": ShellParser._parse_function,
}


#: A wrapper's handler: given the parser and the wrapper's arguments, the wrapped argv
#: (analysed in turn), or None after recording what it found itself.
Handler = Callable[[ShellParser, "list[ShellWord]"], "list[ShellWord] | None"]

