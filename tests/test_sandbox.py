"""Sandbox (filesystem-sandbox): virtual paths, permissions, suffix/size checks and derive."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox_kernel_ext import (
    CapabilityParser,
    ConfigurationError,
    FileTooLargeError,
    PathConfig,
    PathNotInSandboxError,
    PathNotWritableError,
    RootSandboxConfig,
    Sandbox,
    SandboxConfig,
    SandboxError,
    SandboxPermissionEscalationError,
    SuffixNotAllowedError,
)

ROOTS = ("docs", "work", "open")


# ------------------------------------------------------------------ fixtures
def build_tree(base: Path) -> Path:
    """host/{docs,work,open} plus an `outside` folder next to them."""
    host = base / "host"
    for d in ("docs/sub/deep", "work/a/b", "open", "outside"):
        (host / d).mkdir(parents=True, exist_ok=True)
    (host / "docs/a.txt").write_text("alpha")
    (host / "docs/sub/b.md").write_text("beta")
    (host / "docs/big.txt").write_text("x" * 101)
    (host / "work/a/w.txt").write_text("w")
    (host / "outside/secret.txt").write_text("secret")
    return host


def multi_config(host: Path) -> SandboxConfig:
    return SandboxConfig(
        paths={
            "docs": PathConfig(root=str(host / "docs"), suffixes=[".txt", ".MD"], max_file_bytes=100),
            "work": PathConfig(root=str(host / "work"), mode="rw"),
            "open": PathConfig(root=str(host / "open"), mode="rw", write_approval=False, read_approval=True),
        }
    )


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return build_tree(tmp_path)


@pytest.fixture
def sb(host: Path) -> Sandbox:
    return Sandbox(multi_config(host))


@pytest.fixture
def single(host: Path) -> Sandbox:
    return Sandbox(SandboxConfig(root=RootSandboxConfig(root=host / "docs")))


@pytest.fixture
def single_ro(host: Path) -> Sandbox:
    return Sandbox(SandboxConfig(root=RootSandboxConfig(root=host / "docs", readonly=True)))


def real(p: Path | str) -> Path:
    return Path(os.path.realpath(p))


# --------------------------------------------------------------- multi-path
@pytest.mark.parametrize("form", ["/docs/a.txt", "docs/a.txt", "//docs//a.txt", "./docs/./a.txt"])
def test_multi_resolve_absolute_and_relative(sb: Sandbox, host: Path, form: str) -> None:
    assert sb.resolve(form) == real(host / "docs/a.txt")
    assert sb.can_read(form)
    assert not sb.can_write(form)


@pytest.mark.parametrize("form", [" /docs/a.txt ", "/docs/a.txt ", "/docs /a.txt"])
def test_spaces_are_part_of_a_path(sb: Sandbox, host: Path, form: str) -> None:
    """A path is taken as written: a space is a character of a name, never trimmed."""
    try:
        resolved = sb.resolve(form)
    except PathNotInSandboxError:
        return  # " " or "docs " is no root's name
    assert resolved != real(host / "docs/a.txt")


def test_multi_resolve_nested_and_missing(sb: Sandbox, host: Path) -> None:
    assert sb.resolve("/docs/sub/b.md") == real(host / "docs/sub/b.md")
    assert sb.resolve("work/a/b/new.txt") == real(host / "work/a/b/new.txt")  # need not exist
    assert sb.resolve("/work") == real(host / "work")
    assert sb.can_write("/work/a/new.txt") and sb.can_write("work/new.txt")
    assert sb.can_read("/open/x") and sb.can_write("/open/x")


def test_multi_top_level_is_no_root(sb: Sandbox) -> None:
    for top in ("/", "", ".", "//"):
        with pytest.raises(PathNotInSandboxError):
            sb.resolve(top)
        assert not sb.can_read(top)
        assert not sb.can_write(top)


# --------------------------------------------------------------- single-root
@pytest.mark.parametrize("form", ["/sub/b.md", "sub/b.md", "./sub//b.md"])
def test_single_root_resolve(single: Sandbox, host: Path, form: str) -> None:
    assert single.resolve(form) == real(host / "docs/sub/b.md")
    assert single.can_read(form) and single.can_write(form)


def test_single_root_top_and_absolute(single: Sandbox, host: Path) -> None:
    assert single.resolve("/") == real(host / "docs")
    assert single.resolve(".") == real(host / "docs")
    # An absolute path is a virtual path under the root, never the host path.
    assert single.resolve("/etc/passwd") == real(host / "docs/etc/passwd")
    assert single.readable_roots == ["/"] and single.writable_roots == ["/"]


def test_single_root_readonly(single_ro: Sandbox) -> None:
    assert single_ro.can_read("/a.txt")
    assert not single_ro.can_write("/a.txt")
    assert single_ro.readable_roots == ["/"]
    assert single_ro.writable_roots == []


# ----------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "path",
    ["/docs/../work/a/w.txt", "../x", "docs/sub/../../work", "/docs/..", "..", "/work/a/../../open/x", "docs/.."],
)
def test_dotdot_refused_multi(sb: Sandbox, path: str) -> None:
    with pytest.raises(PathNotInSandboxError, match=r"'\.\.'"):
        sb.resolve(path)
    assert not sb.can_read(path)
    assert not sb.can_write(path)


@pytest.mark.parametrize("path", ["/../outside/secret.txt", "..", "sub/../../outside", "/sub/.."])
def test_dotdot_refused_single(single: Sandbox, path: str) -> None:
    with pytest.raises(PathNotInSandboxError):
        single.resolve(path)
    assert not single.can_read(path)
    assert not single.can_write(path)


@pytest.mark.parametrize("path", ["/nosuch/x.txt", "nosuch", "/DOCS/a.txt", "doc/a.txt", "/outside/secret.txt"])
def test_unknown_names_refused(sb: Sandbox, path: str) -> None:
    with pytest.raises(PathNotInSandboxError) as info:
        sb.resolve(path)
    assert "Readable: docs, work, open" in str(info.value)
    assert not sb.can_read(path)
    assert not sb.can_write(path)


def test_absolute_host_paths_refused_in_multi_mode(sb: Sandbox, host: Path) -> None:
    for hp in (host / "docs/a.txt", host / "work/a/w.txt", Path("/etc/passwd")):
        with pytest.raises(PathNotInSandboxError, match="host paths are not accepted"):
            sb.resolve(str(hp))
        assert not sb.can_read(str(hp))
        assert not sb.can_write(str(hp))


def test_nul_and_non_strings_refused(sb: Sandbox, single: Sandbox) -> None:
    for box in (sb, single):
        with pytest.raises(PathNotInSandboxError, match="NUL"):
            box.resolve("/docs/a.txt\0.png")
        assert not box.can_read("/docs/a\0")
        with pytest.raises(PathNotInSandboxError):
            box.resolve(b"/docs/a.txt")  # type: ignore[arg-type]
        assert not box.can_read(None)  # type: ignore[arg-type]


def test_lone_surrogate_is_refused_not_crashing(sb: Sandbox, single: Sandbox) -> None:
    """A str that cannot be encoded for the OS must be a sandbox refusal (or a harmless
    answer), never a UnicodeEncodeError out of resolve/can_read."""
    for box, path in ((sb, "/work/\ud800.txt"), (single, "/\udfff")):
        try:
            resolved = box.resolve(path)
        except PathNotInSandboxError:
            resolved = None
        if resolved is not None:
            assert str(resolved).startswith(str(box.host_root(box.parse(path))))
        assert box.can_read(path) in (True, False)
        assert box.can_write(path) in (True, False)


# ------------------------------------------------------------------ symlinks
@pytest.fixture
def links(host: Path) -> Path:
    os.symlink(host / "outside", host / "docs/esc_dir")
    os.symlink(host / "outside/secret.txt", host / "docs/esc_file.txt")
    os.symlink("../../outside", host / "work/a/rel_esc")
    os.symlink("../work", host / "docs/to_work")  # another root: still outside docs
    os.symlink("/", host / "open/slash")
    os.symlink("sub", host / "docs/inner")  # stays inside
    os.symlink("loop", host / "open/loop")
    return host


@pytest.mark.parametrize(
    "path",
    [
        "/docs/esc_dir/secret.txt",
        "/docs/esc_dir",
        "/docs/esc_file.txt",
        "/work/a/rel_esc/secret.txt",
        "/work/a/rel_esc/new.txt",
        "/docs/to_work/a/w.txt",
        "/open/slash/etc/passwd",
    ],
)
def test_symlink_leaving_root_refused(sb: Sandbox, links: Path, path: str) -> None:
    with pytest.raises(PathNotInSandboxError, match="symlink"):
        sb.resolve(path)
    assert not sb.can_read(path)
    assert not sb.can_write(path)


def test_symlink_inside_root_allowed(sb: Sandbox, links: Path) -> None:
    assert sb.resolve("/docs/inner/b.md") == real(links / "docs/sub/b.md")
    assert sb.can_read("/docs/inner/b.md")


def test_symlink_escape_single_root(links: Path) -> None:
    box = Sandbox(SandboxConfig(root=RootSandboxConfig(root=links / "docs")))
    for path in ("/esc_dir/secret.txt", "esc_file.txt", "/to_work/a/w.txt"):
        with pytest.raises(PathNotInSandboxError):
            box.resolve(path)
        assert not box.can_read(path) and not box.can_write(path)
    assert box.can_read("/inner/b.md")


def test_root_itself_a_symlink(tmp_path: Path) -> None:
    host = build_tree(tmp_path)
    os.symlink(host / "docs", tmp_path / "docs_link")
    box = Sandbox(SandboxConfig(paths={"d": PathConfig(root=str(tmp_path / "docs_link"))}))
    assert box.resolve("/d/a.txt") == real(host / "docs/a.txt")


def test_relative_roots_use_base_path(host: Path) -> None:
    box = Sandbox(SandboxConfig(paths={"d": PathConfig(root="docs")}), base_path=host)
    assert box.resolve("/d/a.txt") == real(host / "docs/a.txt")


# ---------------------------------------------------------- config & checks
def test_get_path_config_multi(sb: Sandbox, host: Path) -> None:
    name, path, config = sb.get_path_config("/docs/sub/b.md")
    assert name == "docs"
    assert path == real(host / "docs/sub/b.md")
    assert config.mode == "ro" and config.suffixes == [".txt", ".md"] and config.max_file_bytes == 100
    name, path, config = sb.get_path_config("work/a/w.txt")
    assert (name, config.mode, config.write_approval) == ("work", "rw", True)
    with pytest.raises(PathNotInSandboxError):
        sb.get_path_config("/nosuch/x")
    with pytest.raises(PathNotInSandboxError):
        sb.get_path_config("/docs/../work/x")


def test_get_path_config_single(single: Sandbox, single_ro: Sandbox, host: Path) -> None:
    name, path, config = single.get_path_config("/a.txt")
    assert (name, path, config.mode) == ("/", real(host / "docs/a.txt"), "rw")
    assert config.write_approval is False and config.read_approval is False
    assert single_ro.get_path_config("a.txt")[2].mode == "ro"
    box = Sandbox(SandboxConfig(root=RootSandboxConfig(root=host, suffixes=[".py"], max_file_bytes=7)))
    config = box.get_path_config("/x.py")[2]
    assert config.suffixes == [".py"] and config.max_file_bytes == 7


def test_check_suffix(sb: Sandbox, host: Path) -> None:
    config = sb.get_path_config("/docs/a.txt")[2]
    sb.check_suffix(host / "docs/a.txt", config)
    sb.check_suffix(Path("X.TXT"), config)  # case-insensitive
    sb.check_suffix("notes.md", config)
    for bad, suffix in (("script.py", ".py"), ("Makefile", ""), ("a.txt.exe", ".exe")):
        with pytest.raises(SuffixNotAllowedError) as info:
            sb.check_suffix(Path(bad), config)
        assert info.value.suffix == suffix
        assert ".txt" in str(info.value) and ".md" in str(info.value)
    sb.check_suffix(Path("anything.bin"), sb.get_path_config("/work/x")[2])  # None = all


def test_check_size(sb: Sandbox, host: Path) -> None:
    config = sb.get_path_config("/docs/a.txt")[2]
    sb.check_size(host / "docs/a.txt", config)
    with pytest.raises(FileTooLargeError) as info:
        sb.check_size(host / "docs/big.txt", config)
    assert (info.value.actual, info.value.limit) == (101, 100)
    assert str(host) not in str(info.value)
    sb.check_size(host / "docs/missing.txt", config)  # nothing to measure
    sb.check_size(host / "docs/big.txt", sb.get_path_config("/work/x")[2])  # no limit
    with pytest.raises(FileTooLargeError):
        sb.check_size("new.txt", config, size=101)
    sb.check_size("new.txt", config, size=100)


def test_readable_and_writable_roots(sb: Sandbox) -> None:
    assert sb.readable_roots == ["docs", "work", "open"]
    assert sb.writable_roots == ["work", "open"]
    ro_only = Sandbox(SandboxConfig(paths={"d": PathConfig(root="/nonexistent-root")}))
    assert ro_only.readable_roots == ["d"] and ro_only.writable_roots == []


def test_approval_flags(sb: Sandbox, single: Sandbox) -> None:
    assert sb.needs_write_approval("/work/x.txt") is True  # PathConfig default
    assert sb.needs_read_approval("/work/x.txt") is False
    assert sb.needs_write_approval("/open/x") is False
    assert sb.needs_read_approval("open/x") is True
    assert sb.needs_read_approval("/docs/a.txt") is False
    assert single.needs_read_approval("/a.txt") is False
    assert single.needs_write_approval("/a.txt") is False
    with pytest.raises(PathNotInSandboxError):
        sb.needs_write_approval("/nosuch/x")
    with pytest.raises(PathNotInSandboxError):
        sb.needs_read_approval("/")


# -------------------------------------------------------------------- derive
PROBES = [
    "/docs/a.txt", "/docs/sub/b.md", "/docs/sub/deep/x", "/docs", "/work/a/w.txt", "/work/a/b/c",
    "/work/x", "/work", "/open/o.txt", "/open", "/", "/nosuch/x",
]


def test_derive_default_starts_empty(sb: Sandbox) -> None:
    child = sb.derive()
    assert child.readable_roots == [] and child.writable_roots == []
    for p in PROBES:
        assert not child.can_read(p) and not child.can_write(p)
    with pytest.raises(PathNotInSandboxError):
        child.resolve("/docs/a.txt")


def test_derive_allowlists(sb: Sandbox) -> None:
    child = sb.derive(allow_read="/docs/sub", allow_write=["/work/a"])
    assert child.can_read("/docs/sub/b.md") and not child.can_write("/docs/sub/b.md")
    assert not child.can_read("/docs/a.txt")
    assert child.can_read("/work/a/w.txt") and child.can_write("/work/a/b/new")
    assert not child.can_read("/work/x") and not child.can_write("/work/x")
    assert not child.can_read("/work/ab")  # a prefix of a name is not a parent folder
    assert not child.can_read("/open/o.txt")
    assert child.readable_roots == ["docs/sub", "work/a"]
    assert child.writable_roots == ["work/a"]


def test_derive_inherit(sb: Sandbox) -> None:
    child = sb.derive(inherit=True)
    for p in PROBES:
        assert child.can_read(p) == sb.can_read(p), p
        assert child.can_write(p) == sb.can_write(p), p
    assert child.readable_roots == sorted(sb.readable_roots)
    assert child.writable_roots == sorted(sb.writable_roots)
    ro = sb.derive(inherit=True, readonly=True)
    for p in PROBES:
        assert ro.can_read(p) == sb.can_read(p), p
        assert not ro.can_write(p), p
    assert ro.writable_roots == []


def test_nested_derives(sb: Sandbox) -> None:
    child = sb.derive(allow_read=["/docs"], allow_write=["/work/a"])
    grand = child.derive(allow_write="/work/a/b")
    assert grand.can_write("/work/a/b/x") and not grand.can_write("/work/a/w.txt")
    assert not grand.can_read("/docs/a.txt")
    assert child.derive(allow_read="/work/a").can_read("/work/a/w.txt")  # write implies read
    assert child.derive(allow_read="/docs/sub").can_read("/docs/sub/b.md")
    inherited = child.derive(inherit=True)
    for p in PROBES:
        assert inherited.can_read(p) == child.can_read(p), p
        assert inherited.can_write(p) == child.can_write(p), p
    great = grand.derive(inherit=True).derive(allow_read="/work/a/b/c")
    assert great.can_read("/work/a/b/c/d") and not great.can_write("/work/a/b/c/d")
    assert not great.can_read("/work/a/b/x")


def test_derive_readonly_semantics(sb: Sandbox, single_ro: Sandbox) -> None:
    ro = sb.derive(allow_read="/docs", allow_write="/work", readonly=None)
    assert ro.can_write("/work/x")
    frozen = sb.derive(inherit=True, readonly=True)
    assert frozen.derive(inherit=True).writable_roots == []  # stays read-only
    assert frozen.derive(inherit=True, readonly=True).can_read("/work/x")
    assert single_ro.derive(inherit=True).can_read("/a.txt")
    assert not single_ro.derive(inherit=True).can_write("/a.txt")
    # readonly=True plus allow_write is a contradiction; it must not grant writes.
    with pytest.raises(SandboxError):
        sb.derive(allow_write="/work", readonly=True)
    # An explicit readonly=False on a writable parent is fine.
    assert sb.derive(allow_write="/work", readonly=False).can_write("/work/z")


def _escalations(sb: Sandbox, single: Sandbox, single_ro: Sandbox):
    read_sub = sb.derive(allow_read="/docs/sub")
    write_a = sb.derive(allow_write="/work/a")
    frozen = sb.derive(inherit=True, readonly=True)
    single_sub = single.derive(allow_read="/sub")
    return [
        (sb, dict(allow_write="/docs")),
        (sb, dict(allow_write="/docs/sub/x")),
        (sb, dict(allow_write="/")),
        (read_sub, dict(allow_read="/docs")),
        (read_sub, dict(allow_read="/work")),
        (read_sub, dict(allow_read="/")),
        (read_sub, dict(allow_write="/docs/sub")),
        (read_sub, dict(readonly=False)),
        (read_sub, dict(inherit=True, readonly=False)),
        (write_a, dict(allow_write="/work")),
        (write_a, dict(allow_write="/work/b")),
        (write_a, dict(allow_write="/open")),
        (write_a, dict(allow_read="/work")),
        (write_a, dict(allow_read=["/work/a", "/docs"])),
        (frozen, dict(readonly=False)),
        (frozen, dict(inherit=True, readonly=False)),
        (frozen, dict(allow_write="/work/x")),
        (single_ro, dict(readonly=False)),
        (single_ro, dict(allow_write="/x")),
        (single_sub, dict(allow_read="/")),
        (single_sub, dict(allow_write="/sub")),
        (single_sub, dict(allow_read="/a.txt")),
    ]


def test_every_escalation_raises_escalation_error(
    sb: Sandbox, single: Sandbox, single_ro: Sandbox, tmp_path: Path
) -> None:
    failures = []
    for parent, kwargs in _escalations(sb, single, single_ro):
        try:
            parent.derive(**kwargs)
        except SandboxPermissionEscalationError as exc:
            assert str(tmp_path) not in str(exc)
            continue
        except Exception as exc:  # noqa: BLE001 - collected for one clear report
            failures.append(f"{parent!r}.derive({kwargs}) raised {type(exc).__name__}: {exc}")
            continue
        failures.append(f"{parent!r}.derive({kwargs}) succeeded")
    assert not failures, "\n".join(failures)


def test_derive_refuses_bad_paths(sb: Sandbox) -> None:
    for bad in ("/docs/../work", "/nosuch", "/docs/a\0"):
        with pytest.raises(PathNotInSandboxError):
            sb.derive(allow_read=bad)


# ------------------------------------------------------- message hygiene
def test_error_messages_name_only_virtual_paths(
    sb: Sandbox, single: Sandbox, single_ro: Sandbox, links: Path, tmp_path: Path
) -> None:
    hosts = {str(tmp_path), os.path.realpath(tmp_path), str(links)}
    messages: list[str] = []

    def collect(fn, *args, **kwargs) -> None:
        try:
            fn(*args, **kwargs)
        except SandboxError as exc:
            messages.append(str(exc))
        else:
            raise AssertionError(f"{fn.__name__}{args} did not fail")

    for p in ("/docs/../x", "/nosuch/a", "/", "/docs/esc_dir/secret.txt", "/work/a/rel_esc/x", "/open/slash/etc",
              "/docs/to_work/a", "/docs/a\0"):
        collect(sb.resolve, p)
        collect(sb.get_path_config, p)
    for p in ("/esc_dir/secret.txt", "/../x", "/to_work"):
        collect(single.resolve, p)
    collect(sb.derive(allow_read="/docs").resolve, "/work/a/w.txt")
    config = sb.get_path_config("/docs/a.txt")[2]
    collect(sb.check_suffix, links / "docs/x.exe", config)
    collect(sb.check_size, links / "docs/big.txt", config)
    collect(sb.check_write, sb.parse("/docs/a.txt"))
    collect(single_ro.check_write, single_ro.parse("/a.txt"))
    for parent, kwargs in _escalations(sb, single, single_ro):
        try:
            parent.derive(**kwargs)
        except SandboxError as exc:
            messages.append(str(exc))
    assert len(messages) > 30
    for message in messages:
        for h in hosts:
            assert h not in message, message


def test_not_writable_message(sb: Sandbox) -> None:
    with pytest.raises(PathNotWritableError) as info:
        sb.check_write(sb.parse("/docs/a.txt"))
    assert "'docs/a.txt'" in str(info.value) and "Writable: work, open" in str(info.value)


# ---------------------------------------------------------------- from_policy
def test_from_policy(host: Path) -> None:
    policy_file = host / "policy.yaml"
    policy_file.write_text(
        "paths:\n"
        "  docs: {root: docs, suffixes: ['.txt']}\n"
        "  work: {root: work, mode: rw, write_approval: false}\n"
    )
    box = Sandbox.from_policy(CapabilityParser.from_file(policy_file))
    assert box.resolve("/docs/a.txt") == real(host / "docs/a.txt")  # relative to the file
    assert box.can_write("/work/x") and not box.can_write("/docs/a.txt")
    assert box.needs_write_approval("/work/x") is False

    single_policy = CapabilityParser.from_string(f"root: {{root: '{host / 'docs'}', readonly: true}}")
    box = Sandbox.from_policy(single_policy)
    assert box.can_read("/a.txt") and not box.can_write("/a.txt")

    with pytest.raises(ConfigurationError):
        Sandbox.from_policy(CapabilityParser.from_string("permissions: []"))


# ---------------------------------------------------------------- properties
_BASE = Path(tempfile.mkdtemp(prefix="sbx-prop-"))
atexit.register(shutil.rmtree, _BASE, True)

COMPONENTS = st.one_of(
    st.sampled_from(["..", ".", "", "docs", "work", "open", "a.txt", "sub", "l1", "l2", "l3", "deep", "\\", "..\\..",
                     "é", "\u202e", "x" * 300, "~", "$HOME", "\x00", " .. "]),
    st.text(max_size=12),
)
PATHS = st.one_of(
    st.builds(lambda lead, parts: lead + "/".join(parts), st.sampled_from(["", "/", "//", "./"]),
              st.lists(COMPONENTS, max_size=8)),
    st.text(max_size=40),
    st.text(alphabet="/.\\a\x00é", max_size=4000),
)
LINK_SPOTS = ["docs/l1", "docs/sub/l2", "work/l3", "work/a/l1", "open/l2"]
LINK_TARGETS = st.sampled_from(
    ["..", "../..", "../../..", "/", "/etc", "../outside", "../../outside", "sub", ".", "l1", "l2", "../work",
     "deep/../..", "a", "OUTSIDE_ABS", "INSIDE_ABS", "DOCS_ABS"]
)


def _plant(host: Path, links: list[tuple[str, str]]) -> None:
    for spot, target in links:
        target = {
            "OUTSIDE_ABS": str(host / "outside"),
            "INSIDE_ABS": str(host / "work/a"),
            "DOCS_ABS": str(host / "docs/sub"),
        }.get(target, target)
        place = host / spot
        if place.parent.is_dir() and not os.path.lexists(place):
            os.symlink(target, place)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    paths=st.lists(PATHS, min_size=1, max_size=6),
    links=st.lists(st.tuples(st.sampled_from(LINK_SPOTS), LINK_TARGETS), max_size=4),
    single_mode=st.booleans(),
    derived=st.booleans(),
)
def test_property_resolve_stays_inside(paths, links, single_mode, derived) -> None:
    base = Path(tempfile.mkdtemp(dir=_BASE))
    try:
        host = build_tree(base)
        _plant(host, links)
        if single_mode:
            box = Sandbox(SandboxConfig(root=RootSandboxConfig(root=host / "work")))
            roots = {None: os.path.realpath(host / "work")}
        else:
            box = Sandbox(multi_config(host))
            roots = {name: os.path.realpath(host / name) for name in ROOTS}
        if derived:
            box = box.derive(inherit=True)
        for path in paths:
            try:
                resolved = box.resolve(path)
            except PathNotInSandboxError:
                assert not box.can_read(path) and not box.can_write(path)
                continue
            root = roots[box.parse(path).root]
            assert _inside(os.path.realpath(resolved), root), (path, resolved)
            assert _inside(str(resolved), root)
            assert box.can_read(path)
    finally:
        shutil.rmtree(base, ignore_errors=True)


_DERIVE_HOST = build_tree(Path(tempfile.mkdtemp(dir=_BASE)))
os.symlink("../sub", _DERIVE_HOST / "docs/sub/deep/up")
os.symlink(str(_DERIVE_HOST / "outside"), _DERIVE_HOST / "work/out")
GRANTS = st.sampled_from(
    ["/", "/docs", "/docs/sub", "/docs/sub/deep", "/docs/a.txt", "/work", "/work/a", "/work/a/b", "/work/x",
     "/open", "/open/o", "docs/sub", "work/a/b/c", "/docs/sub/deep/up", "/work/out"]
)
DERIVE_PROBES = PROBES + ["/docs/sub/deep/up/b.md", "/work/out/secret.txt", "/work/a/b", "/open/o/p", "/docs/a.txt/x"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.tuples(
            st.one_of(st.none(), GRANTS, st.lists(GRANTS, max_size=3)),
            st.one_of(st.none(), GRANTS, st.lists(GRANTS, max_size=3)),
            st.sampled_from([None, True, False]),
            st.booleans(),
        ),
        min_size=1,
        max_size=6,
    ),
    single_mode=st.booleans(),
)
def test_property_derive_never_widens(steps, single_mode) -> None:
    if single_mode:
        box = Sandbox(SandboxConfig(root=RootSandboxConfig(root=_DERIVE_HOST / "work")))
    else:
        box = Sandbox(multi_config(_DERIVE_HOST))
    lineage = [box]
    for allow_read, allow_write, readonly, inherit in steps:
        parent = lineage[-1]
        try:
            child = parent.derive(allow_read=allow_read, allow_write=allow_write, readonly=readonly, inherit=inherit)
        except (SandboxPermissionEscalationError, ConfigurationError, PathNotInSandboxError):
            continue
        for ancestor in lineage:
            for p in DERIVE_PROBES:
                if child.can_read(p):
                    assert ancestor.can_read(p), (p, child, ancestor)
                if child.can_write(p):
                    assert ancestor.can_write(p), (p, child, ancestor)
        if readonly:
            assert child.writable_roots == []
            assert not any(child.can_write(p) for p in DERIVE_PROBES)
        lineage.append(child)


def test_derived_grant_cannot_be_left_through_an_in_root_symlink(sb: Sandbox, host: Path) -> None:
    """A child allowed only /docs/sub must not reach /docs/a.txt through a symlink that
    stays inside the root but leaves the granted prefix."""
    os.symlink("..", host / "docs/sub/up")
    os.symlink(str(host / "work"), host / "docs/sub/abs_up")  # leaves the root: refused anyway
    child = sb.derive(allow_read="/docs/sub")
    assert not child.can_read("/docs/a.txt")
    assert not child.can_read("/docs/sub/up/a.txt")
    with pytest.raises(PathNotInSandboxError):
        child.resolve("/docs/sub/up/a.txt")
    writer = sb.derive(allow_write="/work/a/b")
    os.symlink("../..", host / "work/a/b/top")
    assert not writer.can_write("/work/a/b/top/a/w.txt")
