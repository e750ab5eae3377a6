"""The confined child's start: everything that runs in the launcher's two forks of a run.

The launcher makes each run's child ahead of the run (a "spare", `launcher/server.py`): its
first fork ("setup") runs `run_setup_fork`: it drops root, enters new user, PID, network, IPC
and UTS namespaces, and forks the second, which becomes PID 1 of its namespace (when it ends,
the Linux kernel kills everything it left behind, `setsid` grandchildren included) and waits.
When a run comes, that child reads the plan, enters a mount namespace of its own, mounts a
private `/proc`, applies rlimits, drops its capabilities, closes every inherited descriptor,
confines itself with Landlock and seccomp, and then execs the program or runs the cell
(`cell.py`). A spare may also be given a sandbox's view to make before its next run (the
mount namespace to the Landlock rules, `_prepare_view`), from the plan of its last run without
the command or environment; the run takes it only if its own plan has the same view. The
launcher never reads a plan.

Everything here runs in a single-threaded process (the launcher never starts a thread), which
is what makes Landlock and seccomp cover the whole child.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import resource
import signal
import socket
import stat
import struct
from collections.abc import Iterable

from ...policy.paths import is_within
from ..linux import landlock, seccomp
from ..linux.namespaces import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUTS,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_REC,
    PR_SET_CHILD_SUBREAPER,
    PR_SET_DUMPABLE,
    attach_tree,
    bind_mount,
    clone_mount,
    detached_tmpfs,
    drop_bounding_set,
    drop_capabilities,
    drop_identity,
    enter_namespaces,
    mount,
    set_mount_readonly,
    set_mount_readonly_at,
    unshare,
)
from ..linux.syscalls import prctl, set_process_name
from ..wire import CONTROL_FD, PAYLOAD_FD, STATUS_FD, ChildPlan, receive_message

__all__ = ["run_setup_fork", "report", "TAKEN"]

# Made by a spare's setup fork, ahead of its run. The mount namespace is not among them: the
# run's child makes it (`_run_when_asked`), so that it copies the host's mounts of that moment.
NAMESPACES_AHEAD = CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET
# A private /dev/shm per child (multiprocessing's semaphores live there); the host's is shared
# by every process on the machine, so it is never granted.
SHM_SIZE_MB = 64
RLIMIT_NUMBERS = {name: getattr(resource, name) for name in (
    "RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_CORE",
)}


def report(status_fd: int, message: str) -> bool:
    try:
        os.write(status_fd, (message.replace("\n", " ") + "\n").encode())
        return True
    except OSError:
        return False


# One filter per kind of child; each program is assembled once, so a fork only loads it. A
# child with egress rules may open TCP sockets (its namespace has only loopback, and Landlock
# lets it connect to the proxy's port alone); UDP, raw and unix sockets stay refused.
SYSCALL_FILTER = (
    seccomp.SeccompFilter(allow_socket_families=(), allow_unix_pairs=True)
    if seccomp.supported_arch() else None
)
EGRESS_SYSCALL_FILTER = (
    seccomp.SeccompFilter(allow_socket_families=(socket.AF_INET, socket.AF_INET6),
                          inet_tcp_only=True, allow_unix_pairs=True)
    if seccomp.supported_arch() else None
)
# Without a network namespace: the same, and every connect is answered by the trusted side.
NOTIFIED_EGRESS_SYSCALL_FILTER = (
    seccomp.SeccompFilter(allow_socket_families=(socket.AF_INET, socket.AF_INET6),
                          inet_tcp_only=True, allow_unix_pairs=True, notify_connect=True)
    if seccomp.supported_arch() else None
)
SIOCGIFFLAGS, SIOCSIFFLAGS = 0x8913, 0x8914
IFF_UP, IFF_RUNNING = 0x1, 0x40


def open_proxy_listener(port: int) -> socket.socket:
    """Bring up the namespace's loopback and listen on 127.0.0.1:`port` (needs the namespace's
    CAP_NET_ADMIN, so it runs before the capabilities are dropped)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(probe.fileno(), SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(probe.fileno(), SIOCSIFFLAGS,
                    struct.pack("16sH14x", b"lo", flags | IFF_UP | IFF_RUNNING))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
    except BaseException:
        listener.close()
        raise
    return listener


def _hand_over_listener(plan: ChildPlan, fds: dict[str, int]) -> None:
    """The parent serves the proxy on a listener made here, in our network namespace."""
    handoff = socket.socket(fileno=fds.pop("egress"))
    try:
        if plan.proxy_port is not None:
            with open_proxy_listener(plan.proxy_port) as listener:
                socket.send_fds(handoff, [b"listener"], [listener.fileno()])
    finally:
        handoff.close()


def rules_for(plan: ChildPlan) -> landlock.LandlockRuleset | None:
    """The plan's Landlock rules, paths not yet opened (the confined child opens them as it
    builds its ruleset, in its own view of the host). None where Landlock is unavailable
    (the isolation report names that layer as missing)."""
    rules = landlock.LandlockRuleset()
    if rules.abi < 1:
        return None
    writable = set(plan.write_paths)
    for path in outermost(plan.read_paths, {*plan.read_paths, *writable}):
        rules.allow_read(path)
    for path in outermost(plan.write_paths, writable):
        _write_rules(rules, path, plan.closed_folders)
    if plan.list_everywhere:
        rules.allow_list("/")
    if plan.proxy_port is not None:
        rules.allow_tcp_connect(plan.proxy_port)  # the proxy is the one TCP port it may reach
    rules.scope_signals().scope_abstract_unix()
    return rules


def _write_rules(rules: landlock.LandlockRuleset, root: str, closed: list[str]) -> None:
    """A writable root's rules. One that holds a closed folder (where Python imports from
    first) is split: that folder and each folder on the way to it from the root may have
    their files written in place, and nothing made, removed or moved in them (a planted
    `ipykernel_launcher.py`, or the folder renamed away and made anew); every other
    subfolder of theirs is writable whole. Listed here, in the child's own view: a folder
    made since the plan is in it; a name swapped for a link is skipped (`_open_rule`)."""
    shut = [folder for folder in closed if is_within(folder, root)]
    if not shut:
        rules.allow_write(root)
        return
    on_way: set[str] = set()
    for folder in shut:
        while folder not in on_way:
            on_way.add(folder)
            if folder == root:
                break
            folder = os.path.dirname(folder)
    for folder in sorted(on_way):
        rules.allow_write_in_place(folder)
        try:
            with os.scandir(folder) as entries:
                subfolders = [entry.path for entry in entries
                              if entry.is_dir(follow_symlinks=False) and entry.path not in on_way]
        except OSError:
            continue  # gone: its rule is skipped as missing too
        for path in subfolders:
            rules.allow_write(path)


def outermost(paths: list[str], covering: set[str]) -> list[str]:
    """`paths` without repeats and without those inside a folder of `covering`: a Landlock
    rule grants beneath its folder, so a rule inside another with the same rights or more
    adds nothing but its cost (a path opened, a rule added)."""
    kept = []
    for path in dict.fromkeys(paths):
        folder, inside = path, False
        while not inside and folder != os.path.dirname(folder):
            folder = os.path.dirname(folder)
            inside = folder in covering
        if not inside:
            kept.append(path)
    return kept


def run_setup_fork(handoff: int, status_w: int, *, name: bytes, use_userns: bool,
                   uid: int | None, seen_uid: int | None = None) -> None:
    """The setup fork of a spare: it drops root (to `uid`, when the launcher is root and has
    user namespaces), enters new user, PID, network, IPC and UTS namespaces (in which it is
    `seen_uid`, else itself) and forks the child that is PID 1 there and waits for its run
    on `handoff`. That child's pid (or the error) goes to the launcher on `status_w`. Nothing
    here depends on a plan, so it all happens before the run is asked for. It is already
    called `SPARE_NAME` (the launcher names it as it forks); `name` is the launcher's, which
    the run takes back once confined."""
    signal.set_wakeup_fd(-1)  # the launcher's wake-up pipe is not ours to write
    close_other_fds({handoff, status_w})  # the launcher's socket above all: its end of file
    namespaced = use_userns or os.geteuid() == 0
    drop_root = os.geteuid() == 0 and not use_userns
    if os.geteuid() == 0 and use_userns and uid is not None:
        drop_identity(uid, uid)
    if namespaced:
        enter_namespaces(NAMESPACES_AHEAD, use_userns, seen_uid)
    # Not to be traced while it waits: a host process of the child's uid (none, by default;
    # `child_uid=` may name a shared one) could take its descriptors (pidfd_getfd) or act in
    # its namespaces, where root's folders are the child's. Traceable again once confined.
    prctl(PR_SET_DUMPABLE, 0)
    # else: no user namespaces for an unprivileged launcher, so no namespaces at all; the
    # isolation report names the missing layer, strict mode refuses, and the manager kills
    # the child's tree by sweeping it.
    pid = os.fork()  # the first child after CLONE_NEWPID is PID 1 of the new namespace
    if pid == 0:
        os.close(status_w)
        _run_when_asked(handoff, name, new_mount_namespace=namespaced, drop_root=drop_root,
                        uid=uid)
        os._exit(127)
    report(status_w, f"pid {pid}")


def _run_when_asked(handoff: int, name: bytes, *, new_mount_namespace: bool,
                    drop_root: bool, uid: int | None) -> None:
    """The spare: wait for a run's descriptors (from the launcher, by name), then read the
    plan, take a mount namespace of its own (a copy of the host's mounts as they are now),
    confine itself and take back the launcher's process `name`. Errors go to the run's status
    pipe; the launcher gone, it just ends.

    A spare may first be asked to prepare a sandbox's view ("prepare": the plan of that
    sandbox's last run): its mount namespace, covers, read-only view and Landlock rules,
    made while nobody waits. The run then must have the same view (`ChildPlan.view`), or
    this child leaves it, untaken, to another spare."""
    prepared: tuple[ChildPlan, tuple[landlock.LandlockRuleset | None, set[int]]] | None = None
    with socket.socket(fileno=handoff) as sock:
        data, received = receive_message(sock)
        message = json.loads(data) if data else {}
        if message.get("prepare"):
            fds = dict(zip(message["fds"], received))
            try:
                plan_fd = fds.pop("plan")
                ahead = ChildPlan.from_json(json.loads(read_plan(plan_fd)))
                os.close(plan_fd)
                prepared = ahead, _prepare_view(ahead, fds, new_mount_namespace=new_mount_namespace,
                                                drop_root=drop_root)
            except BaseException:  # noqa: BLE001 - the run, if any, goes to another spare
                return
            data, received = receive_message(sock)
            message = json.loads(data) if data else {}
    if not data:
        return
    fds = dict(zip(message["fds"], received))
    status_w = fds.pop("status")
    try:
        plan = ChildPlan.from_json(json.loads(read_plan(fds["plan"])))
    except BaseException:  # noqa: BLE001 - not ours to judge: a spare made fresh reports it
        return
    if prepared is not None and (prepared[0].view() != plan.view()
                                 or not covers_hold(plan.hidden_paths, prepared[1][1])):
        return  # prepared for another view, or the host has changed it: not this run's
    report(status_w, TAKEN)
    os.close(fds.pop("plan"))
    try:
        if plan.uid is not None and not drop_root and uid != plan.uid:
            raise OSError(errno.EPERM, f"the launcher made this child for uid {uid}, "
                                       f"the plan is for uid {plan.uid}")
        rules, _ = prepared[1] if prepared is not None else _prepare_view(
            plan, fds, new_mount_namespace=new_mount_namespace, drop_root=drop_root)
        _confine_and_run(plan, fds, status_w, rules, name)
    except BaseException as exc:  # noqa: BLE001
        # The status pipe sits at STATUS_FD once the descriptors are installed; before
        # that, STATUS_FD is whatever the launcher had there (one of the run's pipes).
        message = f"error confine: {type(exc).__name__}: {exc}"
        status = STATUS_FD if _fds_installed else status_w
        if not report(status, message):
            report(2, f"[sandbox] the child failed after confinement: {message[15:]}")


def read_plan(fd: int) -> bytes:
    """The plan's memfd from its start, left open: a run this child leaves untaken goes to
    another spare with the same descriptor, and so the same file offset."""
    return os.pread(fd, os.fstat(fd).st_size, 0)


_fds_installed = False  # in the confined child: whether STATUS_FD is the status pipe yet
TAKEN = "taken"  # the first line of a run's status: its spare has its descriptors


def _owner_mapped_trees(plan: ChildPlan, fds: dict[str, int]) -> list[tuple[str, int]]:
    """The detached copies of root's folders that came with the run ("tree N" shows
    `plan.owner_mapped[N]` with root as the child's uid, made on the trusted side while it
    is real root), taken out of `fds`, parents first. A folder with no tree (its filesystem
    has no idmapped mounts) is left as it is: its modes then decide, which fails closed (a
    writable one was checked when the sandbox was made)."""
    trees = []
    for name in [name for name in fds if name.startswith("tree ")]:
        trees.append((plan.owner_mapped[int(name[5:])], fds.pop(name)))
    return sorted(trees, key=lambda tree: tree[0].count("/"))


def _home_tmpfs(plan: ChildPlan, fds: dict[str, int]) -> int | None:
    """The descriptor of the home's tmpfs where the plan's home is one, taken out of `fds`;
    else None (one sent anyway is closed)."""
    home = fds.pop("home", None)
    if plan.sized_home is None and home is not None:
        os.close(home)
        return None
    if plan.sized_home is not None and home is None:
        raise OSError(errno.EINVAL, "the home's tmpfs did not come with the run")
    return home


def _attach_home(path: str, home: int) -> None:
    """A copy of the home's tmpfs on `path` (the trusted side's stays for later runs); made
    once this process may mount, in its own mount namespace."""
    copy = clone_mount(home)
    try:
        attach_tree(copy, path)
    finally:
        os.close(copy)


def close_other_fds(keep: set[int]) -> None:
    """Close every descriptor but `keep`: close_range() between the kept numbers, one
    syscall per gap however many the launcher held."""
    edges = sorted(keep)
    for low, high in zip([-1, *edges], [*edges, _MAX_FD]):
        if high > low + 1:  # never an empty range: closerange(n, n) would close everything
            os.closerange(low + 1, high)


def _install_fds(fds: dict[str, int], status_w: int, keep: Iterable[int] = ()) -> int:
    """Move the child's descriptors to fixed numbers and close everything else but `keep`.
    Each is first copied above the fixed numbers, so that no copy is overwritten by another
    (a spare has closed the launcher's low descriptors: the run's may sit anywhere)."""
    global _fds_installed
    wanted = {0: fds["stdin"], 1: fds["stdout"], 2: fds["stderr"]}
    if "control" in fds:
        wanted[CONTROL_FD] = fds["control"]
        wanted[PAYLOAD_FD] = fds["payload"]
    high = {target: fcntl.fcntl(source, fcntl.F_DUPFD, STATUS_FD + 1)
            for target, source in wanted.items()}
    status_high = fcntl.fcntl(status_w, fcntl.F_DUPFD, STATUS_FD + 1)
    kept = set(wanted) | set(keep)
    for target, source in high.items():
        os.dup2(source, target, inheritable=True)
    os.dup2(status_high, STATUS_FD, inheritable=False)
    kept.add(STATUS_FD)
    close_other_fds(kept)
    _fds_installed = True
    return STATUS_FD


_MAX_FD = 1 << 30  # closerange() clamps to the real table size


class _LinkFreeWalk:
    """O_PATH descriptors of paths reached without following a symlink in any component;
    folders on the way are kept, so paths that share them are not walked again. A cover is
    mounted on such a descriptor, never on the name: a link planted where a store's name is
    (`~/.aws -> /usr`) must not carry the cover onto what it points at, nor a swap after the
    check."""

    def __init__(self) -> None:
        self.folders: dict[str, int | None] = {"/": os.open("/", os.O_PATH | os.O_CLOEXEC)}

    def open(self, path: str) -> int | None:
        """A new descriptor of `path`, or None (a symlink on the way, or nothing there)."""
        folder, name = os.path.split(path.rstrip("/"))
        parent = self.folder(folder)
        if parent is None or not name:
            return None
        return self._step(parent, name)

    def folder(self, folder: str) -> int | None:
        """A descriptor of `folder` (kept; None: a symlink on the way, or not a folder)."""
        if folder not in self.folders:
            above, name = os.path.split(folder)
            parent = self.folder(above)
            fd = self._step(parent, name) if parent is not None else None
            if fd is not None and not stat.S_ISDIR(os.fstat(fd).st_mode):
                os.close(fd)
                fd = None
            self.folders[folder] = fd
        return self.folders[folder]

    @staticmethod
    def _step(parent: int, name: str) -> int | None:
        try:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except OSError:
            return None
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return fd

    def forget(self, folder: str) -> None:
        """Drop the kept descriptors of `folder` and below (a mount was put on it)."""
        for kept in [kept for kept in self.folders if is_within(kept, folder)]:
            fd = self.folders.pop(kept)
            if fd is not None:
                os.close(fd)

    def close(self) -> None:
        for fd in self.folders.values():
            if fd is not None:
                os.close(fd)


def hide_paths(hidden: dict[str, list[str]], granted: list[str]) -> set[int]:
    """Cover each hidden path (the plan names those that existed when it was made) that is
    still there, reached without a symlink: a folder with an
    empty tmpfs (one, bound onto every folder with nothing to bind back), anything else with
    /dev/null (all read-only once `view_host_read_only` has run). A symlink where a store's
    name is covers nothing: what it points at is hidden under its own name if it is a store.
    A granted path inside a hidden folder (this sandbox's home, in the folder of every
    sandbox's home) is bound back on top, through a descriptor taken before the cover.
    Returns the devices of the folders' covers (`covers_hold` checks against them)."""
    walk = _LinkFreeWalk()
    covered: list[str] = []
    devices: set[int] = set()
    empty: int | None = None  # the shared empty tmpfs
    empty_file: int | None = None
    empty_mount: int | None = None
    try:
        for path in sorted(os.path.join(folder, name)
                           for folder, names in hidden.items() for name in names):
            if any(is_within(path, folder) for folder in covered):
                continue  # inside a cover already: nothing of it shows
            target = walk.open(path)
            if target is None:
                continue
            try:
                if not stat.S_ISDIR(os.fstat(target).st_mode):
                    if empty_file is None:
                        empty_file, empty_mount = _empty_file()
                        devices.add(os.fstat(empty_file).st_dev)
                    mount(f"/proc/self/fd/{empty_file}", f"/proc/self/fd/{target}", None, MS_BIND)
                    continue
                covered.append(path)
                inside = [p for p in granted
                          if p != path and is_within(p, path) and os.path.exists(p)]
                if inside or empty is None:
                    _cover_folder(f"/proc/self/fd/{target}", inside)
                    cover = walk.open(path)  # the new tmpfs
                    if cover is not None:
                        devices.add(os.fstat(cover).st_dev)
                        if not inside and empty is None:
                            empty, cover = cover, None  # to bind onto the next ones
                        if cover is not None:
                            os.close(cover)
                else:
                    mount(f"/proc/self/fd/{empty}", f"/proc/self/fd/{target}", None, MS_BIND)
            finally:
                os.close(target)
    finally:
        walk.close()
        for fd in (empty, empty_file, empty_mount):
            if fd is not None:
                os.close(fd)
    return devices


def _empty_file() -> tuple[int, int | None]:
    """An empty file of its own that covers a hidden file, and the tmpfs that holds it
    (mounted nowhere: kept open until every cover is bound, or it is gone): no Landlock
    rule names it and the read-only view holds for it, so a write fails loudly, where one
    to /dev/null (which a rule must let a child write) would vanish. Where this Linux has
    no fsopen (before 5.2), /dev/null."""
    try:
        mounted = detached_tmpfs()
    except OSError:
        return os.open("/dev/null", os.O_PATH | os.O_CLOEXEC), None
    try:
        return os.open("empty", os.O_CREAT | os.O_RDONLY | os.O_CLOEXEC, 0o444,
                       dir_fd=mounted), mounted
    except BaseException:
        os.close(mounted)
        raise


def covers_hold(hidden: dict[str, list[str]], devices: set[int]) -> bool:
    """Whether every hidden path that a walk without symlinks reaches now is a cover: a
    folder on one of the covers' `devices`, or /dev/null. A view prepared ahead may have
    lost one since (the host renamed a file over a covered one, which takes its cover
    away) or never had it (its folder was closed to this uid then, or a symlink)."""
    null = os.stat("/dev/null").st_rdev
    walk = _LinkFreeWalk()
    try:
        for folder, names in hidden.items():
            parent = walk.folder(folder)
            for name in names if parent is not None else ():
                try:  # what is there, a mount on it included; a symlink is not followed
                    info = os.stat(name, dir_fd=parent, follow_symlinks=False)
                except OSError:
                    continue  # not there, or not reachable from here: nor from the run
                if stat.S_ISLNK(info.st_mode):
                    continue  # covers nothing, and nothing needs covering there
                if stat.S_ISCHR(info.st_mode) and info.st_rdev == null:
                    continue
                if not ((stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode))
                        and info.st_dev in devices):
                    return False
        return True
    finally:
        walk.close()


