"""A "read everywhere" sandbox reads none of the credential stores real tools keep in a home
folder (issue 13, section 1): every entry of the built-in list is planted, world-readable, in
a fresh home under /home, and a confined child tries to read it, as does the file toolset. The
home's other files stay readable (the control that shows a denial is the list's doing, not the
file's mode).

A site adds stores for every sandbox (`SANDBOX_KERNEL_EXT_NEVER_READ_PATHS`), a policy for its
own (`filesystem_config.never_read_paths`): a file listed only there is read before (the
control) and hidden after, by a child and by the toolset alike.

Where the child has a mount namespace, a denied folder is an empty tmpfs to it and a denied file
is /dev/null (a read finds nothing); elsewhere Landlock refuses the open."""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_kernel_ext import (
    CapabilityDeclaration,
    FilesystemConfig,
    FileSystemToolset,
    SandboxManager,
    SandboxResult,
)
from sandbox_kernel_ext.policy.credential_stores import NEVER_READ_ENV
from sandbox_kernel_ext.policy.errors import ConfigurationError, SandboxError
from sandbox_kernel_ext.policy.narrowing import Narrowing, NarrowingError, narrow
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
    # found by an attack corpus: where real tools document that they keep a secret
    ".subversion/auth/svn.simple/5f1e4f9a0c1b2d3e4f5a6b7c8d9e0f1a", ".subversion/servers",
    ".hgrc", ".config/hg/hgrc", ".dbt/profiles.yml", ".config/code-server/config.yaml",
    ".ollama/id_ed25519", ".ollama/history", ".local/state/nvim/shada/main.shada",
    ".local/share/nvim/shada/main.shada", ".config/fish/fish_variables",
    ".wrangler/config/default.toml", ".config/.wrangler/config/default.toml",
    ".supabase/access-token", ".aider.conf.yml", ".aider/oauth-keys.env", ".env",
)
# Files beside the stores that stay readable: the controls. Ollama's models sit next to its
# key, which is denied alone so that they do not go with it.
CONTROLS = {"notes.txt": "public notes\n", ".ollama/models/blobs/sha256-0": "model weights\n"}


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
        for name, text in CONTROLS.items():
            (home / name).parent.mkdir(parents=True, exist_ok=True)
            (home / name).write_text(text)
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
    for name, text in CONTROLS.items():
        assert seen.pop(str(planted_home / name)) == text
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


def _toolset(root: Path, never_read_paths: list[str] | None = None) -> FileSystemToolset:
    """The file toolset of a policy whose path table has the one root `h` at `root`."""
    config = {} if never_read_paths is None else {"never_read_paths": never_read_paths}
    return FileSystemToolset.from_policy(CapabilityDeclaration.model_validate({
        "filesystem_config": config,
        "paths": {"h": {"root": str(root), "mode": "rw", "write_approval": False}}}))


def _toolset_reads(tools: FileSystemToolset, paths: list[str]) -> dict[str, str]:
    """Each virtual path's text, or the name of the error reading it raised."""
    seen = {}
    for path in paths:
        try:
            seen[path] = tools.read(path).content
        except Exception as exc:  # noqa: BLE001 - any refusal counts; its text is checked
            assert "SECRET" not in str(exc)
            seen[path] = type(exc).__name__
    return seen


def test_every_credential_store_is_refused_by_the_file_toolset(planted_home: Path) -> None:
    """The same list, the other way in: a path table root at the home."""
    planted = [os.path.relpath(path, planted_home) for path in _planted(planted_home)]
    with _toolset(planted_home) as tools:
        seen = _toolset_reads(tools, [f"/h/{name}" for name in planted])
    for name, text in CONTROLS.items():
        assert seen.pop(f"/h/{name}") == text
    assert {path: text for path, text in seen.items() if text.startswith("SECRET")} == {}


@pytest.fixture
def own_stores(planted_home: Path, shared_dir: Path) -> tuple[Path, Path]:
    """A store on no built-in list in the home (a tool's token beneath .config, which is not
    denied whole) and one outside every home, both world-readable."""
    token = planted_home / ".config" / "acme-cli" / "token"
    token.parent.mkdir(parents=True)
    vault = shared_dir / "vault" / "key.txt"
    vault.parent.mkdir()
    for path in (token, vault):
        path.write_text(f"SECRET {path.name}\n")
        path.chmod(0o644)
        path.parent.chmod(0o755)
    return token, vault


