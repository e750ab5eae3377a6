"""`command_words` (pure parsing) and TerminalTool's blacklist refusals.

Nothing here runs a command: the refusals happen before a SandboxManager is created.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from sandbox_kernel_ext.policy.errors import ToolError
from sandbox_kernel_ext.tools.shell_words import DYNAMIC, MAX_DEPTH
from sandbox_kernel_ext.tools.shell_wrappers import command_words
from sandbox_kernel_ext.tools.terminal import DEFAULT_BLACKLIST, TerminalTool


def words(line: str) -> list[str]:
    return command_words(line)


def has(line: str, word: str) -> bool:
    return word in command_words(line)


# --------------------------------------------------------------------- the seed's bypasses


@pytest.mark.parametrize(
    "line",
    [
        "env rm x",
        "$(rm x)",
        "a;rm x",
        "sh -c 'rm x'",
        r"find . -exec rm {} \;",
        "/bin/rm x",
        r"r\m x",
        '"rm" x',
        "'rm' x",
        "echo $(echo $(rm))",
        'bash -c "echo; rm -rf /"',
    ],
)
def test_seed_bypasses_are_found(line: str) -> None:
    assert "rm" in words(line)


def test_seed_bypass_results_exactly() -> None:
    assert words("env rm x") == ["env", "rm"]
    assert words("a;rm x") == ["a", "rm"]
    assert words("sh -c 'rm x'") == ["sh", "rm"]
    assert words(r"find . -exec rm {} \;") == ["find", "rm"]
    assert words("/bin/rm -rf /") == ["rm"]
    assert words(r"r\m") == ["rm"]
    assert words('bash -c "echo; rm -rf /"') == ["bash", "echo", "rm"]
    assert sorted(words("echo $(echo $(rm))")) == ["echo", "echo", "rm"]


# --------------------------------------------------------------------- lists and pipelines


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("ls", ["ls"]),
        ("ls -la /tmp", ["ls"]),
        ("a | b", ["a", "b"]),
        ("a|b|c", ["a", "b", "c"]),
        ("a |& b", ["a", "b"]),
        ("a; b", ["a", "b"]),
        ("a && b", ["a", "b"]),
        ("a&&b||c", ["a", "b", "c"]),
        ("a || b", ["a", "b"]),
        ("a & b", ["a", "b"]),
        ("a &", ["a"]),
        ("a\nb\n\nc", ["a", "b", "c"]),
        ("a;;", None),  # `;;` outside case: refused below
    ],
)
def test_lists_and_pipelines(line: str, expected: list[str] | None) -> None:
    if expected is None:
        with pytest.raises(ValueError, match="outside a case"):
            words(line)
    else:
        assert words(line) == expected


def test_empty_and_blank_lines() -> None:
    assert words("") == []
    assert words("   \n\t ") == []
    assert words("# just a comment") == []
    assert words("ls # rm -rf /") == ["ls"]
    assert words("echo a#b; rm x") == ["echo", "rm"]


def test_line_continuation() -> None:
    assert words("r\\\nm x") == ["rm"]
    assert words("echo a \\\n && rm x") == ["echo", "rm"]


# --------------------------------------------------------------------- grouping


def test_subshell_and_braces() -> None:
    assert words("( rm x )") == ["rm"]
    assert words("(rm x)") == ["rm"]
    assert words("(a; (b | c))") == ["a", "b", "c"]
    assert words("{ rm x; }") == ["rm"]
    assert words("{ a; { b; }; } > out") == ["a", "b"]
    assert words("! rm x") == ["rm"]


def test_compound_commands() -> None:
    assert words("if true; then rm x; elif a; then b; else c; fi") == ["true", "rm", "a", "b", "c"]
    assert words("while read l; do rm $l; done < list") == ["read", "rm"]
    assert words("until a; do b; done") == ["a", "b"]
    assert words("for f in a b rm; do echo $f; done") == ["echo"]
    assert words("for f do rm $f; done") == ["rm"]
    assert words("for ((i=0; i<3; i++)); do rm x; done") == ["rm"]
    assert words("select x in a b; do rm $x; done") == ["rm"]
    assert words("case $x in a) rm y;; b|c) ls;; *) echo;; esac") == ["rm", "ls", "echo"]
    assert words("case x in (a) rm y ;; esac; ls") == ["rm", "ls"]
    assert words("echo $(case x in a) rm y;; esac)") == ["rm", "echo"]
    assert words("[[ -f x && $(rm y) ]] && ls") == ["rm", "ls"]
    assert words("(( x > 1 )) && rm y") == ["rm"]
    assert words("f() { rm x; }; f") == ["rm", "f"]
    assert words("function g { rm x; }") == ["rm"]
    assert words("function g() ( rm x )") == ["rm"]


# --------------------------------------------------------------------- substitutions


def test_command_substitution() -> None:
    assert words("echo $(rm x)") == ["rm", "echo"]
    assert words("echo `rm x`") == ["rm", "echo"]
    assert words('echo "$(rm x)"') == ["rm", "echo"]
    assert words('echo "`rm x`"') == ["rm", "echo"]
    assert words("echo ${X:-$(rm x)}") == ["rm", "echo"]
    assert words('x="$(rm y)" ls') == ["rm", "ls"]
    assert words("X=$(rm y)") == ["rm"]
    assert words("ls > $(rm y)") == ["rm", "ls"]
    assert words("echo $((1 + $(rm y)))") == ["rm", "echo"]
    assert words("echo $((1 + 2))") == ["echo"]
    assert words("echo $( (rm x) )") == ["rm", "echo"]


def test_nested_substitutions() -> None:
    assert sorted(words("echo $(echo $(echo $(rm x)))")) == ["echo", "echo", "echo", "rm"]
    assert "rm" in words(r"echo `echo \`rm x\``")
    assert "rm" in words('echo "$(echo "$(rm x)")"')


def test_process_substitution() -> None:
    assert words("diff <(rm x) >(ls)") == ["rm", "ls", "diff"]
    assert words("cat --file=<(rm x)") == ["rm", "cat"]


def test_heredoc_substitutions() -> None:
    assert words("cat <<EOF\n$(rm x)\nEOF\nls") == ["cat", "rm", "ls"]
    assert words("cat <<'EOF'\n$(rm x)\nEOF\nls") == ["cat", "ls"]
    assert words("cat <<-EOF\n\t`rm x`\n\tEOF") == ["cat", "rm"]
    assert words("cat <<< $(rm x)") == ["rm", "cat"]


def test_redirections_are_not_commands() -> None:
    assert words("> out rm x") == ["rm"]
    assert words("2>&1 ls >/dev/null") == ["ls"]
    assert words("ls 2> err 3<in") == ["ls"]
    assert words("ls &> all") == ["ls"]
    with pytest.raises(ValueError, match="no target"):
        words("ls >")


# --------------------------------------------------------------------- assignments


def test_leading_assignments() -> None:
    assert words("X=1 rm x") == ["rm"]
    assert words("X=1 Y='a b' Z+=c rm x") == ["rm"]
    assert words("X=1") == []
    assert words("arr=(a $(rm x) c); ls") == ["rm", "ls"]
    # A quoted or computed NAME= is no assignment: it is the command word.
    assert words('"X=1" ls') == ["X=1"]
    assert words("ls X=1") == ["ls"]


# --------------------------------------------------------------------- wrappers


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("env rm x", ["env", "rm"]),
        ("env -i rm x", ["env", "rm"]),
        ("env -u HOME -i A=1 B=2 rm x", ["env", "rm"]),
        ("env -uHOME rm", ["env", "rm"]),
        ("env -- rm", ["env", "rm"]),
        ("env -C /tmp rm", ["env", "rm"]),
        ("env -S 'rm -rf /'", ["env", "rm"]),
        ("sudo rm x", ["sudo", "rm"]),
        ("sudo -u root -n rm x", ["sudo", "rm"]),
        ("sudo -nu root rm x", ["sudo", "rm"]),
        ("sudo --user=root FOO=1 rm x", ["sudo", "rm"]),
        ("doas -u root rm x", ["doas", "rm"]),
        ("nice rm x", ["nice", "rm"]),
        ("nice -n 10 rm x", ["nice", "rm"]),
        ("nice -10 rm x", ["nice", "rm"]),
        ("nohup rm x &", ["nohup", "rm"]),
        ("time rm x", ["time", "rm"]),
        ("time -p rm x", ["time", "rm"]),
        ("timeout 5 rm x", ["timeout", "rm"]),
        ("timeout -s KILL -k 1 5s rm x", ["timeout", "rm"]),
        ("timeout --signal=TERM 5 rm x", ["timeout", "rm"]),
        ("ls | xargs rm", ["ls", "xargs", "rm"]),
        ("xargs -0 -n 1 -P4 rm", ["xargs", "rm"]),
        ("xargs", ["xargs", "echo"]),
        ("exec rm x", ["exec", "rm"]),
        ("exec -a foo rm x", ["exec", "rm"]),
        ("command rm x", ["command", "rm"]),
        ("command -p rm x", ["command", "rm"]),
        ("builtin kill 1", ["builtin", "kill"]),
        ("stdbuf -oL rm x", ["stdbuf", "rm"]),
        ("stdbuf -o L -e 0 rm x", ["stdbuf", "rm"]),
        ("setsid -f rm x", ["setsid", "rm"]),
        ("chroot /srv rm x", ["chroot", "rm"]),
        ("chroot --userspec=a:b /srv rm x", ["chroot", "rm"]),
        ("busybox rm x", ["busybox", "rm"]),
        ("sudo env nice -n 5 timeout 3 rm x", ["sudo", "env", "nice", "timeout", "rm"]),
        ("/usr/bin/env /bin/rm x", ["env", "rm"]),
    ],
)
def test_wrappers(line: str, expected: list[str]) -> None:
    assert words(line) == expected


def test_find_exec_forms() -> None:
    assert words(r"find . -name x -exec rm {} \;") == ["find", "rm"]
    assert words("find . -execdir rm {} +") == ["find", "rm"]
    assert words("find . -ok rm {} ';' -exec ls {} ';'") == ["find", "rm", "ls"]
    assert words("find . -exec sh -c 'rm \"$1\"' _ {} \\;") == ["find", "sh", "rm"]
    assert words("find . -exec {} \\;") == ["find", DYNAMIC]  # runs the found files


def test_xargs_replace_in_command_word_is_dynamic() -> None:
    assert words("xargs -I {} {} x") == ["xargs", DYNAMIC]
    assert words("xargs -I CMD CMD x") == ["xargs", DYNAMIC]
    assert words("xargs -I {} rm {}") == ["xargs", "rm"]


# --------------------------------------------------------------------- shells and eval


@pytest.mark.parametrize(
    "line",
    [
        "sh -c 'rm x'",
        "bash -c 'rm x'",
        'bash -lc "rm x"',
        "zsh -c 'rm x'",
        "dash -c 'rm x'",
        "/bin/sh -e -c 'rm x'",
        "bash -o pipefail -c 'ls | rm x'",
        "bash --norc -c 'rm x'",
        "sh -c -- 'rm x'",
        "eval 'rm x'",
        "eval rm x",
        "eval 'echo; rm' x",
        "sudo sh -c 'cd /; rm x'",
        "sh -c \"sh -c 'rm x'\"",
        "trap 'rm x' EXIT",
        "alias ll='rm -rf'",
        "su -c 'rm x' root",
        "watch rm x",
        "flock /tmp/l -c 'rm x'",
        "flock /tmp/l rm x",
    ],
)
def test_shell_strings_are_parsed(line: str) -> None:
    assert "rm" in words(line)


def test_shell_without_c_runs_a_script_not_inspected() -> None:
    assert words("bash script.sh") == ["bash"]
    assert words("sh -e script.sh rm") == ["sh"]


def test_shell_string_from_a_variable_is_dynamic() -> None:
    assert words('sh -c "$CMD"') == ["sh", DYNAMIC]
    assert words("eval $CMD") == ["eval", DYNAMIC]


def test_depth_limit() -> None:
    def nest(levels: int) -> str:
        line = "rm x"
        for _ in range(levels):
            line = "sh -c " + _sh_quote(line)
        return line

    assert "rm" in words(nest(MAX_DEPTH))
    with pytest.raises(ValueError, match="nested more than"):
        words(nest(MAX_DEPTH + 1))
    with pytest.raises(ValueError, match="nested more than"):
        words("eval " + _sh_quote(nest(MAX_DEPTH)))


def test_depth_bomb_of_substitutions_raises_value_error() -> None:
    with pytest.raises(ValueError):
        words("echo " + "$(" * 500 + "rm" + ")" * 500)
    with pytest.raises(ValueError):
        words("( " * 500 + "rm" + " )" * 500)
    line = "rm x"
    for _ in range(MAX_DEPTH + 1):  # backquotes nest by escaping the inner ones
        line = "echo `" + line.replace("\\", "\\\\").replace("`", "\\`") + "`"
    with pytest.raises(ValueError, match="nested more than"):
        words(line)


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


# --------------------------------------------------------------------- names and quoting


@pytest.mark.parametrize(
    "line",
    ["rm", "/bin/rm", "/usr/bin/rm", "./rm", "~/bin/rm", "r\\m", "'rm'", '"rm"', "r'm'", 'r""m', "'r'\"m\"", "\\rm"],
)
def test_quoted_and_pathed_names(line: str) -> None:
    assert words(line + " x") == ["rm"]


@pytest.mark.parametrize(
    "line",
    [
        "$X args",
        "${X} args",
        "$X",
        '"$X" args',
        "$(echo rm) x",
        "`echo rm` x",
        "r? x",
        "r* x",
        "[r]m x",
        "/bin/r? x",
        "$HOME/bin/tool",
        "{rm,-rf,/}",
        "$'\\x72m' x",
        "<(ls)",
    ],
)
def test_computed_command_words_are_dynamic(line: str) -> None:
    assert DYNAMIC in words(line)


def test_dynamic_arguments_are_fine() -> None:
    assert words("echo $X r* [ab] {a,b}") == ["echo"]
    assert words("[ -f x ] && rm x") == ["[", "rm"]
    assert words("test -n \"$X\"") == ["test"]
    assert words("$'rm' x") == ["rm"]


# --------------------------------------------------------------------- malformed input


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("echo 'abc", "single quote"),
        ('echo "abc', "double quote"),
        ("echo `abc", "backquote"),
        ("echo $(abc", "unbalanced parentheses"),
        ("(abc", "unbalanced parentheses"),
        ("abc)", "unbalanced parentheses"),
        ("echo ${abc", "'\\$\\{'"),
        ("case x in a) b;;", "esac"),
        ("[[ -f x", "\\]\\]"),
        ("sh -c 'echo \"x'", "double quote"),
    ],
)
def test_malformed_lines_raise_value_error(line: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        words(line)


def test_random_input_raises_only_value_error() -> None:
    rng = random.Random(4)
    alphabet = "ab rm;|&()<>$`'\"\\{}[]*?=#\n-c"
    for _ in range(3000):
        line = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        try:
            result = words(line)
        except ValueError:
            continue
        assert all(isinstance(w, str) for w in result)


# --------------------------------------------------------------------- TerminalTool refusals


def run(tool: TerminalTool, command: object) -> object:
    return asyncio.run(tool.execute(command=command))


def test_default_blacklist() -> None:
    assert DEFAULT_BLACKLIST == frozenset(
        {"rm", "rmdir", "mkfs", "dd", "shutdown", "reboot", "halt", "poweroff",
         "kill", "killall", "pkill", "format", "del", "erase", "rd"}
    )


def test_schema_and_platform() -> None:
    tool = TerminalTool()
    assert tool.name == "terminal"
    assert tool.schema()["function"]["parameters"]["required"] == ["command"]
    assert isinstance(tool.platform, str)


@pytest.mark.parametrize(
    "command",
    [
        "rm -rf /",
        "env rm x",
        "$(rm x)",
        "ls;rm x",
        "sh -c 'rm x'",
        r"find . -exec rm {} \;",
        "/bin/rm x",
        r"r\m x",
        '"rm" x',
        "echo $(echo $(rm))",
        'bash -c "echo; rm -rf /"',
        "sudo -u root rm x",
        "ls | xargs rm",
    ],
)
def test_blacklisted_commands_are_refused_before_any_sandbox(command: str) -> None:
    tool = TerminalTool()
    with pytest.raises(ToolError, match="Command 'rm' is blocked"):
        run(tool, command)
    assert tool._manager is None and tool._sandbox_id is None


def test_blacklist_variants() -> None:
    tool = TerminalTool()
    for command, word in [("mkfs.ext4 /dev/x", "mkfs.ext4"), ("RM x", "RM"), ("killall x", "killall")]:
        with pytest.raises(ToolError, match=f"Command '{word}' is blocked"):
            run(tool, command)


def test_custom_blacklist() -> None:
    tool = TerminalTool(blacklist=frozenset({"curl"}))
    with pytest.raises(ToolError, match="Command 'curl' is blocked"):
        run(tool, "ls | curl x")
    assert tool.check("rm x") == ["rm"]


def test_dynamic_command_word_is_refused() -> None:
    tool = TerminalTool()
    with pytest.raises(ToolError, match="computed at run time"):
        run(tool, "$X args")
    assert tool._manager is None


def test_parse_errors_and_bad_arguments_are_tool_errors() -> None:
    tool = TerminalTool()
    with pytest.raises(ToolError, match="double quote"):
        run(tool, 'echo "abc')
    with pytest.raises(ToolError, match="nested more than"):
        run(tool, "eval " * 20 + "x")
    for bad in ("", "   ", None, 5):
        with pytest.raises(ToolError, match="'command' is required"):
            run(tool, bad)
    with pytest.raises(ToolError, match="'command' is required"):
        asyncio.run(tool.execute())


def test_arithmetic_lookahead_is_not_exponential() -> None:
    # Each `$((` is first tried as arithmetic, then as `$( (`; failures are remembered.
    line = "echo " + "$((" * 40 + "x" + ") " * 40
    with pytest.raises(ValueError, match="unbalanced|deeper"):
        words(line)
    assert words("echo " + "$(( 1 + $(" * 10 + "rm x" + ") ))" * 10).count("rm") == 1


def test_close_without_use_creates_nothing() -> None:
    with TerminalTool() as tool:
        with pytest.raises(ToolError):
            run(tool, "rm x")
    assert tool._manager is None