def _cover_folder(target: str, inside: list[str]) -> None:
    """An empty tmpfs on `target`, with the granted paths `inside` it bound back on top."""
    held = {p: os.open(p, os.O_PATH | os.O_CLOEXEC) for p in inside}
    try:
        mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "size=64k,nr_inodes=256,mode=0755")
        for kept, fd in held.items():
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                os.makedirs(kept, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(kept), exist_ok=True)
                os.close(os.open(kept, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600))
            mount(f"/proc/self/fd/{fd}", kept, None, MS_BIND | MS_REC)
    finally:
        for fd in held.values():
            os.close(fd)


def view_host_read_only(write_paths: list[str]) -> None:
    """In the child's own mount namespace, every mount of the host read-only except the
    folders (and files) it may write, each bound on itself read-write: a change of metadata
    (`chmod`, `utime`, xattrs, which Landlock does not cover) anywhere else fails with EROFS,
    whoever owns the file. Devices (`/dev/null`) need no bind: they are written through a
    read-only mount. A mount inside a writable root stays read-only. Where Linux has no
    mount_setattr (before 5.12) the view stays as it was and the isolation report says so;
    any other failure stops the child."""
    # The paths were resolved and pinned on the trusted side when the sandbox was made.
    writable = [p for p in write_paths if os.path.isdir(p) or os.path.isfile(p)]
    for path in writable:
        bind_mount(path)
    try:
        set_mount_readonly("/", True, recursive=True)
    except OSError as exc:
        if exc.errno == errno.ENOSYS:
            return
        raise
    for path in writable:
        set_mount_readonly(path, False, recursive=False)


