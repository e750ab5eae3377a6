"""A "read everywhere" sandbox reads none of the credential stores real tools keep in a home
folder (issue 13, section 1): every entry of the built-in list is planted, world-readable, in
a fresh home under /home, and a confined child tries to read it. The home's other files stay
readable (the control that shows a denial is the list's doing, not the file's mode).

Where the child has a mount namespace, a denied folder is an empty tmpfs to it and a denied file
is /dev/null (a read finds nothing); elsewhere Landlock refuses the open."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_kernel_ext import (
    CapabilityDeclaration,
    FilesystemConfig,
    SandboxManager,
    SandboxResult,
)
from sandbox_kernel_ext.runner.trusted.host_reads import HOME_CREDENTIAL_PATHS
from sandbox_kernel_ext.runner.trusted.plan import hidden_by_mounts

# What reading a denied path gives: hidden under a mount (an empty folder, an empty file), or
# refused by Landlock's rules.
DENIED_OUTCOMES = {"", "FileNotFoundError"} if hidden_by_mounts() else {"PermissionError"}

# Named in the issue, or what a tool writes there: these must stay on the list.
MUST_BE_DENIED = (
    ".ipython/profile_default/history.sqlite",  # every cell a kernel ran, keys typed included
    ".ipython/profile_work/history.sqlite",  # any profile, not only the default one
    ".local/share/jupyter/notebook_secret",  # signs trusted notebooks
    ".local/share/jupyter/nbsignatures.db",
    ".local/share/jupyter/runtime/kernel-1.json",  # a kernel's connection key
    ".cache/huggingface/token", ".cache/huggingface/stored_tokens", ".huggingface/token",
    ".aws/credentials", ".config/gcloud/credentials.db", ".azure/msal_token_cache.json",
    ".oci/config", ".kube/config", ".docker/config.json", ".config/containers/auth.json",
    ".pypirc", ".npmrc", ".config/pip/pip.conf", ".gem/credentials", ".m2/settings.xml",
    ".gradle/gradle.properties", ".config/composer/auth.json", ".condarc", ".kaggle/kaggle.json",
    ".netrc", ".git-credentials", ".config/git/credentials", ".config/gh/hosts.yml",
    ".mozilla/firefox/profiles.ini", ".config/google-chrome/Default/Login Data",
    ".config/BraveSoftware/Brave-Browser/Default/Cookies", ".thunderbird/profiles.ini",
    ".password-store/email.gpg", ".local/share/keyrings/login.keyring", ".gnupg/private-keys-v1.d",
    ".config/op/config", ".codex/auth.json", ".claude/.credentials.json", ".gemini/oauth_creds.json",
    ".config/github-copilot/hosts.json", ".ssh/id_ed25519", ".bash_history",
    ".local/share/fish/fish_history", ".psql_history", ".mysql_history",
    # found by a review after the first list
    ".local/share/python_keyring/keyring_pass.cfg", ".pki/nssdb/key4.db", ".globus/userkey.pem",
    ".config/kaggle/kaggle.json", ".config/gspread/service_account.json",
    ".streamlit/secrets.toml", ".mc/config.json", ".cloudflared/cert.pem",
    ".config/configstore/firebase-tools.json", ".continuum/anaconda-client/tokens/t",
    ".config/io.datasette.llm/keys.json", ".config/stripe/config.toml", ".sentryclirc",
    ".comet.config", "clearml.conf", ".config/dvc/config", ".local/share/opencode/auth.json",
    ".continue/config.json", ".Xauthority", ".ICEauthority", ".duckdb_history",
    ".local/share/atuin/history.db", ".viminfo",
)


@pytest.fixture
def planted_home() -> Iterator[Path]:
    """A world-readable home in /home with every credential store planted in it."""
    home = Path("/home") / f"sbxcred-{uuid.uuid4().hex[:8]}"
    home.mkdir(mode=0o755)
    try:
        # Deepest first: an entry that holds another (`.aws` and `.aws/credentials`) is a folder.
        for entry in sorted({*HOME_CREDENTIAL_PATHS, *MUST_BE_DENIED}, key=lambda e: -e.count("/")):
            path = home / entry
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():  # a folder another entry already planted a file in
                continue
            path.write_text(f"SECRET {entry}\n")
        (home / "notes.txt").write_text("public notes\n")
        for root, dirs, files in os.walk(home):
            os.chmod(root, 0o755)
            for name in files:
                os.chmod(os.path.join(root, name), 0o644)
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


CODE = """
import json
results = {}
for path in paths:
    try:
        with open(path) as f:
            results[path] = f.read()
    except OSError as exc:
        results[path] = type(exc).__name__
