"""What the trusted side runs or reads stays read-only inside a sandbox's writable folders.

The natural layout of a project puts `policy.yaml` beside the notebook with `writable_paths:
[.]`: a cell once rewrote its own policy to grant more, and the next cell planted a `.pth`
file that an unconfined Python ran as root. Each path of the built-in list is planted here
inside a writable project that is also the kernel's working directory, and a cell tries to
change, replace, delete or rename it away; the host's copy is checked afterwards, beside a
control file in the same folder that the same cell does change.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_kernel_ext import CapabilityParser, SandboxError, SandboxManager
from sandbox_kernel_ext.runner.trusted.plan import hidden_by_mounts

from interfaces import RUNNERS, run_code

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

ORIGINAL = "original\n"
# Relative to the project: each must stay as it was.
PLANTED = (
    "policy.yaml",
    "helper.py",  # a module the kernel imports from its working directory
    "pkg/__init__.py",  # a package there
    "analysis.ipynb",
    "jupyter_server_config.py",
    ".git/config",
    ".git/hooks/pre-commit",
    ".venv/lib/python3.11/site-packages/extra.pth",
    ".vscode/settings.json",
    ".envrc",
    "home/.bashrc",
)
# New files inside protected folders: each must not appear.
NEW_INSIDE = (
    ".git/hooks/post-checkout",
    ".venv/lib/python3.11/site-packages/evil.pth",
    "pkg/evil.py",
)


@pytest.fixture
def project(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A project folder with everything above planted, world-writable (so a root kernel's
    unprivileged child may write it by its modes), and the kernel's working directory."""
    top = Path(tempfile.mkdtemp(prefix="sbxprot-"))
    root = top / "project"
    for name in PLANTED:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(ORIGINAL)
    policy = "filesystem_config:\n  mode: read_write\n  writable_paths: [.]\n  readable_paths: []\n"
    (root / "policy.yaml").write_text(policy)
    (root / "notes.txt").write_text(ORIGINAL)  # the control
    (root / "conf").mkdir()
    subprocess.run(["chmod", "-R", "a+rwX", str(top)], check=True)
    monkeypatch.chdir(root)
    # a home inside the project: its startup files are on the list too
    monkeypatch.setattr("sandbox_kernel_ext.policy.write_protected._homes",
                        lambda: [str(root / "home")])
    try:
        yield root
    finally:
        shutil.rmtree(top, ignore_errors=True)


# Each attempt's outcome by label: 'done', or the OSError it met. The start of every attack.
ATTEMPT = r"""
import os
outcome = {}
def attempt(label, action):
    try:
        action()
        outcome[label] = 'done'
    except OSError as exc:
        outcome[label] = type(exc).__name__
"""


ATTACK = ATTEMPT + r"""
root = ROOT
for name in PLANTED:
    path = os.path.join(root, name)
    attempt('write ' + name, lambda: open(path, 'a').write('planted\n'))
    attempt('truncate ' + name, lambda: os.truncate(path, 0))
    def replace():
        with open(path + '.new', 'w') as out:
            out.write('planted\n')
        os.replace(path + '.new', path)
    attempt('replace ' + name, replace)
    attempt('unlink ' + name, lambda: os.unlink(path))
    attempt('rename ' + name, lambda: os.rename(path, path + '.moved'))
    attempt('chmod ' + name, lambda: os.chmod(path, 0o777))
for name in NEW_INSIDE:
    attempt('create ' + name, lambda: open(os.path.join(root, name), 'w').write('planted\n'))
for folder in ('.git', '.venv', '.venv/lib', 'pkg', 'home'):
    attempt('rename folder ' + folder,
            lambda: os.rename(os.path.join(root, folder), os.path.join(root, 'moved-' + folder.replace('/', '_'))))
attempt('control', lambda: open(os.path.join(root, 'notes.txt'), 'a').write('changed\n'))
attempt('control new', lambda: open(os.path.join(root, 'conf', 'made.txt'), 'w').write('new\n'))
print(outcome)
"""