def _writable_trees(trees: list[str], write_paths: list[str]) -> None:
    """Root's folders shown through the owner map are mounts of their own, which the
    read-only view leaves read-only: inside a writable folder, one (a readable grant there,
    or a closed folder on the way) is as writable as the folder holding it. A tree copied
    from a read-only mount of the host stays read-only (Linux keeps that flag locked)."""
    for path in trees:
        if any(is_within(path, root) for root in write_paths):
            try:
                set_mount_readonly(path, False, recursive=False)
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOSYS):
                    raise


def protect_paths(protected: list[str], write_paths: list[str]) -> None:
    """Make each protected path inside a writable folder read-only, reached without a
    symlink (one planted there since the plan was made protects nothing and is skipped:
    what it points at is not the path). The folders between its writable root and it are
    bound on themselves first, so none can be renamed away with the protected path in it
    (a mount point cannot be renamed or removed); then the path itself, read-only. A
    writable path the policy names inside a protected one stays writable."""
    roots = [root for root in write_paths if os.path.isdir(root)]
    anchors: set[str] = set()
    for path in protected:
        # from the outermost writable folder: a writable one nested in another is as
        # renamable as any folder there
        root = min((r for r in roots if is_within(path, r) and r != path), key=len, default=None)
        folder = os.path.dirname(path)
        while root is not None and folder != root and is_within(folder, root):
            anchors.add(folder)
            folder = os.path.dirname(folder)
    walk = _LinkFreeWalk()
    try:
        for folder in sorted(anchors, key=lambda p: (p.count("/"), p)):
            _bind_on_itself(walk, folder, readonly=False)
        for path in protected:
            _bind_on_itself(walk, path, readonly=True)
    finally:
        walk.close()
    for path in write_paths:
        if any(is_within(path, outer) and path != outer for outer in protected) \
                and os.path.lexists(path):
            set_mount_readonly(path, False, recursive=False)


