"""The wrapper table: commands whose arguments hold another command, and how to find it.

A wrapper is a command such as `sudo`, `env`, `xargs`, `find -exec` or `sh -c`. Each handler
gets the wrapper's arguments and returns the wrapped argv (analysed in turn, so wrappers of
wrappers work), or None after recording what it found itself (a string run as shell code is
parsed again, at most `MAX_DEPTH` deep). `command_words` is the parser (`shell_words.py`) run
with this table.
"""

from __future__ import annotations

from .shell_words import DYNAMIC, Handler, ShellParser, ShellWord

__all__ = ["WRAPPERS", "command_words"]


def _skip_options(args: list[ShellWord], short_arg: str = "", long_arg: frozenset[str] = frozenset()) -> int:
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


def _options_then_command(short_arg: str = "", long_arg: frozenset[str] = frozenset(), operands: int = 0) -> Handler:
    """A handler for `wrapper [options] [N operands] command ...`."""

    def handler(parser: ShellParser, args: list[ShellWord]) -> list[ShellWord] | None:
        return args[_skip_options(args, short_arg, long_arg) + operands :]

    return handler


def _env(parser: ShellParser, args: list[ShellWord]) -> list[ShellWord] | None:
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
        split: ShellWord | None = None  # -S STRING: split into the command and its first args
        if value.startswith("--"):
            key = value.split("=", 1)[0]
            if key == "--split-string":
                split = ShellWord(value.split("=", 1)[1]) if "=" in value else (args[i] if i < len(args) else ShellWord())
            elif "=" not in value and key in long_arg:
                i += 1
        else:
            for k, flag in enumerate(value[1:]):
                attached = value[k + 2 :]
                if flag == "S":
                    split = ShellWord(attached) if attached else (args[i] if i < len(args) else ShellWord())
                    break
                if flag in "uCPa":
                    if not attached:
                        i += 1
                    break
        if split is not None:
            if not split.static:
                parser.out.append(DYNAMIC)
            else:
                parser.reparse(split.value)
            return None
    while i < len(args) and args[i].static and "=" in args[i].value:
        i += 1  # env takes every NAME=V word as an assignment, quoted or not
    return args[i:]


def _sudo(parser: ShellParser, args: list[ShellWord]) -> list[ShellWord] | None:
    """`sudo [options] [NAME=V]... command`."""
    long_arg = frozenset({"--user", "--group", "--close-from", "--chdir", "--prompt", "--role",
                          "--type", "--command-timeout", "--other-user", "--chroot", "--host"})
    i = _skip_options(args, "ugCDprtTUR", long_arg)
    while i < len(args) and args[i].assign:
        i += 1
    return args[i:]


def _timeout(parser: ShellParser, args: list[ShellWord]) -> list[ShellWord] | None:
    """`timeout [options] DURATION command`."""
    i = _skip_options(args, "sk", frozenset({"--signal", "--kill-after"}))
    return args[i + 1 :]


def _chroot(parser: ShellParser, args: list[ShellWord]) -> list[ShellWord] | None:
    """`chroot [options] DIR [command]` (no command runs an interactive shell)."""
    i = _skip_options(args, "", frozenset({"--userspec", "--groups"}))
    return args[i + 1 :]


def _xargs(parser: ShellParser, args: list[ShellWord]) -> list[ShellWord] | None:
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


def _find(parser: ShellParser, args: list[ShellWord]) -> list[ShellWord] | None:
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
                parser.analyse(sub)
            i = j
        i += 1
    return None


_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "yash", "posh", "rbash", "fish"})


def _shell(parser: ShellParser, args: list[ShellWord]) -> list[ShellWord] | None:
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
            parser.reparse(args[i].value)
    return None


def _eval(parser: ShellParser, args: list[ShellWord]) -> list[ShellWord] | None:
    """`eval ARGS...`: the arguments, joined by spaces, are shell code."""
    if any(not a.static for a in args):
        parser.out.append(DYNAMIC)
    elif args:
        parser.reparse(" ".join(a.value for a in args))
    return None


def _trap(parser: ShellParser, args: list[ShellWord]) -> list[ShellWord] | None:
    """`trap [--] ACTION SIGNAL...`: ACTION is shell code run later."""
    i = 1 if args and args[0].static and args[0].value == "--" else 0
    if len(args) - i >= 2:
        if not args[i].static:
            parser.out.append(DYNAMIC)
        elif not args[i].value.startswith("-") or args[i].value == "-":
            parser.reparse(args[i].value if args[i].value != "-" else "")
    return None


def _alias(parser: ShellParser, args: list[ShellWord]) -> list[ShellWord] | None:
    """`alias NAME=VALUE`: VALUE replaces NAME at the start of later commands."""
    for word in args:
        if "=" in word.value:
            if not word.static:
                parser.out.append(DYNAMIC)
            else:
                parser.reparse(word.value.split("=", 1)[1])
    return None


def _watch(parser: ShellParser, args: list[ShellWord]) -> list[ShellWord] | None:
    """`watch [options] command...`: joined and run with `sh -c`, unless -x/--exec."""
    i = _skip_options(args, "nq", frozenset({"--interval", "--equexit", "--differences"}))
    exec_mode = any(a.value in ("-x", "--exec") or (a.value.startswith("-") and not a.value.startswith("--")
                                                     and "x" in a.value) for a in args[:i])
    rest = args[i:]
    if exec_mode:
        return rest
    return _eval(parser, rest)


def _su(parser: ShellParser, args: list[ShellWord]) -> list[ShellWord] | None:
    """`su [options] [user] -c STRING` (also runuser): STRING is shell code."""
    for k, word in enumerate(args):
        value = word.value
        if value in ("-c", "--command", "--session-command") and k + 1 < len(args):
            string = args[k + 1]
        elif value.startswith(("--command=", "--session-command=")):
            string = ShellWord(value.split("=", 1)[1], dynamic=not word.static)
        else:
            continue
        if not string.static:
            parser.out.append(DYNAMIC)
        else:
            parser.reparse(string.value)
    return None


def _flock(parser: ShellParser, args: list[ShellWord]) -> list[ShellWord] | None:
    """`flock [options] FILE command...` or `flock [options] FILE -c STRING`."""
    i = _skip_options(args, "wE", frozenset({"--timeout", "--conflict-exit-code"}))
    rest = args[i + 1 :]
    if rest and rest[0].value in ("-c", "--command"):
        return _su(parser, rest)
    return rest


def _taskset(parser: ShellParser, args: list[ShellWord]) -> list[ShellWord] | None:
    """`taskset [-c] MASK command...`; with -p it changes a running process."""
    i = _skip_options(args)
    if any(a.value.startswith("-") and not a.value.startswith("--") and "p" in a.value for a in args[:i]):
        return None
    return args[i + 1 :]


WRAPPERS: dict[str, Handler] = {
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


def command_words(line: str) -> list[str]:
    """Every command word that running `line` in a POSIX shell may execute.

    Words are given as basenames with quoting removed (`"/bin/r\\m"` gives `rm`), in
    the order they are met; a command word whose value is only known at run time
    (`$CMD`, `$(...)`, a glob or brace expansion) is given as `DYNAMIC`
    (`"<dynamic>"`). Raises ValueError for unbalanced quotes or parentheses, and for
    shell code nested (through `sh -c`, `eval`, backquotes) more than `MAX_DEPTH` deep.
    """
    out: list[str] = []
    parser = ShellParser(line, out, WRAPPERS)
    parser.parse_list(frozenset(), frozenset())
    if parser.heredocs:  # a here-document on the last line has an empty body
        parser.heredocs = []
    return out