def _attack_code(root: Path) -> str:
    return f"ROOT = {str(root)!r}\nPLANTED = {PLANTED!r}\nNEW_INSIDE = {NEW_INSIDE!r}\n" + ATTACK


def _check_host(root: Path) -> None:
    assert (root / "notes.txt").read_text() == ORIGINAL + "changed\n"  # the control did run
    assert (root / "conf" / "made.txt").read_text() == "new\n"  # a subfolder takes new names
    for name in PLANTED:
        if name == "policy.yaml":
            assert "writable_paths: [.]" in (root / name).read_text()
            assert "planted" not in (root / name).read_text()
        else:
            assert (root / name).read_text() == ORIGINAL, name
    for name in NEW_INSIDE:
        assert not (root / name).exists(), name
    assert not [path for path in root.rglob("*") if path.name.startswith("moved")]
    assert not [path for path in root.rglob("*.moved")]


@pytest.mark.parametrize("interface", RUNNERS)
def test_a_cell_cannot_change_what_the_trusted_side_runs(project: Path, interface: str) -> None:
    policy = CapabilityParser.from_file(project / "policy.yaml")
    code = _attack_code(project)
    with SandboxManager() as manager:
        sid = manager.create_sandbox(policy)
        result = run_code(manager, sid, interface, code)
    assert result.exit_code == 0, result
    _check_host(project)


def test_the_policy_cannot_be_replaced_by_renaming_its_folder(project: Path) -> None:
    """The policy in a subfolder: renaming the subfolder away and making a new one with a
    new policy in it would swap the file the magics read again."""
    (project / "conf" / "policy.yaml").write_text((project / "policy.yaml").read_text()
                                                 .replace("[.]", "[..]"))
    os.chmod(project / "conf" / "policy.yaml", 0o666)
    policy = CapabilityParser.from_file(project / "conf" / "policy.yaml")
    with SandboxManager() as manager:
        sid = manager.create_sandbox(policy)
        result = manager.run_python(sid, f"""
import os
root = {str(project)!r}
try:
    os.rename(os.path.join(root, 'conf'), os.path.join(root, 'old-conf'))
    os.mkdir(os.path.join(root, 'conf'))
    open(os.path.join(root, 'conf', 'policy.yaml'), 'w').write('filesystem_config: {{mode: read_only}}')
    print('swapped')
except OSError as exc:
    print('refused', type(exc).__name__)
""")
    assert "refused" in result.stdout, result
    assert "[..]" in (project / "conf" / "policy.yaml").read_text()


def test_naming_a_protected_path_opts_in(project: Path) -> None:
    """`.git` named in writable_paths: the cell may commit there."""
    policy = CapabilityParser.from_string(
        f"filesystem_config:\n  mode: read_write\n  writable_paths: [{project}, {project / '.git'}]\n")
    with SandboxManager() as manager:
        sid = manager.create_sandbox(policy)
        result = manager.run_python(sid, f"open({str(project / '.git' / 'config')!r}, 'a')"
                                         ".write('[core]\\n')")
    assert result.exit_code == 0, result
    assert (project / ".git" / "config").read_text() == ORIGINAL + "[core]\n"
    assert (project / ".git" / "hooks" / "pre-commit").read_text() == ORIGINAL


def test_a_link_planted_at_a_protected_name_protects_nothing_else(project: Path) -> None:
    """A protected name that is a symlink is skipped (what it points at is not the path);
    the run still starts."""
    (project / ".envrc").unlink()
    os.symlink(project / "notes.txt", project / ".envrc")
    policy = CapabilityParser.from_file(project / "policy.yaml")
    with SandboxManager() as manager:
        sid = manager.create_sandbox(policy)
        result = manager.run_python(sid, f"open({str(project / 'notes.txt')!r}, 'a').write('x')")
    assert result.exit_code == 0, result


