from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_kernel_ext.policy.filesystem import FilesystemPolicy, validate_path_access
from sandbox_kernel_ext.policy.models import FilesystemConfig, FilesystemMode

RW = FilesystemMode.read_write


def test_seed_example() -> None:
    config = FilesystemConfig(mode=RW, writable_paths=["/tmp/work"])
    assert validate_path_access("/etc/hosts", "read", config) is True
    assert validate_path_access("/etc/hosts", "write", config) is False
    assert validate_path_access("/tmp/work/out.json", "write", config) is True


@pytest.mark.parametrize(
    ("config", "read", "write"),
    [
        (FilesystemConfig(), True, False),
        (FilesystemConfig(mode=FilesystemMode.read_only), True, False),
        (FilesystemConfig(mode=FilesystemMode.none), False, False),
        (FilesystemConfig(mode=RW), True, True),
    ],
)
def test_mode_table(config: FilesystemConfig, read: bool, write: bool) -> None:
    policy = FilesystemPolicy(config)
    for path in ["/etc/hosts", "/tmp/anything", "relative/file.txt"]:
        assert policy.can_read(path) is read
        assert policy.can_write(path) is write


def test_mode_reasons() -> None:
    assert FilesystemPolicy(FilesystemConfig(mode=FilesystemMode.none)).deny_reason(
        "/x", "read"
    ) == "filesystem access is disabled (mode is none)"
    assert FilesystemPolicy(FilesystemConfig()).deny_reason("/x", "write") == (
        "writes are not allowed (mode is read_only)"
    )


def test_bad_mode_raises() -> None:
    with pytest.raises(ValueError, match="'read' or 'write'"):
        validate_path_access("/x", "execute", FilesystemConfig())
    with pytest.raises(ValueError):
        FilesystemPolicy(FilesystemConfig()).deny_reason("/x", "READ")


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/tmp/work", True),
        ("/tmp/work/", True),
        ("/tmp/work/a/b.txt", True),
        ("/tmp/work/./a", True),
        ("/tmp/work2", False),
        ("/tmp/work2/file", False),
        ("/tmp/wor", False),
        ("/tmp", False),
        ("/tmp/work/../etc/passwd", False),
        ("/tmp/work/a/../../work/b", True),
        ("/tmp/work/../../../../etc", False),
        ("//tmp/work/x", True),
    ],
)
def test_component_containment(path: str, allowed: bool) -> None:
    config = FilesystemConfig(mode=RW, writable_paths=["/tmp/work"])
    assert validate_path_access(path, "write", config) is allowed


def test_dotdot_reason_names_the_collapsed_path() -> None:
    policy = FilesystemPolicy(FilesystemConfig(mode=RW, writable_paths=["/tmp/work"]))
    assert policy.deny_reason("/tmp/work/../etc/passwd", "write") == (
        "/tmp/etc/passwd is outside the writable paths (/tmp/work)"
    )


def test_configured_path_with_trailing_slash_and_dots() -> None:
    config = FilesystemConfig(mode=RW, writable_paths=["/tmp/work/./sub/../"])
    assert validate_path_access("/tmp/work/x", "write", config)
    assert not validate_path_access("/tmp/workx", "write", config)


def test_root_directory_as_writable_path() -> None:
    config = FilesystemConfig(mode=RW, writable_paths=["/"])
    assert validate_path_access("/anything/at/all", "write", config)


def test_relative_paths_are_relative_to_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    policy = FilesystemPolicy(FilesystemConfig(mode=RW, writable_paths=["out"]))
    assert policy.can_write("out/result.json")
    assert policy.can_write(str(tmp_path / "out" / "x"))
    assert not policy.can_write("elsewhere.json")
    assert not policy.can_write("out/../../x")


def test_empty_writable_paths_in_read_write_means_everywhere() -> None:
    policy = FilesystemPolicy(FilesystemConfig(mode=RW))
    assert policy.can_write("/etc/passwd")


def test_readable_paths_restrict_reads(tmp_path: Path) -> None:
    data, work = tmp_path / "data", tmp_path / "work"
    config = FilesystemConfig(mode=RW, writable_paths=[str(work)], readable_paths=[str(data)])
    policy = FilesystemPolicy(config)
    assert policy.can_read(data / "a.csv")
    assert policy.can_read(work / "out.txt")  # writable paths are readable
    assert not policy.can_read("/etc/hosts")
    assert not policy.can_write(data / "a.csv")
    reason = policy.deny_reason("/etc/hosts", "read")
    assert reason == f"/etc/hosts is outside the readable paths ({data}, {work})"


