"""aumai-sandbox's `SandboxManager`, with the confinement enforced by the Linux kernel.

Each sandbox is a policy, a private temporary folder and a state; each `execute` or
`run_python` forks a confined child through the launcher (`launcher_client.py` here,
`launcher/server.py` in its own process), streams its output, watches its whole process tree
with a `ResourceMonitor`, and kills the tree (PID 1 of its namespace) on a breach, a timeout
or an interrupt. `start_session` starts a child that serves many cells (`session.py`).
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import logging
import mmap
import os
import pickle
import resource
import socket
import stat
import tempfile
import threading
import time
import uuid
import warnings
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psutil

from ...approval.broker import ApprovalBroker
from ...policy.egress import EgressFilter, RateLimiter
from ...policy.errors import SandboxError
from ...policy.models import CapabilityDeclaration, SandboxResult, SandboxStatus
from ...policy.paths import is_within
from ..linux.namespaces import idmapped_tree, mapping_user_namespace
from ..linux.remove_tree import remove_tree
from ..linux.syscalls import no_core_dumps
from ..linux.tasks import unsandboxed_tasks
from ..wire import ChildPlan
from .connect_broker import ConnectBroker
from .control import CellEvents, ControlChannel, InputCallback
from .disk_quota import HOME_INODE_BYTES, DiskQuota, home_inodes
from .egress_proxy import EgressProxy
from .gated_files import GatedFiles, GatedRoot, gated_roots
from .isolation import (
    check_tier,
    default_child_uid,
    egress_possible,
    missing_layers,
    sized_homes_possible,
    user_namespaces,
)
from .launcher_client import LauncherClient, SpawnedChild
from .monitor import QUICK_RUN_SECONDS, ResourceMonitor
from .plan import (
    PROXY_PORT,
    build_plan,
    denied_reads,
    filesystem_grants,
    homes_folder,
    owner_mapped_paths,
    policy_grants,
)
from .plumbing import OutputCallback, OutputStream, Plumbing, memfd, pump
from .session import IdleWatch, PythonSession

__all__ = ["SandboxManager", "OutputCallback", "StartCallback"]

StartCallback = Callable[[ResourceMonitor], None]
logger = logging.getLogger(__name__)

EGRESS_LOG_LIMIT = 1000  # decisions kept per sandbox (counts are kept in full)
DEFAULT_MAX_PAUSED = 600.0  # when the broker waits for ever: the most a run's clock stops
_HANDOFF_TIMEOUT = 30.0  # for the child to hand over its proxy listener
EXIT_GRACE = 10.0  # for a killed child's end to be reported


# The most of the host's available memory (when a sandbox is made) its home's tmpfs may be
# able to take, pages and inodes together; a larger quota keeps the home on disk.
HOME_MEMORY_SHARE = 0.25


@dataclass
class _Sandbox:
    sandbox_id: str
    capability: CapabilityDeclaration
    home: str
    status: SandboxStatus = SandboxStatus.created
    monitor: ResourceMonitor | None = None
    child: SpawnedChild | None = None
    denied: tuple[str, ...] = ()  # the credential list, fixed when the sandbox is made
    grants: tuple[list[str], list[str]] | None = None  # (readable, writable), pinned then too
    kill_reason: str | None = None
    runs: int = 0
    last_usage: dict[str, Any] = field(default_factory=dict)
    proxy: EgressProxy | None = None  # when the policy has egress rules and the host can
    network_note: str | None = None  # why a policy's egress rules give no network here
    gated: tuple[GatedRoot, ...] = ()  # the path table's roots, resolved (pinned) when made
    egress_log: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=EGRESS_LOG_LIMIT))
    session: PythonSession | None = None  # the session its child serves, if it is one
    disk: DiskQuota | None = None  # its writable folders and home, when file_limits has a quota
    # (key, view) of the spare the launcher keeps prepared for its next run (`_prepare_next`)
    prepared: tuple[str, str] | None = None
    # Its home's tmpfs, sized by the quota (`launcher/sized_home.py`): each run attaches a
    # copy on `home`. None: the home is the folder on disk.
    home_mount: int | None = None



def raise_open_files_limit() -> bool:
    """Lift this process's soft RLIMIT_NOFILE to its hard limit (a policy with hundreds of
    root's folders holds a descriptor per folder while a run starts); False if it already was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return False
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return True