def test_a_session_made_before_a_file_appeared_protects_it_at_its_next_start(project: Path) -> None:
    """What is protected is looked for at each run's start: a module made by the person
    after the sandbox was created is protected from the next run on."""
    policy = CapabilityParser.from_file(project / "policy.yaml")
    with SandboxManager() as manager:
        sid = manager.create_sandbox(policy)
        assert manager.run_python(sid, "pass").exit_code == 0
        (project / "late.py").write_text(ORIGINAL)
        os.chmod(project / "late.py", 0o666)
        result = manager.run_python(sid, f"""
try:
    open({str(project / 'late.py')!r}, 'a').write('planted')
    print('written')
except OSError as exc:
    print('refused', type(exc).__name__)
""")
    assert "refused" in result.stdout, result
    assert (project / "late.py").read_text() == ORIGINAL


def test_a_missing_path_is_refused_by_name_not_silently(project: Path) -> None:
    """The policy file's own writable grant still has to exist (a clear error otherwise)."""
    policy = CapabilityParser.from_string(
        "filesystem_config:\n  mode: read_write\n  writable_paths: [/nonexistent/sbx]\n")
    with SandboxManager() as manager, pytest.raises(SandboxError, match="/nonexistent/sbx"):
        manager.create_sandbox(policy)


@pytest.mark.skipif(not hidden_by_mounts(), reason="the rename is refused by Landlock alone "
                    "without mounts (the outer folder gets no write rule)")
def test_a_nested_writable_folder_does_not_open_a_way_around(project: Path) -> None:
    """Found in review: `writable_paths: [W, W/x/repo]` with `W/x/repo/.git`: the folders
    above the protected path were anchored from the inner root only, so the cell renamed
    `W/x` away and made a new `.git/config` with an fsmonitor command at the old path."""
    repo = project / "x" / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / ".git" / "config").write_text(ORIGINAL)
    subprocess.run(["chmod", "-R", "a+rwX", str(project / "x")], check=True)
    policy = CapabilityParser.from_string(
        f"filesystem_config:\n  mode: read_write\n  writable_paths: [{project}, {repo}]\n")
    with SandboxManager() as manager:
        sid = manager.create_sandbox(policy)
        result = manager.run_python(sid, f"""
import os
x = {str(project / 'x')!r}
try:
    os.rename(x, x + '-old')
    os.makedirs(os.path.join(x, 'repo', '.git'))
    open(os.path.join(x, 'repo', '.git', 'config'), 'w').write('[core]\\n\\tfsmonitor = evil\\n')
    print('replaced')
except OSError as exc:
    print('refused', type(exc).__name__)
""")
    assert "refused" in result.stdout, result
    assert (repo / ".git" / "config").read_text() == ORIGINAL


def test_a_virtual_environment_stays_whole(project: Path) -> None:
    """Found in review: `.venv/bin/python`, `bin/activate` and `pyvenv.cfg` were writable
    (only `lib/python3*` was protected): the next kernel started from it ran the cell's code."""
    venv = project / ".venv"
    (venv / "bin").mkdir(parents=True)
    for name in ("pyvenv.cfg", "bin/activate", "bin/jupyter"):
        (venv / name).write_text(ORIGINAL)
    os.symlink("/usr/bin/python3", venv / "bin" / "python")
    subprocess.run(["chmod", "-R", "a+rwX", str(venv)], check=True)
    policy = CapabilityParser.from_file(project / "policy.yaml")
    with SandboxManager() as manager:
        sid = manager.create_sandbox(policy)
        result = manager.run_python(sid, f"""
import os
venv = {str(venv)!r}
for name in ('pyvenv.cfg', 'bin/activate', 'bin/jupyter', 'bin/new'):
    try:
        open(os.path.join(venv, name), 'a').write('planted')
        print('changed', name)
    except OSError as exc:
        print('refused', name)
try:
    os.unlink(os.path.join(venv, 'bin', 'python'))
    os.symlink('/tmp/evil', os.path.join(venv, 'bin', 'python'))
    print('changed python')
except OSError:
    print('refused python')
""")
    assert "changed" not in result.stdout, result.stdout
    for name in ("pyvenv.cfg", "bin/activate", "bin/jupyter"):
        assert (venv / name).read_text() == ORIGINAL
    assert os.readlink(venv / "bin" / "python") == "/usr/bin/python3"