def test_readable_paths_in_read_only_mode() -> None:
    policy = FilesystemPolicy(FilesystemConfig(readable_paths=["/data"]))
    assert policy.can_read("/data/x")
    assert not policy.can_read("/datax")
    assert not policy.can_write("/data/x")


def test_empty_readable_paths_allow_no_reads() -> None:
    policy = FilesystemPolicy(FilesystemConfig(readable_paths=[]))
    assert not policy.can_read("/data/x")
    assert policy.deny_reason("/data/x", "read") == "/data/x is outside the readable paths (none)"


def test_symlink_out_of_writable_path_is_denied(tmp_path: Path) -> None:
    work, secret = tmp_path / "work", tmp_path / "secret"
    work.mkdir()
    secret.mkdir()
    (work / "escape").symlink_to(secret)
    (work / "escape_file").symlink_to(secret / "key")
    policy = FilesystemPolicy(FilesystemConfig(mode=RW, writable_paths=[str(work)]))
    assert not policy.can_write(work / "escape" / "new.txt")  # parent is a symlink; file is new
    assert not policy.can_write(work / "escape_file")  # dangling link to outside
    reason = policy.deny_reason(work / "escape" / "new.txt", "write")
    assert reason is not None and f"resolves to {secret / 'new.txt'}" in reason
    assert policy.can_write(work / "plain.txt")


def test_symlink_into_writable_path_from_outside_is_denied(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "door").symlink_to(work)
    policy = FilesystemPolicy(FilesystemConfig(mode=RW, writable_paths=[str(work)]))
    assert not policy.can_write(tmp_path / "door" / "x")


def test_dotdot_after_symlink_follows_the_kernel(tmp_path: Path) -> None:
    """`work/link/../x` is `secret_parent/x` to the kernel, not `work/x`."""
    work, deep = tmp_path / "work", tmp_path / "outside" / "deep"
    work.mkdir()
    deep.mkdir(parents=True)
    (work / "link").symlink_to(deep)
    policy = FilesystemPolicy(FilesystemConfig(mode=RW, writable_paths=[str(work)]))
    assert not policy.can_write(f"{work}/link/../x")


def test_symlinked_configured_path_is_resolved(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    policy = FilesystemPolicy(FilesystemConfig(mode=RW, writable_paths=[str(tmp_path / "alias")]))
    assert policy.can_write(tmp_path / "alias" / "x")


@pytest.mark.parametrize("path", ["", "/tmp/work/\x00x", b"/tmp/work/x", None])
def test_invalid_paths_are_denied(path: object) -> None:
    policy = FilesystemPolicy(FilesystemConfig(mode=RW, writable_paths=["/tmp/work"]))
    reason = policy.deny_reason(path, "write")  # type: ignore[arg-type]
    assert reason is not None and reason.startswith("invalid path")


def test_pathlike_is_accepted() -> None:
    config = FilesystemConfig(mode=RW, writable_paths=["/tmp/work"])
    assert validate_path_access(Path("/tmp/work/a"), "write", config)


def test_never_read_paths_win_over_every_grant(tmp_path: Path) -> None:
    data = Path(os.path.realpath(tmp_path)) / "data"
    (data / "keys").mkdir(parents=True)
    stores = [str(data / "keys")]
    policy = FilesystemPolicy(FilesystemConfig(mode=RW, writable_paths=[str(data)],
                                               never_read_paths=stores))
    assert policy.can_read(data / "a.csv") and policy.can_write(data / "a.csv")
    assert not policy.can_read(data / "keys" / "k") and not policy.can_write(data / "keys" / "k")
    assert not policy.can_read(data / "keys")
    assert policy.deny_reason(data / "keys" / "k", "read") == (
        f"{data}/keys/k is in never_read_paths ({data}/keys): no sandbox reads it")
    (data / "alias").symlink_to(data / "keys")  # reached through a link: judged by its target
    assert not policy.can_read(data / "alias" / "k")
    everywhere = FilesystemPolicy(FilesystemConfig(never_read_paths=stores))
    assert everywhere.can_read("/etc/hosts") and not everywhere.can_read(data / "keys" / "k")
    named = FilesystemPolicy(FilesystemConfig(readable_paths=stores, never_read_paths=stores))
    assert not named.can_read(data / "keys" / "k")  # naming it readable changes nothing


def test_a_home_relative_never_read_path_is_beneath_every_home() -> None:
    home = os.path.realpath(os.path.expanduser("~"))
    policy = FilesystemPolicy(FilesystemConfig(never_read_paths=["~/.config/acme"]))
    assert not policy.can_read(f"{home}/.config/acme/token")
    assert policy.can_read(f"{home}/.config/acme-other/token")
