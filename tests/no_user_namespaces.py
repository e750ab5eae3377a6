"""A wrapper script that runs a program where nested user namespaces are refused, without
touching the host's setting: it makes a user namespace of its own (mapping 0, 65534 and the
root kernel's default child uid), sets
`max_user_namespaces` to 0 there (the sysctl is per namespace) and execs `argv[1:]`. With
`drop_to_nobody` the program runs as uid 65534 (a non-root kernel that cannot make the other
namespaces), else as root of that namespace (a root kernel refused user namespaces)."""

from __future__ import annotations

from sandbox_kernel_ext.runner.trusted.isolation import default_child_uid


def without_user_namespaces(*, drop_to_nobody: bool) -> str:
    maps = "".join(f"{i} {i} 1\\n" for i in (0, 65534, default_child_uid()))
    drop = "    os.setgid(65534); os.setuid(65534)\n" if drop_to_nobody else ""
    # setgroups must stay allowed for a root program: it drops its own children's groups
    deny = 'open(f"/proc/{pid}/setgroups", "w").write("deny")\n' if drop_to_nobody else ""
    return f'''
import os, sys
r, w = os.pipe()
unshared_r, unshared_w = os.pipe()
pid = os.fork()
if pid == 0:
    import ctypes
    os.close(w); os.close(unshared_r)
    if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:
        os._exit(70)
    os.write(unshared_w, b"x"); os.close(unshared_w)
    if os.read(r, 1) != b"x":  # the parent died before mapping the ids
        os._exit(70)
    open("/proc/sys/user/max_user_namespaces", "w").write("0")
{drop}    os.execv(sys.argv[1], sys.argv[1:])
os.close(r); os.close(unshared_w)
if os.read(unshared_r, 1) != b"x":  # else the child could not leave the host's namespace
    sys.exit(f"unshare(CLONE_NEWUSER) failed: exit status {{os.waitpid(pid, 0)[1] >> 8}}")
os.close(unshared_r)
open(f"/proc/{{pid}}/uid_map", "w").write("{maps}")
{deny}open(f"/proc/{{pid}}/gid_map", "w").write("{maps}")
os.write(w, b"x")
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
'''
