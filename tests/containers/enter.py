"""Run a command under the conditions of a container in a Kubernetes pod, without an engine.

    /usr/bin/python3 tests/containers/enter.py --profile docker|podman|unconfined -- CMD...

Built as root from the parts an OCI runtime uses, in this order: new mount, PID, IPC, UTS and
network namespaces (loopback up, nothing else); the host's filesystem read-only, with a
fresh tmpfs on /tmp and /dev/shm (what is under /tmp that the command needs, such as a clone
of this repository, is carried over); a fresh /proc with the runtime's masked and read-only
paths; uid and gid 1000 with no supplementary group, every capability set and the bounding
set empty; `no_new_privs`; then the runtime's real seccomp profile, from Debian's packages,
loaded through libseccomp (Debian's python3-seccomp, which is why this runs under
/usr/bin/python3); then the command, started by PID 1, which stays to reap as an image's
init does (so the command is not PID 1: a `kill(1, ...)` means what it means in a pod).
The exit status is the command's.

The masked and read-only paths are Docker's (`oci/defaults.go` of Debian's
golang-github-docker-docker-dev, read from the file); Podman's lists are not in Debian's
packages and differ by a few entries. Nothing here changes the host: every mount is in the
new namespace, which ends with the command.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import json
import os
import platform
import re
import signal
import socket
import stat
import struct
import sys

DOCKER_SOURCE = "/usr/share/gocode/src/github.com/docker/docker"
PROFILES = {
    "docker": f"{DOCKER_SOURCE}/profiles/seccomp/default.json",
    "podman": "/usr/share/containers/seccomp.json",
    "unconfined": None,
}
RUNTIME_DEFAULTS = f"{DOCKER_SOURCE}/oci/defaults.go"
POD_UID = 1000
SHM_SIZE = "64m"  # Docker's and Kubernetes' default /dev/shm

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 0x1000, 0x4000, 1 << 18
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_PDEATHSIG = 38, 24, 1
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
OPEN_TREE_CLONE, AT_RECURSIVE, MOVE_MOUNT_F_EMPTY_PATH = 1, 0x8000, 4
MOUNT_ATTR_RDONLY, AT_FDCWD = 1, -100

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def mount(source: str | None, target: str, fstype: str | None, flags: int,
          data: str | None = None) -> None:
    enc = (lambda s: None if s is None else s.encode())
    _check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {target}")


def runtime_paths() -> tuple[list[str], list[str]]:
    """(masked, read-only) paths of Docker's default container spec, read from its source."""
    with open(RUNTIME_DEFAULTS) as source:
        text = source.read()
    lists = []
    for name in ("MaskedPaths", "ReadonlyPaths"):
        block = re.search(name + r": \[\]string\{(.*?)\}", text, re.S)
        if block is None:
            raise SystemExit(f"enter.py: {RUNTIME_DEFAULTS} has no {name} list")
        lists.append(re.findall(r'"([^"]+)"', block.group(1)))
    return lists[0], lists[1]


def detach(path: str) -> int:
    """A detached copy of the mounts at `path` (to put back after /tmp is replaced)."""
    return _check(libc.syscall(ctypes.c_long(SYS_OPEN_TREE), ctypes.c_int(AT_FDCWD),
                               path.encode(), ctypes.c_uint(OPEN_TREE_CLONE | AT_RECURSIVE)),
                  f"open_tree {path}")


def attach(tree: int, path: str) -> None:
    _check(libc.syscall(ctypes.c_long(SYS_MOVE_MOUNT), ctypes.c_int(tree), b"",
                        ctypes.c_int(AT_FDCWD), path.encode(),
                        ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH)), f"move_mount {path}")
    os.close(tree)


def read_only_recursive(path: str) -> None:
    attr = struct.pack("QQQQ", MOUNT_ATTR_RDONLY, 0, 0, 0)
    buffer = ctypes.create_string_buffer(attr, len(attr))
    _check(libc.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD),
                        path.encode(), ctypes.c_uint(AT_RECURSIVE), buffer,
                        ctypes.c_size_t(len(attr))), f"mount_setattr {path}")


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, 0x8913, request))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(sock, 0x8914, struct.pack("16sH14x", b"lo", flags | 1))  # SIOCSIFFLAGS, IFF_UP


