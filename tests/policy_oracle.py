"""A differential check of the policy: random host trees and policies, every probe through
each interface, judged by its effect on the host against an oracle written from the policy
reference ("How a policy is read"), not from the code.

`World` builds a tree (nested folders of several owners and modes, names with spaces,
unicode and leading dashes, symlinks in and out of it, a home with a credential store),
`draw_policy` a policy over it (through `filesystem_config` or the `paths` table, spelled
directly or through links, "read everywhere" sometimes), `expect` says what the reference
promises, and `observe` runs the probes through `execute`, `run_python`, a session's
`run_cell` and the file toolset and reads the outcome back from the host. Used by
`tests/security/test_policy_differential.py` (a fixed seed in CI) and
`scripts/policy_differential.py` (as many policies as you like).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import stat
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from sandbox_kernel_ext import (
    CapabilityParser,
    FileSystemToolset,
    SandboxError,
    SandboxManager,
)
from sandbox_kernel_ext.policy.paths import is_within

from interfaces import run_code

NAMES = ("data", "my data", "dañs", "-x", "notes ü", "raw", "out", "a b", "ünï", "--", "proj")
SECRET = "DIFF-SECRET-KEY"
OTHER_UID = 1000
INTERFACES = ("execute", "run_python", "session", "toolset")


@dataclass
class Folder:
    path: str
    owner: int
    mode: int
    probe_mode: int


@dataclass
class World:
    """A host tree for one policy; `close()` removes it."""

    top: str
    home: str
    folders: list[Folder] = field(default_factory=list)
    links: dict[str, str] = field(default_factory=dict)  # link path -> target
    workdir: str | None = None  # the kernel's working directory while the policy runs

    @property
    def store(self) -> str:
        return os.path.join(self.home, ".ssh")

    @classmethod
    def build(cls, rng: random.Random) -> World:
        root = os.geteuid() == 0
        top = tempfile.mkdtemp(prefix="sbx-diff-")
        os.chmod(top, 0o755)
        home = f"/home/sbxdiff-{uuid.uuid4().hex[:8]}" if os.access("/home", os.W_OK) else \
            os.path.join(top, "home")
        world = cls(top=top, home=home)
        os.makedirs(os.path.join(home, ".ssh"))
        Path(home, ".ssh", "id_rsa").write_text(SECRET)
        Path(home, "notes.txt").write_text("public notes\n")
        for path in (home, os.path.join(home, ".ssh")):
            os.chmod(path, 0o755)
        for path in (os.path.join(home, ".ssh", "id_rsa"), os.path.join(home, "notes.txt")):
            os.chmod(path, 0o666)
        parents = [top]
        for _ in range(rng.randint(2, 9)):
            parent = rng.choice(parents)
            if parent.count("/") - top.count("/") >= 3:
                parent = top
            path = os.path.join(parent, rng.choice(NAMES))
            if os.path.lexists(path):
                continue
            os.mkdir(path)
            owner = OTHER_UID if root and rng.random() < 0.3 else os.geteuid()
            folder = Folder(path, owner, rng.choice((0o755, 0o700, 0o777)),
                            rng.choice((0o644, 0o600, 0o666)))
            probe = os.path.join(path, "probe.txt")
            Path(probe).write_text(f"probe {len(world.folders)}\n")
            os.chmod(probe, folder.probe_mode)
            if owner != os.geteuid():
                os.chown(path, owner, owner)
                os.chown(probe, owner, owner)
            world.folders.append(folder)
            parents.append(path)
        for folder in sorted(world.folders, key=lambda f: -f.path.count("/")):
            os.chmod(folder.path, folder.mode)  # deepest first: the tree is built as root
        targets = [f.path for f in world.folders] + [
            os.path.join(f.path, "probe.txt") for f in world.folders] + [
            world.store, os.path.join(world.store, "id_rsa"), os.path.join(home, "notes.txt")]
        for index in range(rng.randint(0, 4)):
            link = os.path.join(top, f"link {index}")
            world.links[link] = rng.choice(targets)
            os.symlink(world.links[link], link)
        if world.folders and rng.random() < 0.35:  # a notebook in one of these folders
            world.workdir = rng.choice(world.folders).path
        return world

    def close(self) -> None:
        shutil.rmtree(self.top, ignore_errors=True)
        shutil.rmtree(self.home, ignore_errors=True)

    def new_names(self, interface: str) -> list[str]:
        """What each interface tries to create: a module and a text file in every folder."""
        return [os.path.join(f.path, name) for f in self.folders
                for name in (f"new_{interface}.py", f"new-{interface}.txt")]

    def probes(self) -> list[str]:
        """The files each interface tries: every folder's probe, the store's key, the home's
        public file."""
        return [*(os.path.join(f.path, "probe.txt") for f in self.folders),
                os.path.join(self.store, "id_rsa"), os.path.join(self.home, "notes.txt")]


@dataclass
class Policy:
    text: str  # YAML, written as the policy file in `top`
    everywhere: bool
    readable: list[str]  # as spelled
    writable: list[str]
    table: dict[str, tuple[str, str]]  # name -> (root as spelled, "ro" | "rw")


def draw_policy(world: World, rng: random.Random) -> Policy:
    candidates = [f.path for f in world.folders] + list(world.links) + [world.home]
    spell = (lambda path: os.path.relpath(path, world.top) if rng.random() < 0.3 else path)
    everywhere = rng.random() < 0.15
    readable = [] if everywhere else [spell(rng.choice(candidates))
                                      for _ in range(rng.randint(1, 6))]
    writable = [spell(rng.choice(candidates[:-1] or candidates))
                for _ in range(rng.randint(0, 3))]
    table: dict[str, tuple[str, str]] = {}
    if rng.random() < 0.4:
        for index in range(rng.randint(1, 3)):
            table[f"t{index}"] = (spell(rng.choice(candidates)), rng.choice(("ro", "rw")))
    config = {"mode": "read_write" if writable else "read_only",
              "writable_paths": writable, "readable_paths": None if everywhere else readable}
    data: dict[str, object] = {"filesystem_config": config}
    if table:
        data["paths"] = {name: {"root": root, "mode": mode, "write_approval": False}
                         for name, (root, mode) in table.items()}
    return Policy(json.dumps(data), everywhere, readable, writable, table)


# -- the oracle: "How a policy is read", step by step ------------------------------------------

@dataclass
class Expected:
    refused: str | None = None  # which rule refuses the policy at create_sandbox
    readable: dict[str, bool] = field(default_factory=dict)  # probe -> readable
    writable: dict[str, bool] = field(default_factory=dict)
    created: dict[str, bool] = field(default_factory=dict)  # new name -> made on the host


def _real(world: World, spelled: str) -> tuple[str, str]:
    full = os.path.normpath(os.path.join(world.top, os.path.expanduser(spelled)))
    return full, os.path.realpath(full)


def expect(world: World, policy: Policy, child_uid: int | None,
           interface: str = "execute") -> Expected:
    """What the reference promises. `child_uid`: the uid a root kernel's children run as
    (None: the kernel's own, a non-root kernel)."""
    out = Expected()
    stores = [world.store]
    writable_grants, readable_grants, ro_roots = [], [], []
    entries = ([(p, "w") for p in policy.writable] + [(p, "r") for p in policy.readable]
               + [(root, "w" if mode == "rw" else "t") for root, mode in policy.table.values()])
    for spelled, kind in entries:
        full, real = _real(world, spelled)
        if not os.path.exists(real):  # step 2
            return Expected(refused="missing")
        if full != real and any(is_within(real, s) for s in stores):  # step 3
            return Expected(refused="store link")
        if kind == "w":
            writable_grants.append(real)
        else:
            readable_grants.append(real)
            if kind == "t":
                ro_roots.append(real)
    roots = [_real(world, root)[1] for root, _ in policy.table.values()]
    if _overlapping(roots):
        return Expected(refused="table roots overlap")
    for path in writable_grants:  # step 4: a writable folder may not hold a store
        if any(is_within(s, path) and s != path for s in stores):
            return Expected(refused="store in writable")
    for path in writable_grants:  # step 5: nor lie around or inside an ro root
        if any(is_within(path, r) or is_within(r, path) for r in ro_roots):
            return Expected(refused="writable around ro root")
    mapped = _owner_mapped([*writable_grants, *readable_grants]) if child_uid else []
    if child_uid:
        for path in writable_grants:
            info = os.stat(path)
            if not (info.st_uid == 0 and not _shared(info)) and info.st_uid != child_uid \
                    and not info.st_mode & 0o002:
                return Expected(refused="not writable by the child's uid")
        for path in [*writable_grants, *readable_grants]:
            for folder in _folders_to(path):
                if not _enterable(folder, mapped, child_uid):
                    return Expected(refused="closed folder on the way")
    for probe in world.probes():
        in_store = any(is_within(probe, s) for s in stores)
        granted_read = policy.everywhere or any(
            is_within(probe, g) for g in [*readable_grants, *writable_grants])
        granted_write = any(is_within(probe, g) for g in writable_grants)
        reachable = all(_enterable(folder, mapped, child_uid) for folder in _folders_to(probe))
        out.readable[probe] = (granted_read and not in_store and reachable
                               and _allowed(probe, mapped, child_uid, stat.S_IROTH))
        out.writable[probe] = (granted_write and not in_store and reachable
                               and _allowed(probe, mapped, child_uid, stat.S_IWOTH))
    closed = _closed_tops(world, writable_grants)
    for new in world.new_names(interface):
        folder = os.path.dirname(new)
        out.created[new] = (any(is_within(folder, g) for g in writable_grants)
                            and folder not in closed
                            and all(_enterable(f, mapped, child_uid) for f in _folders_to(folder))
                            and _allowed(folder, mapped, child_uid, stat.S_IWOTH))
    return out


def _closed_tops(world: World, writable_grants: list[str]) -> set[str]:
    """Step 7: the kernel's working directory takes no new name where a writable grant
    holds it, nor does any folder between that grant and it."""
    workdir = world.workdir
    if workdir is None:
        return set()
    grants = [g for g in writable_grants if is_within(workdir, g)]
    return {folder for folder in _folders_to(workdir)
            if any(is_within(folder, g) for g in grants)}


def _overlapping(roots: list[str]) -> bool:
    """Two table roots of which one holds the other (the same folder twice included)."""
    return any(is_within(a, b) for i, a in enumerate(roots) for j, b in enumerate(roots) if i != j)


def _shared(info: os.stat_result) -> bool:
    return bool(info.st_mode & stat.S_ISVTX and info.st_mode & 0o002)


def _owner_mapped(granted: list[str]) -> list[str]:
    """Root's granted folders (not shared ones like /tmp), and root's closed folders on the
    way to a grant: shown to a root kernel's child as its own."""
    mapped = []
    for path in granted:
        info = os.stat(path)
        if info.st_uid == 0 and not _shared(info):
            mapped.append(path)
        for folder in _folders_to(path):
            folder_info = os.stat(folder)
            if folder_info.st_uid == 0 and not folder_info.st_mode & 0o001:
                mapped.append(folder)
                break
    return mapped


def _folders_to(path: str) -> list[str]:
    """Every folder walked to reach `path` (and `path` itself when it is one)."""
    parts = [part for part in path.split("/") if part]
    upto = parts if os.path.isdir(path) else parts[:-1]
    return ["/" + "/".join(upto[:i]) for i in range(1, len(upto) + 1)]


def _owner(path: str, mapped: list[str], child_uid: int | None) -> int:
    info = os.stat(path)
    if child_uid is None:
        return info.st_uid if info.st_uid != os.geteuid() else -1  # -1: the child's own
    if info.st_uid == 0 and any(is_within(path, tree) for tree in mapped):
        return -1
    return -1 if info.st_uid == child_uid else info.st_uid


def _enterable(folder: str, mapped: list[str], child_uid: int | None) -> bool:
    if child_uid is None and os.geteuid() == 0:
        return True
    mode = os.stat(folder).st_mode
    return _owner(folder, mapped, child_uid) == -1 or bool(mode & stat.S_IXOTH)


def _allowed(path: str, mapped: list[str], child_uid: int | None, other_bit: int) -> bool:
    mode = os.stat(path).st_mode
    if _owner(path, mapped, child_uid) == -1:
        return bool(mode & (stat.S_IRUSR if other_bit == stat.S_IROTH else stat.S_IWUSR))
    return bool(mode & other_bit)


# -- observing: each interface, judged on the host ----------------------------------------------

PROBE_CODE = r"""
import json, os
seen = {}
for path in PROBES:
    try:
        with open(path) as f:
            seen[path] = f.read()
    except OSError as exc:
        seen[path] = '!' + type(exc).__name__
    try:
        with open(path, 'a') as f:
            f.write(MARK)
    except OSError:
        pass
for path in NEW:
    try:
        with open(path, 'x') as f:
            f.write(MARK)
    except OSError:
        pass
print('SEEN' + json.dumps(seen))
"""


@dataclass
class Observed:
    refused: str | None = None
    readable: dict[str, bool] = field(default_factory=dict)
    writable: dict[str, bool] = field(default_factory=dict)
    created: dict[str, bool] = field(default_factory=dict)


def observe(world: World, policy: Policy, interface: str, manager: SandboxManager) -> Observed:
    path = os.path.join(world.top, "policy.yaml")
    Path(path).write_text(policy.text)
    originals = {probe: Path(probe).read_bytes() for probe in world.probes()}
    try:
        capability = CapabilityParser.from_file(path)
        if interface == "toolset":
            return _observe_toolset(world, capability, originals)
        sid = manager.create_sandbox(capability)
    except SandboxError as exc:
        return Observed(refused=str(exc))
    mark = f"MARK-{interface}\n"
    new_names = world.new_names(interface)
    code = f"PROBES = {world.probes()!r}\nNEW = {new_names!r}\nMARK = {mark!r}\n" + PROBE_CODE
    try:
        result = run_code(manager, sid, interface, code)
    finally:
        manager.destroy(sid)
    line = next((line for line in result.stdout.splitlines() if line.startswith("SEEN")), None)
    if line is None:
        return Observed(refused=f"the run failed: {result.stderr[-500:]}")
    seen = json.loads(line[4:])
    out = Observed()
    for probe, before in originals.items():
        after = Path(probe).read_bytes()
        out.readable[probe] = seen.get(probe) == before.decode()
        out.writable[probe] = after == before + mark.encode()
        Path(probe).write_bytes(before)  # for the next interface
    out.created = _created(new_names)
    return out


def _created(new_names: list[str]) -> dict[str, bool]:
    """Which new names are on the host now (each removed again)."""
    made = {}
    for new in new_names:
        made[new] = os.path.lexists(new)
        if made[new]:
            os.unlink(new)
    return made


def _observe_toolset(world: World, capability, originals: dict[str, bytes]) -> Observed:
    """The toolset serves the table: what a table root holds, by its virtual path."""
    out = Observed()
    if not capability.paths:
        return Observed(refused="no table")
    tools = FileSystemToolset.from_policy(capability)
    with tools:
        for probe, before in originals.items():
            out.readable[probe] = out.writable[probe] = False
            for name, entry in capability.paths.items():
                root = os.path.realpath(os.path.join(str(capability.base_path), entry.root))
                if not is_within(probe, root) or probe == root:
                    continue
                virtual = f"/{name}/{os.path.relpath(probe, root)}"
                try:
                    out.readable[probe] = tools.read(virtual).content == before.decode()
                except Exception:  # noqa: BLE001 - any refusal is "not readable"
                    pass
                try:
                    tools.write(virtual, before.decode() + "MARK-toolset\n")
                    out.writable[probe] = True
                except Exception:  # noqa: BLE001
                    pass
                Path(probe).write_bytes(before)
        new_names = world.new_names("toolset")
        for new in new_names:
            for name, entry in capability.paths.items():
                root = os.path.realpath(os.path.join(str(capability.base_path), entry.root))
                if is_within(new, root):
                    try:
                        tools.write(f"/{name}/{os.path.relpath(new, root)}", "MARK-toolset\n")
                    except Exception:  # noqa: BLE001 - any refusal is "not made"
                        pass
        out.created = _created(new_names)
    return out


def expect_toolset(world: World, policy: Policy) -> Expected:
    """The toolset's answer from the same reference: each table root's files, as the
    kernel's own process reads them, but never a credential store (step 8)."""
    if not policy.table:
        return Expected(refused="no table")
    out = Expected()
    roots = []
    for root, mode in policy.table.values():
        full, real = _real(world, root)
        if not os.path.exists(real):
            return Expected(refused="missing")
        if full != real and is_within(real, world.store):  # step 3, as for the runner
            return Expected(refused="store link")
        roots.append((real, mode))
    if _overlapping([root for root, _ in roots]):
        return Expected(refused="table roots overlap")
    for probe in world.probes():
        inside = [(r, m) for r, m in roots if is_within(probe, r) and probe != r]
        hidden = any(is_within(probe, world.store) and world.store != r for r, _ in inside)
        out.readable[probe] = bool(inside) and not hidden
        out.writable[probe] = any(m == "rw" for _, m in inside) and not hidden
    # step 10: no new module where the kernel imports first, inside a writable root
    writable_roots = [r for r, m in roots if m == "rw"]
    closed = world.workdir if any(is_within(world.workdir or "", r) for r in writable_roots) else None
    for new in world.new_names("toolset"):
        folder = os.path.dirname(new)
        out.created[new] = (any(is_within(folder, r) for r in writable_roots)
                            and not (folder == closed and new.endswith(".py")))
    return out


def compare(expected: Expected, observed: Observed) -> list[str]:
    """The mismatches, each one line (empty when the run matches the reference)."""
    if expected.refused or observed.refused:
        if bool(expected.refused) != bool(observed.refused):
            return [f"refused: expected {expected.refused!r}, observed {observed.refused!r}"]
        return []
    problems = []
    for probe, want in expected.readable.items():
        if observed.readable.get(probe) != want:
            problems.append(f"read {probe}: expected {want}, observed {observed.readable.get(probe)}")
    for probe, want in expected.writable.items():
        if observed.writable.get(probe) != want:
            problems.append(f"write {probe}: expected {want}, observed {observed.writable.get(probe)}")
    for new, want in expected.created.items():
        if observed.created.get(new) != want:
            problems.append(f"create {new}: expected {want}, observed {observed.created.get(new)}")
    return problems


def check(rng: random.Random, manager: SandboxManager, interfaces=INTERFACES,
          label: str = "") -> list[str]:
    """One random world and policy drawn from `rng`, every interface: the mismatches, one
    line each, and the policy last (empty when everything matches the reference)."""
    world = World.build(rng)
    before = os.getcwd()
    try:
        policy = draw_policy(world, rng)
        if world.workdir is not None:
            os.chdir(world.workdir)
        problems = []
        for interface in interfaces:
            if interface == "toolset":
                expected = expect_toolset(world, policy)
            else:
                expected = expect(world, policy, manager.child_uid, interface)
            observed = observe(world, policy, interface, manager)
            problems += [f"{label}{interface}: {p}" for p in compare(expected, observed)]
        if problems:
            owners = {f.path: (f.owner, oct(f.mode), oct(f.probe_mode)) for f in world.folders}
            problems.append(f"{label}tree: {owners} links: {world.links} "
                            f"kernel's working directory: {world.workdir}")
            problems.append(f"{label}policy: {policy.text}")
        return problems
    finally:
        os.chdir(before)
        world.close()