def _bind_on_itself(walk: _LinkFreeWalk, path: str, *, readonly: bool) -> None:
    target = walk.open(path)
    if target is None:
        return
    try:
        mount(f"/proc/self/fd/{target}", f"/proc/self/fd/{target}", None, MS_BIND | MS_REC)
    finally:
        os.close(target)
    walk.forget(path)
    if readonly:
        mounted = walk.open(path)  # the new mount, not the one beneath it
        if mounted is None:
            raise OSError(errno.EBUSY, f"{path} changed while it was made read-only")
        try:
            set_mount_readonly_at(mounted, True, recursive=True)
        finally:
            os.close(mounted)


# The parts of a fresh /proc that write to the kernel itself rather than to the child's own
# processes: sysctls (under a root kernel the child is root, whom their file modes let write),
# SysRq, IRQ affinity, bus and filesystem settings. Landlock grants nothing under /proc for
# writing; these mounts make them read-only as well, as container runtimes do.
KERNEL_SETTINGS_IN_PROC = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")


def limit_pids(pid_max: int) -> None:
    """Set this PID namespace's pid_max (Linux 6.14 gives each namespace its own; before,
    the setting is the host's, which a user namespace may not change: EPERM, and the
    process count rests on RLIMIT_NPROC and the monitor). Written only from a user
    namespace of our own, so that it can never be the host's."""
    if not _in_own_user_namespace():
        return
    try:
        with open("/proc/sys/kernel/pid_max", "w") as setting:
            setting.write(str(pid_max))
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EACCES, errno.EINVAL):
            raise