def traversable(path: str) -> None:
    """Let the pod's user reach `path` (an interpreter under /root, say), as it could in an
    image built for it: a closed folder on the way is covered by a tmpfs open to all, with
    only the next step on the way bound back into it."""
    parts = os.path.realpath(path).split("/")[1:]
    for depth in range(1, len(parts)):
        folder = "/" + "/".join(parts[:depth])
        if os.stat(folder).st_mode & 0o001:
            continue
        inner = f"{folder}/{parts[depth]}"
        tree = detach(inner)
        mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
        (os.makedirs if stat.S_ISDIR(os.fstat(tree).st_mode) else _touch)(inner)
        attach(tree, inner)


def _touch(path: str) -> None:
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def build_filesystem(keep: list[str]) -> None:
    """The host read-only; /tmp, /home and /dev/shm fresh; `keep` (under those) carried over."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    fresh = ("/tmp", "/home")  # the container's own; the users' homes are a volume of the
    # pod's (Zero to JupyterHub mounts one on /home/jovyan), and the tests make more beside it
    kept = [(path, detach(path)) for path in keep
            if any(path.startswith(folder + "/") for folder in fresh)]
    read_only_recursive("/")
    for folder in fresh:
        mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for path, tree in kept:
        os.makedirs(path, exist_ok=True)
        attach(tree, path)
    mount("shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
          f"mode=1777,size={SHM_SIZE}")
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    masked, readonly = runtime_paths()
    for path in masked:
        if not os.path.exists(path):
            continue
        if os.path.isdir(path):
            mount("tmpfs", path, "tmpfs", MS_RDONLY, "size=0")
        else:
            mount("/dev/null", path, None, MS_BIND)
    for path in readonly:
        if os.path.exists(path):
            mount(path, path, None, MS_BIND | MS_REC)
            mount(path, path, None, MS_BIND | MS_REC | MS_REMOUNT | MS_RDONLY)


def become_pod_user(uid: int = POD_UID) -> None:
    """uid/gid `uid` (1000, as in Jupyter's images), no groups, no capability left in any
    set, `no_new_privs`."""
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        _check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "drop bounding set")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # from root: the permitted and effective sets go
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    status = open("/proc/self/status").read()
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        value = re.search(name + r":\s+(\w+)", status).group(1)
        if int(value, 16):
            raise SystemExit(f"enter.py: {name} is {value} after the drop")


def _arch_names() -> list[str]:
    machine = platform.machine()
    return {"x86_64": ["amd64", "x86", "x32"], "aarch64": ["arm64", "arm"]}.get(machine, [machine])


def _kernel_at_least(version: str) -> bool:
    have = tuple(int(x) for x in re.findall(r"\d+", platform.release())[:2])
    return have >= tuple(int(x) for x in version.split(".")[:2])


def load_profile(path: str) -> int:
    """Load the OCI profile at `path` as runc does: rules whose `includes` name a capability
    are left out (the pod has none) and those whose `excludes` do are kept; arches and
    minimum kernels are honoured; names this libseccomp does not know are skipped; several
    conditions on one argument make one rule each. Returns how many rules were added."""
    import seccomp  # Debian's python3-seccomp

    with open(path) as source:
        profile = json.load(source)
    default_errno = profile.get("defaultErrnoRet", errno.EPERM)
    actions = {
        "SCMP_ACT_ALLOW": lambda rule: seccomp.ALLOW,
        "SCMP_ACT_ERRNO": lambda rule: seccomp.ERRNO(rule.get("errnoRet", default_errno)),
        "SCMP_ACT_KILL": lambda rule: seccomp.KILL,
        "SCMP_ACT_KILL_PROCESS": lambda rule: seccomp.KILL_PROCESS,
        "SCMP_ACT_TRAP": lambda rule: seccomp.TRAP,
        "SCMP_ACT_LOG": lambda rule: seccomp.LOG,
    }
    operators = {"SCMP_CMP_EQ": seccomp.EQ, "SCMP_CMP_NE": seccomp.NE, "SCMP_CMP_LT": seccomp.LT,
                 "SCMP_CMP_LE": seccomp.LE, "SCMP_CMP_GT": seccomp.GT, "SCMP_CMP_GE": seccomp.GE,
                 "SCMP_CMP_MASKED_EQ": seccomp.MASKED_EQ}
    default = actions[profile["defaultAction"]]({"errnoRet": default_errno})
    arches = _arch_names()
    syscall_filter = seccomp.SyscallFilter(default)
    for extra in arches[1:]:
        try:
            syscall_filter.add_arch(seccomp.Arch(getattr(seccomp.Arch, extra.upper())))
        except (AttributeError, ValueError, RuntimeError):
            pass
    added = 0
    for rule in profile["syscalls"]:
        includes, excludes = rule.get("includes") or {}, rule.get("excludes") or {}
        if includes.get("caps"):
            continue
        if includes.get("arches") and arches[0] not in includes["arches"]:
            continue
        if arches[0] in excludes.get("arches", []):
            continue
        if includes.get("minKernel") and not _kernel_at_least(includes["minKernel"]):
            continue
        action = actions[rule["action"]](rule)
        if action == default:
            continue
        conditions = []
        for arg in rule.get("args") or []:
            operator = operators[arg["op"]]
            if operator == seccomp.MASKED_EQ:
                conditions.append(seccomp.Arg(arg["index"], operator, arg["value"],
                                              arg.get("valueTwo", 0)))
            else:
                conditions.append(seccomp.Arg(arg["index"], operator, arg["value"]))
        indices = [arg["index"] for arg in rule.get("args") or []]
        groups = ([[c] for c in conditions] if len(set(indices)) < len(indices)
                  else [conditions])
        for name in rule["names"]:
            if seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) == -1:
                continue  # a call this libseccomp does not know
            for group in groups:
                syscall_filter.add_rule(action, name, *group)
                added += 1
    syscall_filter.load()
    return added


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), required=True)
    parser.add_argument("--keep", action="append", default=[],
                        help="a folder under /tmp or /home the command needs (a clone of this "
                             "repository)")
    parser.add_argument("--uid", type=int, default=POD_UID,
                        help="the pod's uid (containers run side by side get one each: "
                             "without user namespaces, Linux counts a uid's processes "
                             "across all of them)")
    parser.add_argument("command", nargs="+")
    options = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("enter.py: builds the container's conditions as root")
    profile = PROFILES[options.profile]
    if profile is not None and not os.path.exists(profile):
        raise SystemExit(f"enter.py: {profile} is missing (scripts/setup.sh installs it)")
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET),
           "unshare")
    pid = os.fork()  # PID 1 of the new PID namespace, as a container's first process is
    if pid:
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    try:
        # If this process is killed, its namespace goes with it: PID 1's end ends every
        # process in it.
        _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
        socket.sethostname("pod")
        loopback_up()
        build_filesystem([os.path.realpath(path) for path in options.keep])
        traversable(os.path.realpath(options.command[0]))
        home = "/home/jovyan"
        become_pod_user(options.uid)
        # Changing credentials clears the parent-death signal: set again (a killed test
        # left whole containers running).
        _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
        os.makedirs(home, exist_ok=True)
        if profile is not None:
            load_profile(profile)
        env = {key: value for key, value in os.environ.items()
               if key in ("PATH", "LANG", "LC_ALL", "TERM", "PYTHONPATH")}
        env.update(HOME=home, USER="jovyan", TMPDIR="/tmp", PYTHONDONTWRITEBYTECODE="1",
                   SANDBOX_CONTAINER_PROFILE=options.profile)
        command = os.fork()  # PID 1 stays an init that reaps, as tini does in Jupyter's images
        if command == 0:
            os.execvpe(options.command[0], options.command, env)
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == command:
                os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    except BaseException as exc:  # noqa: BLE001 - PID 1 reports and ends the namespace
        print(f"enter.py: {type(exc).__name__}: {exc}", file=sys.stderr)
        os._exit(125)


if __name__ == "__main__":
    main()