# New names at the top of a folder Python imports from first (the kernel's working directory,
# a folder on its sys.path): each would run in the next kernel started there, or in this one
# at its next import of that name. Each must not appear on the host.
PLANT_NEW = ATTEMPT + r"""
for top in TOPS:
    attempt('launcher ' + top, lambda: open(os.path.join(top, 'ipykernel_launcher.py'), 'w').write('planted'))
    attempt('shadow ' + top, lambda: open(os.path.join(top, 'pandas.py'), 'x').write('planted'))
    attempt('pth ' + top, lambda: open(os.path.join(top, 'evil.pth'), 'w').write('import os'))
    attempt('package ' + top, lambda: os.mkdir(os.path.join(top, 'newpkg')))
    attempt('symlink ' + top, lambda: os.symlink('/tmp', os.path.join(top, 'linked.py')))
    attempt('hard link ' + top, lambda: os.link(os.path.join(top, 'sub', 'seed.py'), os.path.join(top, 'seed.py')))
    attempt('moved in ' + top, lambda: os.rename(os.path.join(top, 'sub', 'seed.py'), os.path.join(top, 'moved.py')))
    attempt('fifo ' + top, lambda: os.mkfifo(os.path.join(top, 'fifo.py')))
    attempt('control ' + top, lambda: open(os.path.join(top, 'data.csv'), 'a').write('more'))
    attempt('control sub ' + top, lambda: open(os.path.join(top, 'sub', 'new.py'), 'w').write('fine'))
print(sorted(outcome.items()))
"""