def _own_policy(readable: list[str] | None, never_read_paths: list[str] | None = None
                ) -> CapabilityDeclaration:
    config: dict[str, object] = {"mode": "read_only", "readable_paths": readable}
    if never_read_paths is not None:
        config["never_read_paths"] = never_read_paths
    return CapabilityDeclaration.model_validate({"filesystem_config": config})


def _run_reads(manager: SandboxManager, policy: CapabilityDeclaration,
               paths: list[Path]) -> dict[str, str]:
    sid = manager.create_sandbox(policy)
    try:
        result = manager.run_python(sid, f"paths = {[str(p) for p in paths]!r}\n" + CODE)
    finally:
        manager.destroy(sid)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("readable", ["everywhere", "the home and the vault"])
def test_a_policys_never_read_paths_are_hidden_from_its_sandboxes(
    manager: SandboxManager, planted_home: Path, own_stores: tuple[Path, Path], readable: str
) -> None:
    token, vault = own_stores
    notes = planted_home / "notes.txt"
    grants = None if readable == "everywhere" else [str(planted_home), str(vault.parent)]
    before = _run_reads(manager, _own_policy(grants), [token, vault, notes])
    assert before == {str(token): "SECRET token\n", str(vault): "SECRET key.txt\n",
                      str(notes): "public notes\n"}  # the control: only the field hides them
    stores = ["~/.config/acme-cli", str(vault)]
    after = _run_reads(manager, _own_policy(grants, stores), [token, vault, notes])
    assert after.pop(str(notes)) == "public notes\n"
    assert set(after.values()) <= DENIED_OUTCOMES, after


def test_a_never_read_path_wins_over_a_grant_of_it(
    manager: SandboxManager, planted_home: Path, own_stores: tuple[Path, Path]
) -> None:
    """Named as readable (the store itself, and a folder inside it) and as never read: never
    read. A built-in store named readable is granted; listed in the field too, it is not."""
    token, vault = own_stores
    ipython = planted_home / ".ipython" / "profile_default" / "history.sqlite"
    grants = [str(token.parent), str(vault.parent), str(planted_home / ".ipython"),
              str(planted_home / "notes.txt")]
    stores = ["~/.config/acme-cli", str(vault.parent), "~/.ipython"]
    seen = _run_reads(manager, _own_policy(grants, stores), [token, vault, ipython])
    assert set(seen.values()) <= DENIED_OUTCOMES, seen
    granted = _run_reads(manager, _own_policy(grants), [token, ipython])  # the control
    assert granted[str(ipython)].startswith("SECRET"), granted


def test_the_toolset_refuses_a_policys_never_read_paths(
    planted_home: Path, own_stores: tuple[Path, Path]
) -> None:
    token, _ = own_stores
    wanted = ["/h/.config/acme-cli/token", "/h/notes.txt"]
    with _toolset(planted_home) as tools:  # the control
        assert _toolset_reads(tools, wanted) == {wanted[0]: "SECRET token\n",
                                                 wanted[1]: "public notes\n"}
    with _toolset(planted_home, ["~/.config/acme-cli"]) as tools:
        seen = _toolset_reads(tools, wanted)
        assert seen.pop(wanted[1]) == "public notes\n"
        assert not seen[wanted[0]].startswith("SECRET"), seen
        with pytest.raises(Exception):
            tools.write("/h/.config/acme-cli/token", "overwritten\n")
    # a root that is such a store serves nothing: the store wins over the table
    with _toolset(token.parent, ["~/.config/acme-cli"]) as tools:
        assert not _toolset_reads(tools, ["/h/token"])["/h/token"].startswith("SECRET")
    assert token.read_text() == "SECRET token\n"