def _in_own_user_namespace() -> bool:
    """Whether this process is in a user namespace of its own, not the host's (whose uid
    map is every id as itself)."""
    try:
        with open("/proc/self/uid_map") as mapping:
            return mapping.read().split() != ["0", "0", "4294967295"]
    except OSError:
        return False


def freeze_kernel_settings() -> None:
    for path in KERNEL_SETTINGS_IN_PROC:
        if not os.path.exists(path):
            continue
        bind_mount(path)
        try:
            set_mount_readonly(path, True, recursive=True)
        except OSError as exc:
            if exc.errno != errno.ENOSYS:  # before Linux 5.12 Landlock alone holds them
                raise


def _mount_or_refuse(what: str, source: str, target: str, fstype: str,
                     data: str | None) -> None:
    try:
        mount(source, target, fstype, MS_NOSUID | MS_NODEV | MS_NOEXEC, data)
    except OSError as exc:
        raise OSError(exc.errno, f"{what} could not be mounted ({exc.strerror}), and the "
                                 "isolation report says the child has one") from None


# System-wide entries of a /proc that is the host's (no view of other processes in them):
# what os.cpu_count fallbacks, psutil's system figures and numpy's CPU checks read.
SHARED_PROC_READS = ("/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/loadavg",
                     "/proc/uptime", "/proc/version", "/proc/filesystems", "/proc/sys/kernel",
                     "/proc/sys/vm/overcommit_memory")