@pytest.mark.parametrize("interface", RUNNERS)
def test_no_new_name_appears_where_python_imports_first(project: Path, interface: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the issue's review: a cell that may write the kernel's working directory
    planted `ipykernel_launcher.py` there, which the next kernel start ran unconfined. The
    working directory and a folder on the kernel's `sys.path` inside the writable project:
    what is in them stays writable, nothing new can be named at their top."""
    on_path = project / "src"
    tops = [project, on_path]
    for top in tops:
        (top / "sub").mkdir(parents=True, exist_ok=True)
        (top / "sub" / "seed.py").write_text(ORIGINAL)
        (top / "data.csv").write_text(ORIGINAL)
    subprocess.run(["chmod", "-R", "a+rwX", str(project)], check=True)
    monkeypatch.syspath_prepend(str(on_path))
    before = {top: sorted(os.listdir(top)) for top in tops}
    policy = CapabilityParser.from_file(project / "policy.yaml")
    with SandboxManager() as manager:
        sid = manager.create_sandbox(policy)
        result = run_code(manager, sid, interface, f"TOPS = {[str(t) for t in tops]!r}\n" + PLANT_NEW)
    assert result.exit_code == 0, result
    for top in tops:
        assert sorted(os.listdir(top)) == before[top], (top, result.stdout)
        assert (top / "data.csv").read_text() == ORIGINAL + "more", result.stdout
        assert (top / "sub" / "new.py").read_text() == "fine", result.stdout
        assert (top / "sub" / "seed.py").read_text() == ORIGINAL


def test_a_link_at_a_closed_folders_top_grants_nothing_outside(project: Path) -> None:
    """The working directory's subfolders become Landlock rules one by one; a rule follows a
    link, so a link there to a folder the policy never named must not become one
    (`data -> /mnt/disk`)."""
    outside = Path(tempfile.mkdtemp(prefix="sbxout-"))
    try:
        os.chmod(outside, 0o777)
        os.symlink(outside, project / "elsewhere")
        policy = CapabilityParser.from_file(project / "policy.yaml")
        with SandboxManager() as manager:
            sid = manager.create_sandbox(policy)
            result = manager.run_python(sid, f"""
try:
    open({str(project / 'elsewhere' / 'new.txt')!r}, 'w').write('x')
    print('written')
except OSError as exc:
    print('refused', type(exc).__name__)
""")
        assert "refused" in result.stdout, result
        assert not (outside / "new.txt").exists()
    finally:
        shutil.rmtree(outside, ignore_errors=True)


def test_the_file_tools_keep_the_same_paths(project: Path) -> None:
    """The in-kernel file tools write as the kernel, with no mount to hold them: the same
    paths are refused by name at each change, and nothing that could run is made where the
    kernel imports first (found in review: a `.pdbrc` made there ran at the next `%debug`);
    a report may be."""
    from sandbox_kernel_ext import FileSystemToolset
    from sandbox_kernel_ext.policy.errors import PathNotWritableError

    (project / "tools.yaml").write_text("paths:\n  proj:\n    root: .\n    mode: rw\n"
                                        "    write_approval: false\n")
    tools = FileSystemToolset.from_policy(CapabilityParser.from_file(project / "tools.yaml"))
    refused = {
        "policy": lambda: tools.write_file("/proj/tools.yaml", "paths: {}"),
        "module": lambda: tools.write_file("/proj/helper.py", "planted"),
        "hook": lambda: tools.write_file("/proj/.git/hooks/post-checkout", "planted"),
        "launcher": lambda: tools.write_file("/proj/ipykernel_launcher.py", "planted"),
        "inside a package": lambda: tools.write_file("/proj/pkg/evil.py", "planted"),
        "package": lambda: tools.write_file("/proj/pandas/__init__.py", "planted"),
        "renamed to a module": lambda: tools.move_file("/proj/notes.txt", "/proj/notes.py"),
        "copied to a .pth": lambda: tools.copy_file("/proj/notes.txt", "/proj/x.pth"),
        "deleted": lambda: tools.delete_file("/proj/.envrc"),
        "edited": lambda: tools.edit_file("/proj/.envrc", "original", "export X=1"),
        "home startup": lambda: tools.write_file("/proj/home/.bashrc", "planted"),
        "debugger settings": lambda: tools.write_file("/proj/.pdbrc", "import os"),
        "test runner settings": lambda: tools.write_file("/proj/pytest.ini", "[pytest]"),
        "a module's folder": lambda: tools.write_file("/proj/json/rows.txt", "x"),
    }
    outcome = {}
    for label, change in refused.items():
        try:
            change()
            outcome[label] = "done"
        except PathNotWritableError as exc:
            outcome[label] = "refused"
            assert "/tmp" not in str(exc) and str(project) not in str(exc)  # no host path
    assert set(outcome.values()) == {"refused"}, [k for k, v in outcome.items() if v != "refused"]
    tools.write_file("/proj/notes.txt", "changed\n")
    tools.write_file("/proj/report.md", "a report beside the notebook\n")
    tools.write_file("/proj/figures/plot.txt", "a folder of no module's name\n")
    tools.write_file("/proj/conf/new.py", "fine\n")
    assert (project / "report.md").exists() and (project / "conf" / "new.py").exists()
    assert not (project / "ipykernel_launcher.py").exists() and not (project / "pandas").exists()
    _check_untouched(project)


def _check_untouched(root: Path) -> None:
    for name in PLANTED:
        if name != "policy.yaml":
            assert (root / name).read_text() == ORIGINAL, name
    assert "write_approval: false" in (root / "tools.yaml").read_text()


SHADOW = ATTEMPT + r"""
for label, action in ACTIONS:
    attempt(label, action)
print(sorted(outcome.items()))
"""


def _attack(project: Path, actions: str, interface: str = "run_python") -> str:
    policy = CapabilityParser.from_file(project / "policy.yaml")
    with SandboxManager() as manager:
        sid = manager.create_sandbox(policy)
        result = run_code(manager, sid, interface, actions + SHADOW)
    assert result.exit_code == 0, result
    return result.stdout


def test_a_folder_named_like_a_module_is_kept_whole(project: Path) -> None:
    """Found in review: a data folder `json/` (or `logging/`, `email/`) beside the notebook,
    given an `__init__.py`, shadowed the standard module at the next kernel start, which
    imports them. A folder of another name stays writable."""
    for name in ("json", "data"):
        (project / name).mkdir()
        (project / name / "rows.txt").write_text(ORIGINAL)
    subprocess.run(["chmod", "-R", "a+rwX", str(project)], check=True)
    out = _attack(project, f"""
root = {str(project)!r}
ACTIONS = [
    ('json init', lambda: open(root + '/json/__init__.py', 'w').write('planted')),
    ('json rows', lambda: open(root + '/json/rows.txt', 'a').write('x')),
    ('data new', lambda: open(root + '/data/new.txt', 'w').write('fine')),
]
""")
    assert "('data new', 'done')" in out, out
    assert not (project / "json" / "__init__.py").exists()
    assert (project / "json" / "rows.txt").read_text() == ORIGINAL


def test_a_missing_folder_on_the_kernels_path_cannot_be_made(project: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in review: `sys.path` named `lib/src`, which did not exist; a cell made it with
    a module in it, which the kernel imported next."""
    (project / "lib").mkdir()
    subprocess.run(["chmod", "-R", "a+rwX", str(project)], check=True)
    monkeypatch.syspath_prepend(str(project / "lib" / "src"))
    out = _attack(project, f"""
root = {str(project)!r}
ACTIONS = [('make it', lambda: os.makedirs(root + '/lib/src'))]
""")
    assert "('make it', 'done')" not in out and not (project / "lib" / "src").exists(), out


def test_a_link_on_the_way_to_the_kernels_path_cannot_be_swapped(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in review: `sys.path` spelled `a/link/src` with `link -> ../real`; a cell put a
    folder of its own where the link was, and the kernel imported its module."""
    (project / "real" / "src").mkdir(parents=True)
    (project / "a").mkdir()
    os.symlink("../real", project / "a" / "link")
    subprocess.run(["chmod", "-R", "a+rwX", str(project)], check=True)
    monkeypatch.syspath_prepend(str(project / "a" / "link" / "src"))
    out = _attack(project, f"""
root = {str(project)!r}
def swap():
    os.rename(root + '/a/link', root + '/a/old-link')
    os.makedirs(root + '/a/link/src')
    open(root + '/a/link/src/evilmod.py', 'w').write('planted')
ACTIONS = [('swap', swap), ('beside', lambda: open(root + '/a/other.txt', 'w').write('x'))]
""")
    assert "('swap', 'done')" not in out, out
    assert os.readlink(project / "a" / "link") == "../real"
    assert not (project / "a" / "link" / "src" / "evilmod.py").exists()


def test_a_new_file_beside_the_notebook_is_refused_saying_why(project: Path) -> None:
    """Found in review: the refusal was a bare "Read-only file system: 'results.csv'"."""
    policy = CapabilityParser.from_file(project / "policy.yaml")
    with SandboxManager() as manager:
        sid = manager.create_sandbox(policy)
        result = manager.run_python(sid, "open('results.csv', 'w').write('a,b')")
    assert result.exit_code == 1 and not (project / "results.csv").exists()
    assert "takes no new file from a sandbox" in result.stderr
    assert "write new files in a subfolder" in result.stderr, result.stderr


def test_what_the_kernel_imports_from_elsewhere_stays(project: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in review, each run by a later kernel or import as root: a relative `sys.path`
    entry (`sys.path.insert(0, "../src")`), a zip on `sys.path` rewritten in place, a
    package the kernel imported from a folder not on `sys.path` (an editable install's
    finder), a home's `.local/lib` made anew with a `.pth` in it, and the folder the kernel
    started in after `%cd` moved it elsewhere."""
    import importlib.util
    import zipfile

    nb = project / "nb"
    for folder in (nb, project / "src", project / "lib" / "mypkg", project / "vendor"):
        folder.mkdir(parents=True)
    (project / "lib" / "mypkg" / "__init__.py").write_text(ORIGINAL)
    with zipfile.ZipFile(project / "vendor" / "deps.zip", "w") as archive:
        archive.writestr("depmod.py", ORIGINAL)
    subprocess.run(["chmod", "-R", "a+rwX", str(project)], check=True)
    monkeypatch.chdir(nb)
    monkeypatch.syspath_prepend("../src")
    monkeypatch.syspath_prepend(str(project / "vendor" / "deps.zip"))
    spec = importlib.util.spec_from_file_location("mypkg", project / "lib" / "mypkg" / "__init__.py",
                                                  submodule_search_locations=[str(project / "lib" / "mypkg")])
    monkeypatch.setitem(sys.modules, "mypkg", importlib.util.module_from_spec(spec))
    monkeypatch.setattr("sandbox_kernel_ext.policy.write_protected._STARTED_IN", str(project))
    monkeypatch.setattr("sandbox_kernel_ext.policy.write_protected._homes",
                        lambda: [str(project / "home")])  # it has no .local yet
    out = _attack(project, f"""
root = {str(project)!r}
ACTIONS = [
    ('relative entry', lambda: open(root + '/src/evilmod.py', 'w').write('planted')),
    ('zip', lambda: open(root + '/vendor/deps.zip', 'r+b').write(b'planted')),
    ('imported package', lambda: open(root + '/lib/mypkg/__init__.py', 'a').write('planted')),
    ('user site', lambda: os.makedirs(root + '/home/.local/lib/python3.11/site-packages')),
    ('start folder', lambda: open(root + '/ipykernel_launcher.py', 'w').write('planted')),
    ('control', lambda: open(root + '/nb/sub.txt', 'w') if False else None),
]
""")
    assert out.count("'done'") == 1, out  # the control only
    assert not (project / "src" / "evilmod.py").exists()
    assert not (project / "home" / ".local").exists()
    assert not (project / "ipykernel_launcher.py").exists()
    assert (project / "lib" / "mypkg" / "__init__.py").read_text() == ORIGINAL
    with zipfile.ZipFile(project / "vendor" / "deps.zip") as archive:
        assert archive.read("depmod.py").decode() == ORIGINAL


def test_a_module_python_reaches_through_a_link_stays(project: Path) -> None:
    """Found in review: `link.py -> src/real.py` and `lnpkg -> src/lnpkg` beside the
    notebook; the cell rewrote the targets in the writable subfolder, and the kernel ran
    them at `import link`."""
    (project / "src" / "lnpkg").mkdir(parents=True)
    (project / "src" / "real.py").write_text(ORIGINAL)
    (project / "src" / "lnpkg" / "__init__.py").write_text(ORIGINAL)
    os.symlink("src/real.py", project / "link.py")
    os.symlink("src/lnpkg", project / "lnpkg")
    subprocess.run(["chmod", "-R", "a+rwX", str(project)], check=True)
    out = _attack(project, f"""
root = {str(project)!r}
ACTIONS = [
    ('module', lambda: open(root + '/src/real.py', 'a').write('planted')),
    ('package', lambda: open(root + '/src/lnpkg/__init__.py', 'a').write('planted')),
    ('beside', lambda: open(root + '/src/other.py', 'w').write('fine')),
]
""")
    # without mounts the folder holding a protected file takes no new names (the reference)
    assert ("('beside', 'done')" in out) is hidden_by_mounts(), out
    assert (project / "src" / "real.py").read_text() == ORIGINAL
    assert (project / "src" / "lnpkg" / "__init__.py").read_text() == ORIGINAL
