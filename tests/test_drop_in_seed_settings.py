"""An environment written for ATLAS's filesystem_io or DeepAgents' file tools keeps its
meaning: the seeds' own variable names set the same limits (the stricter value wins where
several are set), ATLAS's root variable names the handlers' root, and an invalid value raises
the QuotaExceededError ATLAS's callers catch."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sandbox_kernel_ext import (
    ConfigurationError,
    FileLimits,
    FileSizeExceeded,
    QuotaExceededError,
    SandboxViolationError,
    filesystem_list,
    filesystem_read,
    filesystem_write,
)
from sandbox_kernel_ext.policy.file_limits import SEED_VARIABLES


@pytest.mark.parametrize(("field", "variable"),
                         [(f, v) for f, names in SEED_VARIABLES.items() for v in names])
def test_each_seed_variable_sets_its_limit(field: str, variable: str) -> None:
    value = "3" if field != "operation_timeout" else "0.5"
    limits = FileLimits.effective(None, {variable: value})
    assert getattr(limits, field) == float(value)


def test_the_stricter_of_two_names_wins() -> None:
    both = {"ATLAS_FILESYSTEM_MAX_READ_BYTES": "100", "SANDBOX_KERNEL_EXT_FS_MAX_READ_BYTES": "500"}
    assert FileLimits.effective(None, both).max_read_bytes == 100
    both = {"INSPECT_AGENTS_FS_MAX_BYTES": "none", "SANDBOX_KERNEL_EXT_FS_MAX_FILE_BYTES": "9"}
    assert FileLimits.effective(None, both).max_file_bytes == 9
    # A policy's stricter value still wins over the environment's.
    policy = FileLimits(max_read_bytes=10)
    assert FileLimits.effective(policy, {"ATLAS_FILESYSTEM_MAX_READ_BYTES": "100"}).max_read_bytes == 10


def test_an_invalid_value_is_the_quota_error_atlas_callers_catch() -> None:
    with pytest.raises(QuotaExceededError, match="ATLAS_FILESYSTEM_MAX_WRITE_BYTES='lots'"):
        FileLimits.effective(None, {"ATLAS_FILESYSTEM_MAX_WRITE_BYTES": "lots"})
    with pytest.raises(ConfigurationError):  # and still a configuration error
        FileLimits.effective(None, {"SANDBOX_KERNEL_EXT_FS_MAX_LIST_ENTRIES": "-1"})


def test_atlas_handlers_take_their_root_and_quotas_from_atlas_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SANDBOX_KERNEL_EXT_FS_ROOT", raising=False)
    monkeypatch.setenv("ATLAS_FILESYSTEM_SANDBOX", str(tmp_path))
    monkeypatch.setenv("ATLAS_FILESYSTEM_MAX_WRITE_BYTES", "8")
    written = asyncio.run(filesystem_write("notes/a.txt", "12345678"))
    assert written["path"] == "/notes/a.txt"
    assert (tmp_path / "notes" / "a.txt").read_text() == "12345678"
    with pytest.raises(QuotaExceededError):
        asyncio.run(filesystem_write("notes/b.txt", "123456789"))
    assert asyncio.run(filesystem_read("/notes/a.txt"))["content"] == "12345678"
    listing = asyncio.run(filesystem_list("notes"))
    assert listing["path"] == "/notes" and [e["name"] for e in listing["entries"]] == ["a.txt"]
    with pytest.raises(SandboxViolationError):
        asyncio.run(filesystem_read("../outside.txt"))


def test_two_different_roots_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.setenv("ATLAS_FILESYSTEM_SANDBOX", str(tmp_path / "a"))
    monkeypatch.setenv("SANDBOX_KERNEL_EXT_FS_ROOT", str(tmp_path / "b"))
    with pytest.raises(ConfigurationError, match="set twice"):
        asyncio.run(filesystem_list("."))
    monkeypatch.setenv("SANDBOX_KERNEL_EXT_FS_ROOT", str(tmp_path / "a"))
    assert asyncio.run(filesystem_list("."))["entries"] == []


def test_deepagents_size_ceiling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandbox_kernel_ext import FileSystemToolset

    monkeypatch.setenv("INSPECT_AGENTS_FS_MAX_BYTES", "4")
    with FileSystemToolset.create_default(tmp_path) as toolset:
        with pytest.raises(FileSizeExceeded, match="too large"):
            toolset.write("data/big.txt", "12345")


def test_atlas_handlers_report_a_missing_path_as_a_violation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATLAS_FILESYSTEM_SANDBOX", str(tmp_path))
    monkeypatch.delenv("SANDBOX_KERNEL_EXT_FS_ROOT", raising=False)
    for missing in (filesystem_read("nope.txt"), filesystem_list("no/such/folder")):
        with pytest.raises(SandboxViolationError, match="not found") as caught:
            asyncio.run(missing)
        assert isinstance(caught.value, FileNotFoundError)  # and what other code expects