def _shared_proc_reads() -> list[str]:
    """Where /proc is the host's (no private one could be mounted): the system-wide entries
    above and this process's own folder, never another process's. Landlock follows the
    folder, not the pid, so the processes this one starts find their /proc/self closed."""
    own = f"/proc/{os.readlink('/proc/self')}"
    # Its own entries but `net` (and `task`, whose threads each have one), the network
    # namespace's: without one of its own, the host's sockets (ports, peers, socket paths)
    entries = [f"{own}/{name}" for name in os.listdir(own) if name not in ("net", "task")]
    return [path for path in SHARED_PROC_READS if os.path.exists(path)] + entries


def _mount_view(plan: ChildPlan, trees: list[tuple[str, int]], home: int | None, *,
                new_mount_namespace: bool) -> set[int]:
    """A mount namespace of its own (where one can be had) with root's folders, the home's
    tmpfs, the covers, the read-only view and the protected paths; the covers' devices."""
    if new_mount_namespace:
        unshare(CLONE_NEWNS)
    try:
        mount(None, "/", None, MS_REC | MS_PRIVATE)
    except OSError as exc:
        # No mount namespace here: nothing below can be mounted either. A plan that relies
        # on mounts to hide paths from rules that would grant them must not run.
        if plan.hidden_paths:
            raise OSError(exc.errno, "no mount namespace to hide the paths this policy denies "
                                     f"({exc.strerror})") from None
        if trees or home is not None:
            raise OSError(exc.errno, "no mount namespace to show root's folders (or the home's "
                                     f"tmpfs) to the child ({exc.strerror})") from None
        return set()
    for path, tree in trees:
        attach_tree(tree, path)
        os.close(tree)
    if home is not None and plan.sized_home is not None:
        _attach_home(plan.sized_home, home)  # after root's folders: it may lie in one
    devices = hide_paths(plan.hidden_paths, [*plan.write_paths, *plan.read_paths])
    view_host_read_only(plan.write_paths)
    _writable_trees([path for path, _ in trees], plan.write_paths)
    protect_paths(plan.protected_paths, plan.write_paths)
    return devices