def test_the_site_setting_hides_its_stores_from_every_sandbox_and_toolset(
    manager: SandboxManager, planted_home: Path, own_stores: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    token, vault = own_stores
    notes = planted_home / "notes.txt"
    policy = _own_policy(None)
    monkeypatch.delenv(NEVER_READ_ENV, raising=False)
    assert _run_reads(manager, policy, [token, vault])[str(vault)] == "SECRET key.txt\n"
    monkeypatch.setenv(NEVER_READ_ENV, f"~/.config/acme-cli{os.pathsep}{vault}")
    seen = _run_reads(manager, policy, [token, vault, notes])
    assert seen.pop(str(notes)) == "public notes\n"
    assert set(seen.values()) <= DENIED_OUTCOMES, seen
    with _toolset(planted_home) as tools:
        seen = _toolset_reads(tools, ["/h/.config/acme-cli/token", "/h/notes.txt"])
    assert not seen["/h/.config/acme-cli/token"].startswith("SECRET"), seen
    assert seen["/h/notes.txt"] == "public notes\n"
    with _toolset(vault.parent.parent) as tools:
        assert not _toolset_reads(tools, ["/h/vault/key.txt"])["/h/vault/key.txt"].startswith(
            "SECRET")


@pytest.mark.parametrize("value,why", [
    ("relative/token", "is relative"), ("~bob/.token", "names one user's home"),
    ("/srv/../etc/shadow", "'..'"), ("/", "would hide everything"),
])
def test_a_bad_site_setting_refuses_to_run_and_says_which_variable(
    manager: SandboxManager, monkeypatch: pytest.MonkeyPatch, value: str, why: str
) -> None:
    """Fail closed: a store the site meant to hide is never read because it was misspelt."""
    monkeypatch.setenv(NEVER_READ_ENV, f"/srv/fine{os.pathsep}{value}")
    with pytest.raises(ConfigurationError, match=f"{NEVER_READ_ENV} entry .*{why}"):
        manager.create_sandbox(_own_policy(None))


def test_a_never_read_path_that_holds_the_interpreter_is_refused(manager: SandboxManager) -> None:
    """It would take the child's own Python from it: said at once, not a broken run."""
    policy = _own_policy(None, [os.path.dirname(os.path.realpath(sys.executable))])
    with pytest.raises(SandboxError, match="never_read_paths entry .* every sandbox (needs|reads) to run"):
        manager.create_sandbox(policy)


def test_a_cell_may_not_name_a_never_read_path_and_keeps_the_field(
    planted_home: Path, own_stores: tuple[Path, Path]
) -> None:
    token, _ = own_stores
    ceiling = _own_policy(None, ["~/.config/acme-cli"])
    with pytest.raises(NarrowingError, match="never_read_paths"):
        narrow(ceiling, Narrowing(allow_read=(str(token),)))
    # (the built-in list set aside: under "read everywhere" a home holds its stores)
    narrowed = narrow(ceiling, Narrowing(allow_read=(str(planted_home),)), denied=())
    assert narrowed.filesystem_config.never_read_paths == ["~/.config/acme-cli"]


def test_a_cell_cannot_narrow_its_way_into_a_store(manager: SandboxManager, planted_home: Path,
                                                  ) -> None:
    """Found in review: a ceiling that reads a home hides its stores, and a cell's
    `--allow-read ~/.ssh` made a policy that named the store, which a policy that names a
    store is granted: the cell read the key. Every store on the list, by the default deny
    list and by the notebook's (`withheld_from_everywhere`)."""
    from sandbox_kernel_ext.runner.trusted.plan import withheld_from_everywhere

    ceiling = CapabilityDeclaration(filesystem_config=FilesystemConfig(
        mode="read_only", readable_paths=[str(planted_home)]))
    lists = {"default": None, "notebook's": withheld_from_everywhere()}
    for entry in HOME_CREDENTIAL_PATHS:
        for name, denied in lists.items():
            with pytest.raises(NarrowingError, match="never lets a sandbox read"):
                narrow(ceiling, Narrowing(allow_read=(str(planted_home / entry),)), denied=denied)
    # the ceiling's own choice stays: a store it names is a cell's to name
    store = str(planted_home / ".netrc")
    named = CapabilityDeclaration(filesystem_config=FilesystemConfig(
        mode="read_only", readable_paths=[store]))
    assert narrow(named, Narrowing(allow_read=(store,))).filesystem_config.readable_paths == [
        store]
    # ...and the policy a refused narrowing would have made reads the store: the control
    sid = manager.create_sandbox(named)
    shown = manager.run_python(sid, f"print(open({store!r}).read())")
    assert "SECRET" in shown.stdout, shown