class SandboxManager:
    """Create, run and destroy sandboxes whose children the operating system confines.

    `child_uid`: the uid a child runs as when this process runs as root. By default a uid of
    the sandboxes' own (`default_child_uid`: no account names it, so no host process can
    trace or signal a child), which the child sees as nobody (65534); file permissions keep
    root's private files from it. `child_uid=0` keeps root's own uid in a user namespace
    with every capability dropped (where user namespaces are refused, 0 is not allowed):
    root's folders and an interpreter under /root just work and what a child creates
    belongs to root, but a sandbox reading "everywhere" reads root's private files. An
    unprivileged child sees the folders its policy grants that root owns as its own
    (idmapped mounts); any other writable folder must be writable by its uid. A uid other
    processes use (65534, say) lets them trace its children.
    `monitor_interval`: seconds between samples of the process tree (default 0.25; read at
    each run, so it may be changed between runs).
    `strict`: refuse to run when this host lacks a confinement layer (a policy's
    `strict: true` does the same for its sandboxes).
    `broker`: decides approval-gated opens from sandboxed cells (an `ApprovalBroker`; the
    default asks nobody and denies). Share it with toolsets in the Jupyter kernel so grants
    cover both.
    `egress_resolver`: for tests only, `(host, port) -> [addresses]` used by the egress proxy
    instead of DNS; nothing in a policy file can set it.
    """

    ISOLATION_WARNING = (
        "sandbox_kernel_ext: this host lacks confinement layers ({missing}); sandboxes run with "
        "the layers it has. Set strict: true in the policy to refuse instead."
    )

    def __init__(
        self, *, child_uid: int | None = None, monitor_interval: float = 0.25, strict: bool = False,
        broker: ApprovalBroker | None = None, egress_resolver: Callable[[str, int], list[str]] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._sandboxes: dict[str, _Sandbox] = {}
        self.monitor_interval = monitor_interval
        self._strict = strict
        self._is_root = os.name == "posix" and os.geteuid() == 0
        if child_uid is not None and not (isinstance(child_uid, int) and 0 <= child_uid < 2**32 - 1):
            raise SandboxError(f"child_uid must be a uid from 0 to {2**32 - 2}, not {child_uid!r}")
        self.child_uid = (
            (child_uid if child_uid is not None else default_child_uid()) if self._is_root else None
        )
        # This process writes no core file (a child that could make it dump would find the
        # kernel's memory on disk); its hard limit stays, for a user who wants cores back.
        no_core_dumps(for_good=False)
        self._launcher = LauncherClient(self.child_uid)
        if self.child_uid == 0 and not user_namespaces():
            raise SandboxError("child_uid=0 needs user namespaces, which this host refuses: "
                               "root without one would keep what only namespaces take away")
        self._owner_map = self._make_owner_map()
        self._warned_home = False  # whether a home that could not be a tmpfs was reported
        self.broker = broker if broker is not None else ApprovalBroker()  # the process default decides
        self._egress_resolver = egress_resolver
        self._rate_limiter = RateLimiter()  # shared: rates hold across this manager's sandboxes
        self._idle = IdleWatch(lambda: self.monitor_interval)  # sessions between their cells

    # -- lifecycle -------------------------------------------------------------------------------
    def create_sandbox(self, capability: CapabilityDeclaration) -> str:
        if not isinstance(capability, CapabilityDeclaration):
            raise SandboxError("create_sandbox takes a CapabilityDeclaration")
        check_tier(capability.sandbox_tier)
        missing = missing_layers()
        if missing:
            if self._strict or capability.strict:
                raise SandboxError(
                    "strict mode: this host cannot enforce " + "; ".join(missing)
                )
            warnings.warn(self.ISOLATION_WARNING.format(missing="; ".join(missing)), UserWarning,
                          stacklevel=2)
        denied = tuple(denied_reads())
        grants = filesystem_grants(capability)
        build_plan(capability, kind="python", argv=[], home=tempfile.gettempdir(), denied=denied,
                   pinned=grants)  # the rest of the policy's checks, before anything is made
        try:
            self._check_writable(grants[1])
            self._check_reachable(policy_grants(*grants))
        except OSError as exc:  # a granted folder gone or replaced since it was resolved
            raise SandboxError(f"a policy path changed while the sandbox was made: {exc}; "
                               "try again") from None
        network_note = None
        if capability.network_egress_rules and not egress_possible():
            network_note = (
                "network_egress_rules cannot be enforced on this host (no network namespace: "
                "user namespaces are refused; and no seccomp user notification to answer "
                "connects), so this sandbox gets no network at all"
            )
            if self._strict or capability.strict:
                raise SandboxError("strict mode: " + network_note)
            warnings.warn("sandbox_kernel_ext: " + network_note, UserWarning, stacklevel=2)
        gated = tuple(gated_roots(capability))  # a bad path table fails here, not in a run
        sandbox_id = str(uuid.uuid4())
        home = tempfile.mkdtemp(prefix=f"sandbox-{sandbox_id[:8]}-", dir=_homes_folder())
        if self.child_uid is not None:
            os.chown(home, self.child_uid, self.child_uid)
        os.chmod(home, 0o700)
        quota = capability.file_limits.max_total_bytes
        home_mount = None
        try:
            home_mount = self._sized_home(quota)
            disk = None if quota is None else DiskQuota(
                [*grants[1]] if home_mount is not None else [home, *grants[1]], quota,
                mounts=[home_mount] if home_mount is not None else [])
        except BaseException:  # an interrupt too: nothing of this sandbox is left
            if home_mount is not None:
                os.close(home_mount)
            remove_tree(home)
            raise
        with self._lock:
            self._sandboxes[sandbox_id] = _Sandbox(sandbox_id, capability, home, denied=denied,
                                                   grants=grants, network_note=network_note,
                                                   gated=gated, disk=disk, home_mount=home_mount)
        return sandbox_id

    def _sized_home(self, quota: int | None) -> int | None:
        """A tmpfs for a new sandbox's home (`launcher/sized_home.py`) of the quota's size in
        whole pages, so that the home alone can never pass the quota; or None: no quota (or
        one under a page), one whose tmpfs could take more of the host's memory than
        `HOME_MEMORY_SHARE` of what is available now (its pages and its files' inodes are
        memory, outside `max_memory_mb`), or a host that cannot (the home is then on disk,
        under the quota's walks: the first such sandbox warns, naming why)."""
        size = (quota or 0) // mmap.PAGESIZE * mmap.PAGESIZE
        if not size or not sized_homes_possible():
            return None
        inodes = home_inodes(size)
        needs = size + inodes * HOME_INODE_BYTES
        available = psutil.virtual_memory().available
        if needs > available * HOME_MEMORY_SHARE:
            self._warn_home(f"a home of {size:,} bytes and {inodes:,} files could "
                            f"take {needs:,} bytes of memory, more than "
                            f"{HOME_MEMORY_SHARE:.0%} of the {available:,} available")
            return None
        try:
            return self._launcher.sized_home(size, inodes)
        except SandboxError as exc:
            self._warn_home(str(exc))
            return None

    def _warn_home(self, why: str) -> None:
        if not self._warned_home:
            self._warned_home = True
            warnings.warn(f"sandbox_kernel_ext: a sandbox home stays on disk ({why}); a burst "
                          "of writes there can pass the disk quota until the next walk",
                          UserWarning, stacklevel=4)

    def _make_owner_map(self) -> int | None:
        """A root kernel's unprivileged child sees root's granted folders as its own through
        idmapped mounts made with this user namespace (root there is the child's uid here):
        a `mkdtemp` folder is writable, /root's interpreter runs, what it creates is root's,
        and root's other files stay closed to it. None where that cannot be had."""
        if self.child_uid in (None, 0) or not user_namespaces():
            return None
        try:
            return mapping_user_namespace(0, self.child_uid)
        except OSError:
            return None

    def _owner_mapped(self, path: str) -> bool:
        """Whether `path`, root's, can be shown to the child as its own (its filesystem
        supports idmapped mounts)."""
        if self._owner_map is None:
            return False
        try:
            os.close(idmapped_tree(path, self._owner_map))
        except OSError:
            return False
        return True

    @property
    def quick_run_seconds(self) -> float:
        """How long a run or a cell goes unwatched by the monitor's thread (`QUICK_RUN_SECONDS`;
        rlimits hold meanwhile); none for a child that is uid 0 on the host (`child_uid=0`):
        RLIMIT_NPROC does not bind root, so a fork bomb's first milliseconds could take every
        process the host has, the monitor's thread included."""
        return 0.0 if self.child_uid == 0 else QUICK_RUN_SECONDS

    def _view_mounts(self, sandbox: _Sandbox, plan: ChildPlan) -> dict[str, int]:
        """The mounts a run's view attaches, as descriptors the launcher takes: root's folders
        shown as the child's ("tree N") and the home's tmpfs ("home")."""
        mounts = self._owner_mapped_trees(plan) if self._owner_map is not None else {}
        home = sandbox.home_mount  # read once: destroy() may close it meanwhile
        if plan.sized_home is not None:
            try:
                if home is None:
                    raise OSError(errno.EBADF, "closed")
                mounts["home"] = fcntl.fcntl(home, fcntl.F_DUPFD_CLOEXEC, 0)
            except OSError:
                for fd in mounts.values():
                    os.close(fd)
                raise SandboxError(f"sandbox {sandbox.sandbox_id} was destroyed") from None
        return mounts

    def _owner_mapped_trees(self, plan: ChildPlan) -> dict[str, int]:
        """Copies of root's folders the plan shows as the child's ("tree N" for
        `plan.owner_mapped[N]`), made here, where we are real root: the child mounts them in
        its namespace. A folder whose filesystem has no idmapped mounts gets none: its modes
        decide, which fails closed (a writable one was checked when the sandbox was made)."""
        trees: dict[str, int] = {}
        try:
            for index, path in enumerate(plan.owner_mapped):
                try:
                    trees[f"tree {index}"] = idmapped_tree(path, self._owner_map)
                except OSError as exc:
                    if exc.errno not in (errno.EMFILE, errno.ENFILE):
                        continue
                    if not raise_open_files_limit():
                        raise SandboxError(
                            f"too many open files to show {path} (and the policy's other "
                            f"{len(plan.owner_mapped) - 1} folders of root's) to the sandbox: "
                            "raise this process's RLIMIT_NOFILE (ulimit -n)") from None
                    trees[f"tree {index}"] = idmapped_tree(path, self._owner_map)
        except BaseException:
            for fd in trees.values():
                os.close(fd)
            raise
        return trees

    def _check_writable(self, writable: list[str]) -> None:
        """As root the child is another uid: say so now, not as an EACCES in the cell."""
        if self.child_uid is None:
            return
        for path in writable:
            info = os.stat(path)
            if info.st_uid == 0 and self._owner_mapped(path):
                continue  # shown to the child as its own
            if info.st_uid != self.child_uid and not info.st_mode & 0o002:
                raise SandboxError(
                    f"writable path {path} is not writable by uid {self.child_uid}, the uid "
                    "sandboxed children run as when this process runs as root (with no "
                    f"capability, so file permissions hold for it); chown it to "
                    f"{self.child_uid} or make it world-writable"
                )

    def _check_reachable(self, granted: list[str]) -> None:
        """As root the child is another uid, which must be able to enter every folder on
        the way to a grant: say which one closes it off now, not as a failed run later.
        Root's folders that the owner map shows it as its own do not close it off."""
        if self.child_uid in (None, 0):
            return
        mapped = owner_mapped_paths(granted, ()) if self._owner_map is not None else []
        for path in granted:
            parts = [part for part in path.split("/") if part]
            folder = "/"
            for part in parts if os.path.isdir(path) else parts[:-1]:
                folder = os.path.join(folder, part)
                info = os.stat(folder)
                if info.st_uid == 0 and any(is_within(folder, tree) for tree in mapped):
                    continue  # root's, shown as the child's own; others keep their owners
                if info.st_uid != self.child_uid and not info.st_mode & 0o001:
                    raise SandboxError(
                        f"policy path {path} cannot be reached by uid {self.child_uid}, the "
                        "uid sandboxed children run as when this process runs as root: "
                        f"{folder} (owner uid {info.st_uid}, mode "
                        f"{stat.S_IMODE(info.st_mode):04o}) is closed to it. Grant a folder "
                        f"outside it, or let others enter it (chmod o+x {folder})")

    def _get(self, sandbox_id: str) -> _Sandbox:
        with self._lock:
            sandbox = self._sandboxes.get(sandbox_id)
        if sandbox is None:
            raise SandboxError(f"unknown sandbox id {sandbox_id!r}")
        return sandbox

    def status(self, sandbox_id: str) -> SandboxStatus:
        return self._get(sandbox_id).status

    def list_sandboxes(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {"sandbox_id": s.sandbox_id, "status": s.status, "tier": s.capability.sandbox_tier,
                 "runs": s.runs, "pid": s.child.pid if s.child and not s.child.exited.is_set() else None}
                for s in self._sandboxes.values()
            ]

    def destroy(self, sandbox_id: str) -> None:
        sandbox = self._get(sandbox_id)
        self.kill(sandbox_id, "sandbox destroyed")
        if sandbox.child is not None:
            sandbox.child.exited.wait(timeout=10)
        if sandbox.session is not None:
            sandbox.session.close("sandbox destroyed")
        with self._lock:
            self._sandboxes.pop(sandbox_id, None)
            prepared, sandbox.prepared = sandbox.prepared, None
        if prepared is not None:
            self._launcher.discard(prepared[0])
        if sandbox.proxy is not None:
            sandbox.proxy.close()
        if sandbox.home_mount is not None:
            os.close(sandbox.home_mount)  # the tmpfs goes with the last run's copy of it
            sandbox.home_mount = None
        remove_tree(sandbox.home)

    def close(self) -> None:
        """Destroy every sandbox and stop the launcher (nothing is left running)."""
        self._idle.stop()
        for sandbox_id in [s["sandbox_id"] for s in self.list_sandboxes()]:
            self.destroy(sandbox_id)
        self._launcher.close()
        if self._owner_map is not None:
            os.close(self._owner_map)
            self._owner_map = None

    def __enter__(self) -> SandboxManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def launcher_pid(self) -> int | None:
        return self._launcher.pid

    # -- control of a running child ---------------------------------------------------------------
    def kill(self, sandbox_id: str, reason: str = "killed by request") -> None:
        """Kill the running child's whole tree (no-op when nothing runs)."""
        sandbox = self._get(sandbox_id)
        child = sandbox.child
        if child is not None and not child.exited.is_set():
            if sandbox.kill_reason is None:
                sandbox.kill_reason = reason
            child.kill()

    def record_usage(self, sandbox_id: str, *, tokens: int = 0, cost_usd: float = 0.0) -> None:
        """Count model spend against the running sandbox's budgets (a breach kills it)."""
        monitor = self._get(sandbox_id).monitor
        if monitor is None:
            raise SandboxError(f"sandbox {sandbox_id} is not running")
        self._usage(monitor, tokens, cost_usd)

    def monitor(self, sandbox_id: str) -> ResourceMonitor | None:
        """The running child's monitor (subscribe to it for live gauges), or None."""
        return self._get(sandbox_id).monitor

    def egress_log(self, sandbox_id: str) -> list[dict[str, Any]]:
        """The sandbox's egress decisions, oldest first (the last EGRESS_LOG_LIMIT of them)."""
        return list(self._get(sandbox_id).egress_log)

    # -- running ----------------------------------------------------------------------------------
    def execute(
        self,
        sandbox_id: str,
        command: list[str],
        timeout: float = 30.0,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        on_output: OutputCallback | None = None,
        stdin: bytes | None = None,
        on_start: StartCallback | None = None,
    ) -> SandboxResult:
        """Run `command` (an argv list, no shell) confined; output streams to `on_output`,
        and `on_start(monitor)` is called once the run outlasts `QUICK_RUN_SECONDS`
        (subscribe gauges there; a quicker run is reported by its result alone)."""
        if not isinstance(command, list) or not command:
            raise SandboxError("command must be a non-empty list of strings")
        if any(ch in command[0] for ch in ";&|`$<>\n"):
            raise SandboxError(f"shell metacharacters in the program name {command[0]!r}; "
                               "pass an argv list (or run ['/bin/sh', '-c', line] explicitly)")
        return self._run(sandbox_id, "exec", command, timeout, cwd=cwd, env=env,
                         on_output=on_output, stdin=stdin, on_start=on_start)

    def run_python(
        self,
        sandbox_id: str,
        code: str,
        *,
        inputs: dict[str, Any] | None = None,
        outputs: Iterable[str] = (),
        timeout: float = 30.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        on_output: OutputCallback | None = None,
        on_start: StartCallback | None = None,
        on_input: InputCallback | None = None,
    ) -> SandboxResult:
        """Run Python source in a confined fork of the launcher's interpreter.

        `inputs` are pickled in from this (trusted) side; `outputs` name variables to send
        back, as JSON-safe data only, in `SandboxResult.variables` (no other name crosses).
        `on_input(prompt, password)` answers the cell's `input()`/`getpass()` (raise
        EOFError with the reason when nobody can); without it they raise EOFError.
        """
        if not isinstance(code, str):
            raise SandboxError("code must be a string")
        outputs = list(outputs)
        try:
            # Inputs are pickled apart: the cell unpickles them after its hooks are in place,
            # so an input's own code (a __reduce__) already meets them.
            payload = pickle.dumps({"code": code, "inputs": pickle.dumps(dict(inputs or {})),
                                    "outputs": outputs,
                                    "policy": self._child_view(self._get(sandbox_id))})
        except Exception as exc:  # noqa: BLE001
            raise SandboxError(f"input variables cannot be sent to the sandbox: {exc}") from None
        return self._run(sandbox_id, "python", [], timeout, cwd=cwd, env=env,
                         on_output=on_output, payload=payload, on_start=on_start,
                         events=CellEvents(outputs, on_input=on_input))

    @staticmethod
    def _child_view(sandbox: _Sandbox) -> dict[str, Any]:
        """What the cell's hooks know of the policy: the table's roots, for approval-gated
        opens and for refusals that name the virtual path; the plain grants, for the rest."""
        readable, writable = sandbox.grants or ([], [])
        everywhere = sandbox.capability.filesystem_config.readable_paths is None
        roots = sandbox.gated
        tables = {root.host for root in roots}  # shown by their virtual names instead
        return {
            "roots": [root.to_json() for root in roots],
            "readable": ["/"] if everywhere else [p for p in readable if p not in tables],
            "writable": [p for p in writable if p not in tables],
            "home": sandbox.home,
            "denied": list(sandbox.denied),
            "egress": [rule.domain for rule in sandbox.capability.network_egress_rules],
        }

    def _run(
        self, sandbox_id: str, kind: str, argv: list[str], timeout: float, *,
        cwd: str | None, env: dict[str, str] | None, on_output: OutputCallback | None,
        stdin: bytes | None = None, payload: bytes | None = None,
        on_start: StartCallback | None = None, events: CellEvents | None = None,
    ) -> SandboxResult:
        if not timeout > 0:
            raise SandboxError(f"timeout must be positive, got {timeout!r}")
        sandbox = self._get(sandbox_id)
        previous = self._claim(sandbox)
        try:
            plan = self._plan(sandbox, kind, argv, cwd, env)
        except BaseException:
            sandbox.status = previous  # a bad request changes nothing
            raise
        try:
            result = self._spawn_and_collect(sandbox, plan, timeout, on_output, stdin, payload,
                                             on_start, events)
        except SandboxError:
            ran = sandbox.child is not None and sandbox.child.pid > 0
            sandbox.status = SandboxStatus.stopped if ran else previous  # not started: unchanged
            raise
        except BaseException:
            sandbox.status = SandboxStatus.stopped if sandbox.child is not None else SandboxStatus.failed
            raise
        sandbox.status = SandboxStatus.stopped
        sandbox.runs += 1
        self._prepare_next(sandbox, plan)
        return result

    def _prepare_next(self, sandbox: _Sandbox, plan: ChildPlan) -> None:
        """Have the launcher make this sandbox's view (mounts, covers, Landlock rules) for
        its next run now, while nobody waits. The next run uses it only if its own plan has
        the same view (`ChildPlan.view`: the same grants, covers, identity, and a host whose
        mount table and hidden folders have not changed since); otherwise it is ended."""
        with self._lock:
            if self._sandboxes.get(sandbox.sandbox_id) is not sandbox or sandbox.session:
                return
            previous, sandbox.prepared = sandbox.prepared, None
        if previous is not None:
            self._launcher.discard(previous[0])
        key = uuid.uuid4().hex
        # The view alone: no command line or environment value of this run waits in a spare.
        view = dataclasses.replace(plan, kind="exec", argv=[], env={}, cwd="/", rlimits={})
        fds = {"plan": memfd("sandbox-view", json.dumps(view.to_json()).encode())}
        try:
            fds.update(self._view_mounts(sandbox, plan))
            self._launcher.prepare(key, fds)
        finally:
            for fd in fds.values():
                os.close(fd)
        with self._lock:
            if self._sandboxes.get(sandbox.sandbox_id) is sandbox:
                sandbox.prepared, key = (key, plan.view()), None
        if key is not None:  # destroyed meanwhile: nothing may wait for it
            self._launcher.discard(key)

    def _prepared_key(self, sandbox: _Sandbox, plan: ChildPlan) -> str | None:
        """The key of the spare prepared for this run's view, if its view is still this one;
        a stale one is ended."""
        prepared, sandbox.prepared = sandbox.prepared, None
        if prepared is None:
            return None
        if prepared[1] == plan.view():
            return prepared[0]
        self._launcher.discard(prepared[0])
        return None

    def _claim(self, sandbox: _Sandbox) -> SandboxStatus:
        """Mark the sandbox running (one child at a time); its status before."""
        with self._lock:
            if sandbox.status not in (SandboxStatus.created, SandboxStatus.stopped):
                raise SandboxError(f"sandbox {sandbox.sandbox_id} is {sandbox.status.value}, "
                                   "not ready to run" + (" (a session is open in it)"
                                                         if sandbox.session else ""))
            previous, sandbox.status = sandbox.status, SandboxStatus.running
            sandbox.kill_reason = None
            sandbox.child = None
        return previous

    def _plan(self, sandbox: _Sandbox, kind: str, argv: list[str], cwd: str | None,
              env: dict[str, str] | None) -> ChildPlan:
        egress = bool(sandbox.capability.network_egress_rules) and sandbox.network_note is None
        return build_plan(sandbox.capability, kind=kind, argv=argv, home=sandbox.home, cwd=cwd,
                          env=env, uid=self.child_uid, gid=self.child_uid,
                          denied=sandbox.denied, pinned=sandbox.grants,
                          proxy_port=PROXY_PORT if egress else None,
                          disk_headroom=self._disk_headroom(sandbox),
                          owner_mapping=self._owner_map is not None,
                          sized_home=sandbox.home_mount is not None,
                          shared_tasks=self._shared_tasks())

    def _shared_tasks(self) -> int:
        """Tasks Linux counts with a child's own against its process budget: with the
        kernel's uid and no user namespace (Docker's profile), that uid's tasks outside
        every sandbox."""
        if self.child_uid is not None or user_namespaces():
            return 0
        return unsandboxed_tasks(os.getuid())

    def _disk_headroom(self, sandbox: _Sandbox) -> int | None:
        """Bytes the sandbox may still add to its folders (None: no quota); a sandbox already
        over its quota does not run. The headroom caps each file the run writes (RLIMIT_FSIZE),
        so one big file stops at the quota in Linux itself; the monitor's walks catch many."""
        disk = sandbox.disk
        if disk is None:
            return None
        added = disk.added
        if disk.exceeded(added):  # over by the last walk: files may have been deleted since
            added = disk.measure_now()
        reason = disk.exceeded(added)
        if reason is not None:
            raise SandboxError(f"{reason}: delete files in {', '.join(disk.folders)} (or raise "
                               "the quota in the policy) before running again"
                               if disk.folders else f"{reason}: raise the quota in the policy")
        return disk.limit - added

    # -- sessions ---------------------------------------------------------------------------------
    def start_session(self, sandbox_id: str, *, cwd: str | None = None,
                      env: dict[str, str] | None = None) -> PythonSession:
        """A stateful code interpreter in this sandbox: one long-lived confined Python process
        whose cells (`PythonSession.run_cell`) share their namespace. The sandbox serves the
        session alone until it ends (`close()`, a breach, `destroy`)."""
        sandbox = self._get(sandbox_id)
        previous = self._claim(sandbox)
        try:
            plan = self._plan(sandbox, "session", [], cwd, env)
            payload = pickle.dumps({"policy": self._child_view(sandbox)})
            plumbing = Plumbing.open(plan, None, payload)
        except BaseException:
            sandbox.status = previous
            raise
        try:
            child, _, listener = self._launch(sandbox, plan, plumbing)
        except BaseException:
            plumbing.close()
            sandbox.status = SandboxStatus.stopped if sandbox.child is not None else previous
            raise
        session = PythonSession(self, sandbox, child, plumbing, listener)
        sandbox.session = session
        self._idle.add(session)
        return session

    def _session_ended(self, session: PythonSession, child: SpawnedChild,
                       plumbing: Plumbing | None, control: ControlChannel,
                       listener: socket.socket | None) -> None:
        """Release what an ended session held; its sandbox may run again."""
        sandbox = self._sandboxes.get(session.sandbox_id)
        self._idle.discard(session)
        child.kill()  # a no-op once it exited; the pidfd is our last handle on it
        control.close()
        if plumbing is not None:
            plumbing.close()
        if sandbox is not None and listener is not None and sandbox.proxy is not None:
            sandbox.proxy.stop_serving(listener)
        child.close()
        if sandbox is not None and sandbox.session is session:
            sandbox.session = None
            sandbox.runs += session.cells_run
            sandbox.status = SandboxStatus.stopped

    def _spawn_and_collect(self, sandbox: _Sandbox, plan: ChildPlan, timeout: float,
                           on_output: OutputCallback | None, stdin: bytes | None,
                           payload: bytes | None, on_start: StartCallback | None = None,
                           events: CellEvents | None = None) -> SandboxResult:
        """Launch the child, watch it to its end, and collect what it left."""
        plumbing = Plumbing.open(plan, stdin, payload)
        try:
            child, started, listener = self._launch(sandbox, plan, plumbing)
            return self._supervise(sandbox, child, plumbing, listener, started, timeout,
                                   on_output, on_start, events or CellEvents())
        finally:
            plumbing.close()

    def _launch(self, sandbox: _Sandbox, plan: ChildPlan, plumbing: Plumbing
                ) -> tuple[SpawnedChild, float, socket.socket | None]:
        """Start the child and wait until it runs; (the child, its start, the proxy's
        listener in its namespace). A failure or an interrupt while it starts kills it: it
        must not run on unwatched."""
        # The whole plan (its folders, home, environment values, command line) goes on a
        # memfd that only the child reads: the launcher's memory is inherited by every later
        # fork, another sandbox's cell included, so nothing of a plan may pass through it.
        plumbing.child_ends["plan"] = memfd("sandbox-plan", json.dumps(plan.to_json()).encode())
        plumbing.child_ends.update(self._view_mounts(sandbox, plan))
        started = time.monotonic()
        child = self._launcher.spawn(plumbing.child_ends, self._prepared_key(sandbox, plan))
        sandbox.child = child  # from here on, kill() and destroy() reach it
        try:
            child.wait_started()
            plumbing.close_child_ends()  # the launcher has them: an end of file means it ended
            listener = None
            if plumbing.handoff is not None:
                listener = self._serve_egress(sandbox, child, plumbing.handoff,
                                              plan.connect_by_notification)
            plumbing.close_handoff()
        except BaseException:
            child.kill()
            child.exited.wait(timeout=10)
            child.close()
            raise
        return child, started, listener

    def _supervise(self, sandbox: _Sandbox, child: SpawnedChild, plumbing: Plumbing,
                   listener: socket.socket | None, started: float, timeout: float,
                   on_output: OutputCallback | None, on_start: StartCallback | None,
                   events: CellEvents) -> SandboxResult:
        """Monitor, stream and serve the control channel until every pipe ends; stop all of
        it whatever happens, and kill the tree if we are interrupted."""
        monitor = ResourceMonitor(
            sandbox.capability.resource_limits, interval=self.monitor_interval, timeout=timeout,
            on_breach=lambda reason: self._breach(sandbox, child, reason),
            # Waiting for people stretches a run's deadline by one approval timeout at most.
            max_paused=self.broker.timeout or DEFAULT_MAX_PAUSED,
            disk=sandbox.disk, started_at=started,
        )
        sandbox.monitor = monitor
        cap = int(sandbox.capability.resource_limits.max_output_mb * 1024 * 1024)
        streams = {plumbing.stdout: OutputStream("stdout", cap, on_output),
                   plumbing.stderr: OutputStream("stderr", cap, on_output)}
        control = None
        if plumbing.control is not None:
            control = self.control_channel(sandbox, child, plumbing.take_control(),
                                           lambda: monitor, events)
        egress_before = dict(sandbox.proxy.counts) if sandbox.proxy is not None else {}
        watch_at = time.monotonic() + self.quick_run_seconds
        try:
            # The monitor's own thread watches from here to the end, whatever the pump does:
            # a child that closes its pipes at once, an input() or a display the caller is
            # busy with, are all watched (its first look is at `watch_at`).
            monitor.start(child.pid, started_at=started, cpu_clock=child.cpu_clock,
                          first_poll_at=watch_at)
            self._pump(child, streams, control, monitor, timeout, sandbox,
                       until=lambda: time.monotonic() >= watch_at, wake_at=watch_at)
            if time.monotonic() >= watch_at:  # not a quick run: gauges from now on
                if on_start is not None:
                    on_start(monitor)
                self._pump(child, streams, control, monitor, timeout, sandbox)
            self._await_exit(sandbox, child, monitor, timeout)
        except BaseException:
            self._breach(sandbox, child, "interrupted")
            child.exited.wait(timeout=10)
            raise
        finally:
            monitor.stop()
            sandbox.monitor = None
            if control is not None:
                control.close()
            if listener is not None and sandbox.proxy is not None:
                sandbox.proxy.stop_serving(listener)  # its namespace is gone with the child
            child.close()
        return self._result(sandbox, child, monitor, streams, control, started, egress_before)

    def control_channel(self, sandbox: _Sandbox, child: SpawnedChild, sock: socket.socket,
                        monitor: Callable[[], ResourceMonitor | None],
                        events: CellEvents) -> ControlChannel:
        """The cell's control channel: gated opens asked of the broker (the clock of the
        cell being watched, `monitor()`, stops while a person is asked), usage reports, and
        a kill for a malformed frame."""

        def waiting(now_waiting: bool) -> None:
            watch = monitor()
            if watch is not None:
                watch.pause_clock() if now_waiting else watch.resume_clock()

        def usage(tokens: int, cost: float) -> None:
            watch = monitor()
            if watch is not None:
                self._usage(watch, tokens, cost)

        files = GatedFiles(
            sandbox.capability, self.broker, f"sandbox:{sandbox.sandbox_id[:8]}",
            roots=list(sandbox.gated), on_waiting=waiting,
        )
        return ControlChannel(
            sock, files, on_usage=usage,
            on_malformed=lambda reason: self._breach(sandbox, child, reason), events=events,
        )

    def _serve_egress(
        self, sandbox: _Sandbox, child: SpawnedChild, handoff: socket.socket, notified: bool
    ) -> socket.socket:
        """Take the listener the child made in its network namespace and proxy for it; or,
        where it has none, its seccomp filter's listener, whose connects a `ConnectBroker`
        answers with connections to a proxy listener of ours, on loopback."""
        handoff.settimeout(_HANDOFF_TIMEOUT)
        try:
            message, fds, _, _ = socket.recv_fds(handoff, 64, 1)
        except OSError as exc:
            fds, reason = [], str(exc)
        else:
            reason = "it ended first" if not fds else ""
            if fds and message != (b"notify" if notified else b"listener"):
                for fd in fds:
                    os.close(fd)
                fds, reason = [], f"it sent {message[:40]!r}, not what its plan asks for"
        if not fds:
            raise SandboxError(f"the sandbox could not set up its network ({reason}); "
                               f"{child.error or 'see the isolation report'}")
        with self._lock:
            if sandbox.proxy is None:
                sandbox.proxy = EgressProxy(
                    EgressFilter(sandbox.capability.network_egress_rules,
                                 limiter=self._rate_limiter),
                    sandbox_id=sandbox.sandbox_id, on_decision=sandbox.egress_log.append,
                    resolver=self._egress_resolver,
                )
        for fd in fds:  # received without close-on-exec: not for what this process starts
            os.set_inheritable(fd, False)
        if not notified:
            listener = socket.socket(fileno=fds[0])
            sandbox.proxy.serve(listener)
            return listener
        try:
            listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        except BaseException:
            os.close(fds[0])
            raise
        sandbox.proxy.serve(listener)
        ConnectBroker(fds[0], PROXY_PORT, listener.getsockname()[:2])  # ends with the tree
        return listener

    @staticmethod
    def _usage(monitor: ResourceMonitor, tokens: int, cost: float) -> None:
        if tokens:
            monitor.record_tokens(tokens)
        if cost:
            monitor.record_cost(cost)

    def _breach(self, sandbox: _Sandbox, child: SpawnedChild, reason: str) -> None:
        if sandbox.kill_reason is None:
            sandbox.kill_reason = reason
        child.kill()

    def _time_left(self, sandbox: _Sandbox, child: SpawnedChild, monitor: ResourceMonitor,
                   timeout: float) -> float:
        """Seconds the run has left on its clock (which stops while a person is asked); at
        none, the child is killed for its timeout."""
        remaining = timeout - monitor.elapsed()
        if remaining <= 0 and sandbox.kill_reason is None:
            self._breach(sandbox, child, f"timeout after {timeout:g} s")
        return remaining

    def _await_exit(self, sandbox: _Sandbox, child: SpawnedChild, monitor: ResourceMonitor,
                    timeout: float) -> None:
        """Wait for the child once its pipes have ended: it may have closed them and run on,
        so the timeout still holds (beside the monitor's), and a child that a kill does not
        end within `EXIT_GRACE` seconds is given up on rather than waited for forever."""
        while not child.exited.wait(0.25):
            self._time_left(sandbox, child, monitor, timeout)
            if sandbox.kill_reason is not None:
                if not child.exited.wait(EXIT_GRACE):
                    logger.warning("sandbox %s: its child did not end within %g s of a kill",
                                   sandbox.sandbox_id, EXIT_GRACE)
                return

    def _pump(self, child: SpawnedChild, streams: dict[int, OutputStream],
              control: ControlChannel | None, monitor: ResourceMonitor, timeout: float,
              sandbox: _Sandbox, until: Callable[[], bool] | None = None,
              wake_at: float | None = None) -> None:
        """Read every pipe until all reach end of file (the namespace is gone by then) or
        `until()` holds (looked at again no later than `wake_at`). The timeout counts the
        monitor's clock, which stops while a person is asked."""

        def tick() -> float:
            remaining = self._time_left(sandbox, child, monitor, timeout)
            wait = max(min(remaining, 0.5), 0.05)
            if wake_at is not None:  # `until` may turn true then with no data to wake us
                wait = max(0.0, min(wait, wake_at - time.monotonic()))
            return wait

        pump(streams, control, tick=tick, until=until)

    @staticmethod
    def _count_run(sandbox: _Sandbox, usage: dict[str, Any], started: float,
                   egress_before: dict[str, int], streams: dict[int, OutputStream]
                   ) -> tuple[str, str]:
        """Add what every run reports (wall time, its egress decisions, output it dropped) to
        `usage`, keep it as the sandbox's last, and return (stdout, stderr)."""
        usage["wall_seconds"] = round(time.monotonic() - started, 4)
        if sandbox.disk is not None:  # a run quicker than the monitor's first walk counts too
            usage["disk_bytes"] = sandbox.disk.measure_if_due()
        if sandbox.proxy is not None:
            for name, count in sandbox.proxy.counts.items():
                usage[f"egress_{name}"] = count - egress_before.get(name, 0)
        dropped = {s.name: s.dropped for s in streams.values() if s.dropped}
        if dropped:
            usage["output_dropped_bytes"] = dropped
        sandbox.last_usage = usage
        stdout, stderr = (s.text() for s in streams.values())
        return stdout, stderr

    def _result(self, sandbox: _Sandbox, child: SpawnedChild, monitor: ResourceMonitor,
                streams: dict[int, OutputStream], control: ControlChannel | None, started: float,
                egress_before: dict[str, int]) -> SandboxResult:
        usage = monitor.snapshot()
        usage["cpu_seconds"] = round(max(usage.get("cpu_seconds", 0.0), child.cpu_seconds), 4)
        usage["peak_memory_mb"] = round(max(usage.get("peak_memory_mb", 0.0), child.maxrss_kb / 1024), 2)
        if child.pid:  # a run too short for the monitor to see it still had its one process
            usage["peak_processes"] = max(usage.get("peak_processes", 0), 1)
        usage["elapsed_seconds"] = round(usage["elapsed_seconds"], 4)
        usage["approval_wait_seconds"] = round(usage["approval_wait_seconds"], 4)
        stdout, stderr = self._count_run(sandbox, usage, started, egress_before, streams)
        reason = sandbox.kill_reason or monitor.exceeded()
        exit_code = child.status if child.status is not None else -1
        if child.error:
            stderr += f"[sandbox] {child.error}\n"
        if sandbox.network_note is not None:
            stderr += f"[sandbox] {sandbox.network_note}\n"
        variables: dict[str, Any] = {}
        if reason is not None:
            exit_code = -1
            stderr += ("" if not stderr or stderr.endswith("\n") else "\n") + f"[sandbox] killed: {reason}\n"
        elif control is not None and control.variables is not None:
            variables = control.variables
        return SandboxResult(
            exit_code=exit_code, stdout=stdout, stderr=stderr,
            duration_ms=(time.monotonic() - started) * 1000, resource_usage=usage,
            killed=reason, variables=variables,
        )


def _homes_folder() -> str:
    """The homes folder, made if needed: ours, not a symlink, searchable but not listable by
    others (0711), so a child can enter its own home and learn no other's name."""
    folder = homes_folder()
    try:
        os.mkdir(folder, 0o711)
    except FileExistsError:
        pass
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise SandboxError(f"{folder} is not a folder owned by uid {os.geteuid()}; remove it")
    if stat.S_IMODE(info.st_mode) != 0o711:
        os.chmod(folder, 0o711)
    return folder