def _prepare_view(plan: ChildPlan, fds: dict[str, int], *, new_mount_namespace: bool,
                  drop_root: bool) -> tuple[landlock.LandlockRuleset | None, set[int]]:
    """Everything of a run's confinement that depends on its view alone (`ChildPlan.view`):
    a mount namespace of its own with root's folders (the "tree N" descriptors, taken out of
    `fds`), the covers and the read-only view, a private /proc and /dev/shm, the uid of a
    root launcher without user namespaces, a session of its own. Returns the Landlock
    rules, built (their descriptor above the fixed numbers; None without Landlock), and the
    devices of the covers."""
    trees = _owner_mapped_trees(plan, fds)
    home = _home_tmpfs(plan, fds)
    try:
        devices = _mount_view(plan, trees, home, new_mount_namespace=new_mount_namespace)
    finally:
        if home is not None:
            os.close(home)
    # Asked for only where the kernel found them possible (`isolation.private_mounts`): one
    # that fails now is a layer the report claims and the run would lack, so it stops the run.
    if plan.private_proc:
        _mount_or_refuse("a private /proc", "proc", "/proc", "proc", None)
        if plan.pid_max is not None:
            limit_pids(plan.pid_max)
        freeze_kernel_settings()
    if plan.private_shm:
        _mount_or_refuse("a private /dev/shm", "tmpfs", "/dev/shm", "tmpfs",
                         f"size={SHM_SIZE_MB}m,mode=1777")
    # Listed in the view just made (root's folders shown as the child's own), before any uid
    # change: a closed folder's subfolders are each a rule (`_write_rules`).
    rules = rules_for(plan)
    if drop_root and plan.uid is not None:
        drop_bounding_set()  # needs the capability the uid change takes away
        drop_identity(plan.uid, plan.gid if plan.gid is not None else plan.uid)
        prctl(PR_SET_DUMPABLE, 0)  # a view prepared ahead waits: not to be traced meanwhile
    os.setsid()
    drop_bounding_set()  # no exec may grant a capability; the sets themselves go at the run
    if rules is not None:
        # Built here, after our private /proc is mounted, so the /proc rule names it.
        for path in (["/proc"] if plan.private_proc else _shared_proc_reads()):
            rules.allow_read(path)
        if plan.private_shm:
            rules.allow_write("/dev/shm")
        rules.build()
        rules.move_descriptor(STATUS_FD + 1)  # not one `_install_fds` takes
    return rules, devices