print(json.dumps(results))
"""


def _read_in_a_sandbox(manager: SandboxManager, readable_paths: list[str] | None,
                       paths: list[str]) -> SandboxResult:
    """A read-only sandbox with `readable_paths` reads each of `paths` (CODE), once."""
    sid = manager.create_sandbox(CapabilityDeclaration(filesystem_config=FilesystemConfig(
        mode="read_only", readable_paths=readable_paths)))
    try:
        return manager.run_python(sid, f"paths = {paths!r}\n" + CODE)
    finally:
        manager.destroy(sid)


def _planted(home: Path) -> list[str]:
    return sorted(str(p) for p in home.rglob("*") if p.is_file())


def test_every_credential_store_is_unreadable_when_reading_everywhere(
    manager: SandboxManager, planted_home: Path
) -> None:
    result = _read_in_a_sandbox(manager, None, _planted(planted_home))
    assert result.exit_code == 0, result.stderr
    seen = json.loads(result.stdout)
    control = str(planted_home / "notes.txt")
    assert seen.pop(control) == "public notes\n"
    leaked = {path: text for path, text in seen.items() if text.startswith("SECRET")}
    assert leaked == {}
    assert set(seen.values()) <= DENIED_OUTCOMES, set(seen.values())


def test_a_store_planted_after_the_sandbox_was_made_is_hidden_too(
    manager: SandboxManager, planted_home: Path
) -> None:
    """What a denied path holds is decided at each run's start, not when the sandbox was made."""
    sid = manager.create_sandbox(CapabilityDeclaration(
        filesystem_config=FilesystemConfig(mode="read_only", readable_paths=None)))
    late = [planted_home / ".config" / "late-tool", planted_home / ".aws" / "late"]
    try:
        shutil.rmtree(planted_home / ".aws")
        first = manager.run_python(sid, "print('warm')")
        assert first.exit_code == 0, first.stderr
        (planted_home / ".aws").mkdir()
        for path in late:
            path.write_text("SECRET late\n")
            path.chmod(0o644)
        result = manager.run_python(sid, f"paths = {[str(p) for p in late]!r}\n" + CODE)
    finally:
        manager.destroy(sid)
    assert result.exit_code == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen[str(late[0])] == "SECRET late\n"  # not a credential store: readable
    assert seen[str(late[1])] in DENIED_OUTCOMES, seen


def test_a_folder_the_policy_names_is_searched_for_stores_too(
    manager: SandboxManager, planted_home: Path
) -> None:
    """A policy that names a home (not "everywhere") gets the home, not the keys in it."""
    result = _read_in_a_sandbox(manager, [str(planted_home)], _planted(planted_home))
    assert result.exit_code == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen.pop(str(planted_home / "notes.txt")) == "public notes\n"
    assert {path: text for path, text in seen.items() if text.startswith("SECRET")} == {}


@pytest.mark.skipif(not hidden_by_mounts(), reason="no mounts to hide with here")
def test_a_store_the_policy_names_itself_is_granted(
    manager: SandboxManager, planted_home: Path
) -> None:
    """Naming a store (a writable ~/.ipython for a sandboxed IPython) grants it: it is not
    hidden, and what the cell writes there lands on the host."""
    profile = planted_home / ".ipython"
    profile.chmod(0o777)
    sid = manager.create_sandbox(CapabilityDeclaration(filesystem_config=FilesystemConfig(
        mode="read_write", writable_paths=[str(profile)], readable_paths=[])))
    try:
        result = manager.run_python(
            sid, f"open({str(profile / 'written')!r}, 'w').write('kept')")
    finally:
        manager.destroy(sid)
    assert result.exit_code == 0, result.stderr
    assert (profile / "written").read_text() == "kept"


@pytest.mark.skipif(not hidden_by_mounts(), reason="no mounts to hide with here")
def test_a_link_at_a_stores_name_covers_nothing_else(
    manager: SandboxManager, planted_home: Path
) -> None:
    """Found in review: a sandbox that could write a home planted `~/.aws -> /usr`, and every
    other sandbox's cover then landed on /usr (commands stopped running). A cover is mounted
    on the path reached without links, so the link covers nothing."""
    shutil.rmtree(planted_home / ".aws")
    (planted_home / ".aws").symlink_to("/usr")
    sid = manager.create_sandbox(CapabilityDeclaration(
        filesystem_config=FilesystemConfig(mode="read_only", readable_paths=None)))
    try:
        result = manager.execute(sid, ["/bin/ls", "/usr/bin/env"])
    finally:
        manager.destroy(sid)
    assert result.exit_code == 0 and result.stdout == "/usr/bin/env\n", result


def test_a_policy_path_that_is_a_link_to_a_store_does_not_name_it(
    manager: SandboxManager, planted_home: Path, shared_dir: Path
) -> None:
    """Found in review: a policy path that another sandbox had turned into a link to
    `~/.aws` counted as naming the store, which was then left unhidden."""
    from sandbox_kernel_ext import SandboxError

    (shared_dir / "data").symlink_to(planted_home / ".aws")
    with pytest.raises(SandboxError, match="leads through a symlink .* no sandbox reads"):
        _read_in_a_sandbox(manager, [str(shared_dir / "data")],
                           [str(planted_home / ".aws" / "credentials")])


def test_a_writable_folder_may_not_hold_a_store(manager: SandboxManager, planted_home: Path) -> None:
    """Found in review: a cell renamed the folder holding a store (`.config` to `.cfg`) and
    read it unhidden at its next run. A writable folder that holds a store is refused."""
    from sandbox_kernel_ext import SandboxError

    with pytest.raises(SandboxError, match="holds .*credential store"):
        manager.create_sandbox(CapabilityDeclaration(filesystem_config=FilesystemConfig(
            mode="read_write", writable_paths=[str(planted_home)])))


def test_root_named_as_readable_is_everywhere(manager: SandboxManager) -> None:
    """Found in review: `readable_paths: ["/"]` granted all of /dev and /sys, where "read
    everywhere" grants a few named entries."""
    policy = CapabilityDeclaration(filesystem_config=FilesystemConfig(
        mode="read_only", readable_paths=["/"]))
    sid = manager.create_sandbox(policy)
    try:
        result = manager.run_python(sid, """
import errno, os
out = []
for path in ('/dev/vcs', '/dev/tty0', '/sys/kernel/notes'):
    try:
        open(path, 'rb').read(1)
        out.append(path)
    except OSError as exc:
        pass
print(out)
""")
    finally:
        manager.destroy(sid)
    assert result.stdout.strip() == "[]", result
