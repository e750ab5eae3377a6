"""The few libc entry points Landlock and seccomp both need, loaded lazily so that
importing the runner never fails on a system without them."""

from __future__ import annotations

import ctypes
import errno
import os
import sys

PR_SET_NO_NEW_PRIVS = 38

_handle: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL | None:
    """This process's libc (None off Linux or when it cannot be loaded)."""
    global _handle
    if _handle is None and sys.platform.startswith("linux"):
        try:
            _handle = ctypes.CDLL(None, use_errno=True)
        except OSError:
            return None
    return _handle


def checked(result: int) -> int:
    """Raise the call's errno as OSError when it returned -1."""
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def prctl(option: int, arg2: object = 0) -> int:
    """prctl with every argument passed as a full machine word (or a pointer from byref)."""
    lib = libc()
    if lib is None:
        raise OSError(errno.ENOSYS, "prctl is not available on this platform")
    zero = ctypes.c_ulong(0)
    value = ctypes.c_ulong(arg2) if isinstance(arg2, int) else arg2
    return checked(lib.prctl(ctypes.c_int(option), value, zero, zero, zero))


def set_no_new_privs() -> None:
    """Required for unprivileged Landlock/seccomp; also stops setuid binaries gaining rights."""
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def thread_count() -> int:
    """Threads of this process as the Linux kernel sees them (C threads included).

    Fails closed: when /proc cannot tell (not mounted, hidepid, an earlier Landlock layer),
    it raises instead of guessing one, because a wrong "1" leaves other threads unconfined."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"Threads:"):
                    return int(line.split()[1])
        raise OSError(errno.ENOENT, "no Threads: line in /proc/self/status")
    except OSError as exc:
        raise RuntimeError(
            f"cannot count this process's threads through /proc ({exc.strerror}); "
            "refusing to confine only one of them"
        ) from None


PR_SET_NAME, PR_GET_NAME = 15, 16


def process_name() -> bytes:
    """This thread's name as `ps` shows it (/proc/self/comm), at most 15 bytes."""
    buffer = ctypes.create_string_buffer(16)
    prctl(PR_GET_NAME, ctypes.byref(buffer))
    return buffer.value


def set_process_name(name: bytes) -> None:
    buffer = ctypes.create_string_buffer(name[:15], 16)
    prctl(PR_SET_NAME, ctypes.byref(buffer))


def no_core_dumps(*, for_good: bool) -> None:
    """Write no core file of this process: a core holds its memory (a kernel's API keys) on
    disk where a later sandbox may read it. `for_good` lowers the hard limit too, which this
    process can then never raise again (the launcher's case; a kernel keeps its hard limit,
    so its user may turn cores back on)."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0 if for_good else hard))