def _confine_and_run(plan: ChildPlan, fds: dict[str, int], status_w: int,
                     rules: landlock.LandlockRuleset | None, launcher_name: bytes) -> None:
    """The run's part: the proxy's listener, the run's descriptors on their numbers, its
    working folder and rlimits, then no capability, Landlock, seccomp, and the program.
    Without a network namespace (`plan.connect_by_notification`) the trusted side gets the
    seccomp filter's listener instead of the proxy's, once the filter is in place."""
    notify_to = None
    if "egress" in fds and plan.connect_by_notification:
        egress = fds.pop("egress")
        notify_to = fcntl.fcntl(egress, fcntl.F_DUPFD_CLOEXEC, STATUS_FD + 1)  # past _install_fds
        os.close(egress)
    elif "egress" in fds:
        _hand_over_listener(plan, fds)
    keep = [fd for fd in (rules.fileno() if rules is not None else None, notify_to)
            if fd is not None]
    status_w = _install_fds(fds, status_w, keep=keep)
    os.chdir(plan.cwd)
    for name, (soft, hard) in plan.rlimits.items():
        resource.setrlimit(RLIMIT_NUMBERS[name], (soft, hard))
    drop_capabilities()
    # What the run leaves behind (a double fork) is adopted here, not by the launcher, so it
    # stays in the tree the monitor measures and ends with the run, as PID 1 of a PID
    # namespace adopts it; kept across exec, and seccomp keeps it set.
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    if rules is not None:
        rules.restrict_self()
    syscall_filter = (NOTIFIED_EGRESS_SYSCALL_FILTER if notify_to is not None else
                      EGRESS_SYSCALL_FILTER if plan.proxy_port is not None else SYSCALL_FILTER)
    if syscall_filter is not None:
        listener = syscall_filter.install()
        if notify_to is not None and listener is not None:
            # The listener answers this process's connects: it must not stay here.
            with socket.socket(fileno=notify_to) as handoff:
                socket.send_fds(handoff, [b"notify"], [listener])
            os.close(listener)
    # The launcher's name back only now: named a spare, the count of the uid's tasks outside
    # every sandbox (`linux/tasks.py`) leaves it out, and from here its filter does.
    set_process_name(launcher_name)
    prctl(PR_SET_DUMPABLE, 1)  # as a process of its uid is, now that it is wholly confined
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    if plan.kind == "exec":
        try:
            os.execve(plan.argv[0], plan.argv, plan.env)
        except OSError as exc:
            report(status_w, f"error exec: cannot run {plan.argv[0]}: {exc.strerror}")
            os._exit(127)
    os.close(status_w)
    if plan.kind == "session":
        from .session import run_session  # loaded by the launcher: this costs no import

        os._exit(run_session(plan))
    from .cell import run_cell

    os._exit(run_cell(plan))
