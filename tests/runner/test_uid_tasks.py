"""The count of a uid's tasks outside every sandbox (`runner/linux/tasks.py`), against an
oracle: a uid no other process has, holding processes and threads of every kind the count
tells apart (plain threads, threads named as the egress proxy's, spares, processes with a
seccomp filter more than the counting one), each shape drawn by hypothesis."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox_kernel_ext.runner.linux.tasks import (
    PROXY_THREAD_NAME,
    SPARE_NAME,
    unsandboxed_tasks,
)

def _filters_shown() -> bool:
    try:
        with open("/proc/self/status", "rb") as status:
            return any(line.startswith(b"Seccomp_filters:") for line in status)
    except OSError:
        return False


pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only"),
    pytest.mark.skipif(os.geteuid() != 0, reason="takes a uid no other process has (root)"),
    pytest.mark.skipif(not _filters_shown(),
                       reason="Linux before 5.9 does not say how many filters a process has"),
]

# Started as root, it drops to the uid, then makes what the shape says and reports "ready"
# once every task has its name or filter; it holds them until its stdin closes.
HOLDER = textwrap.dedent("""
    import ctypes, os, sys, threading
    uid, threads, named, plain, spares, filtered = map(int, sys.argv[1:7])
    libc = ctypes.CDLL(None, use_errno=True)

    def name(value):
        libc.prctl(15, ctypes.c_char_p(value), 0, 0, 0)

    def one_more_filter():  # allow everything: only the count of filters matters
        class Filter(ctypes.Structure):
            _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte),
                        ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]
        class Program(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]
        allow = (Filter * 1)(Filter(0x06, 0, 0, 0x7fff0000))
        assert libc.prctl(38, 1, 0, 0, 0) == 0  # no_new_privs
        assert libc.prctl(22, 2, ctypes.byref(Program(1, allow)), 0, 0) == 0

    os.setresgid(uid, uid, uid); os.setgroups([]); os.setresuid(uid, uid, uid)
    hold = threading.Event()
    started = []
    for index in range(threads):
        ready = threading.Event()
        def body(ready=ready, index=index):
            if index < named:  # as the proxy names it, or as Python 3.14 does (15 bytes)
                name(%(proxy)r if index %% 2 else (%(proxy)r + b"-conn")[:15])
            ready.set()
            hold.wait()
        threading.Thread(target=body, daemon=True).start()
        started.append(ready)
    for ready in started:
        ready.wait()
    children = []
    for kind in ["plain"] * plain + ["spare"] * spares + ["filtered"] * filtered:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            if kind == "spare":
                name(%(spare)r)
            elif kind == "filtered":
                one_more_filter()
            os.write(w, b"x")
            os.read(0, 1)
            os._exit(0)
        os.close(w)
        assert os.read(r, 1) == b"x", kind  # named, or filtered, as asked
        children.append(pid)
    print("ready", flush=True)
    sys.stdin.read()
    for pid in children:
        os.waitpid(pid, 0)
""") % {"proxy": PROXY_THREAD_NAME, "spare": SPARE_NAME}


def _free_uid() -> int:
    """A uid that no process has, so that only the holder's tasks are counted."""
    uid = 1_500_000_000 + os.getpid()
    assert unsandboxed_tasks(uid) == 0, f"uid {uid} already has processes"
    return uid


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(threads=st.integers(0, 6), named=st.integers(0, 6), plain=st.integers(0, 2),
       spares=st.integers(0, 2), filtered=st.integers(0, 2))
def test_the_count_is_the_uids_tasks_that_no_sandbox_owns(
        threads: int, named: int, plain: int, spares: int, filtered: int) -> None:
    named = min(named, threads)
    uid = _free_uid()
    holder = subprocess.Popen(
        [sys.executable, "-I", "-c", HOLDER, *map(str, (uid, threads, named, plain, spares,
                                                        filtered))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([holder.stdout], [], [], 120)  # liveness only
        assert ready and holder.stdout.readline() == "ready\n", "the holder never got ready"
        counted = unsandboxed_tasks(uid)
    finally:
        holder.stdin.close()
        try:
            holder.wait(timeout=60)
        finally:
            if holder.poll() is None:
                holder.kill()  # its children end with their stdin closed
                holder.wait()
    # the holder's main thread, its plain threads and its plain children; never a named
    # thread, a spare, or a process with a filter more than this one
    assert counted == 1 + (threads - named) + plain, (threads, named, plain, spares, filtered)
    assert holder.returncode == 0
