"""What crosses between the runner's processes, and in what shape.

Three processes meet here: the trusted side (the Jupyter kernel or any Python caller, in
`trusted/`), the launcher (`launcher/`, a fork server) and the confined child (`child/`).
This module is their shared vocabulary and imports none of them:

- `ChildPlan`, the plain data the trusted side decides and the launcher and child carry out;
- the descriptor numbers the child finds its plumbing at;
- the launcher's message framing (one JSON object per SOCK_SEQPACKET message, descriptors in
  SCM_RIGHTS) and its size caps;
- the encoding of a cell's output variables (JSON-safe data only: the trusted side never
  unpickles anything a sandboxed process wrote);
- the display format a Bokeh plot crosses in (`BOKEH_ITEM_MIME`).
"""

from __future__ import annotations

import base64
import json
import os
import socket
from dataclasses import dataclass, field, fields
from collections.abc import Callable
from typing import Any

__all__ = [
    "ChildPlan", "CONTROL_FD", "PAYLOAD_FD", "STATUS_FD", "MAX_MESSAGE", "FDS_PER_MESSAGE",
    "MAX_VARIABLES_BYTES", "encode_value", "decode_value", "ARRAY_TAGS", "read_to_end", "send_message",
    "receive_message", "BOKEH_ITEM_MIME",
]

# A Bokeh plot shown in a sandboxed cell crosses as its `bokeh.embed.json_item` (data only,
# checked and drawn by the trusted side, `trusted/charts.py`); never sent to a notebook page.
BOKEH_ITEM_MIME = "application/x-sandbox-bokeh-item+json"

# Where the plumbing sits in the confined child.
CONTROL_FD = 3  # a socket to the trusted side: JSON-line frames both ways, fds back
PAYLOAD_FD = 4  # trusted side -> child: the cell and its pickled inputs (a memfd)
STATUS_FD = 5  # child -> launcher: setup errors; closed (on exec) once the child runs

# The launcher's messages: a plan with ~250 paths is ~20 KB. A message's descriptors (one
# per owner-mapped folder, and a few of plumbing) travel in parts of at most FDS_PER_MESSAGE:
# there is no cap on how many one message has.
MAX_MESSAGE = 4 * 1024 * 1024
FDS_PER_MESSAGE = 64
_MORE_FDS = b"\0more descriptors"  # a part ahead of its message; never valid JSON

# Output variables are parsed on the trusted side: 4 MiB of JSON can cost ~100x that as
# Python objects in the worst case, so the cap stays small. Larger results belong in a file.
MAX_VARIABLES_BYTES = 4 * 1024 * 1024
_MAX_DEPTH = 64
_BYTES_TAG = "__sandbox_bytes__"
# numpy and pandas values in data-only forms (`child/array_values.py`, `trusted/array_values.py`)
ARRAY_TAG, FRAME_TAG, SERIES_TAG, INDEX_TAG = ("__sandbox_ndarray__", "__sandbox_dataframe__",
                                               "__sandbox_series__", "__sandbox_index__")
ARRAY_TAGS = frozenset({ARRAY_TAG, FRAME_TAG, SERIES_TAG, INDEX_TAG})


@dataclass
class ChildPlan:
    """One confined child, decided on the trusted side (`trusted/plan.py`)."""

    # "exec": run argv; "python": run one cell in the forked interpreter; "session": serve
    # cells sent over the control channel, in one namespace, until the trusted side hangs up
    kind: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    read_paths: list[str]
    write_paths: list[str]
    rlimits: dict[str, list[int]]
    uid: int | None  # identity to drop to when the launcher runs as root
    gid: int | None
    # Where the egress proxy listens inside the child's network namespace (None: no network).
    proxy_port: int | None = None
    # Paths the child covers with empty mounts before confining itself, as names by folder:
    # those that existed when the plan was made (`plan.present_hidden`) and still do then. A
    # child that cannot mount refuses to run rather than read them.
    hidden_paths: dict[str, list[str]] = field(default_factory=dict)
    # Folders root owns that the plan grants (or that hold a grant), shown to a root kernel's
    # unprivileged child as its own through idmapped mounts (each a "tree N" descriptor).
    owner_mapped: list[str] = field(default_factory=list)
    # Paths inside the writable ones that stay read-only (`policy/write_protected.py`): with
    # mounts, each bound read-only and the folders above it inside its writable root made
    # mounts too (a mount cannot be renamed away); without, already left out of write_paths.
    protected_paths: list[str] = field(default_factory=list)
    # Folders Python imports from by name inside the writable ones (the kernel's working
    # directory, its sys.path): Landlock lets their files (and those of the folders on the
    # way from their writable root) be written in place, and nothing be named anew there.
    closed_folders: list[str] = field(default_factory=list)
    # "Read everywhere" lists / itself too: a Landlock rule to list every folder (names
    # only), given where whatever may not be read is hidden under mounts and /proc is private.
    list_everywhere: bool = False
    # What the view above was made from, beyond these fields: the host's mount table and the
    # folders the hidden paths were looked for in, as they were (an opaque digest). A child
    # prepared ahead with the same `view()` has a view still true for this run.
    view_stamp: str = ""
    # A /proc and a /dev/shm of the child's own (`isolation.private_mounts`, tried when the
    # kernel started). A child asked for one that it then cannot mount refuses to run; a child
    # not asked reads only its own /proc entries (Landlock) and uses the host's /dev/shm.
    private_proc: bool = False
    private_shm: bool = False
    # No network namespace for the proxy: every connect waits for the trusted side, which
    # puts its own connection to the proxy at the child's descriptor, or refuses
    # (`trusted/connect_broker.py`).
    connect_by_notification: bool = False
    # The home's path, where the home is a tmpfs sized by the disk quota: the run brings a
    # descriptor of it ("home") and attaches a copy there (`launcher/sized_home.py`).
    sized_home: str | None = None
    # The child's PID namespace's pid_max (Linux 6.14 makes it a namespace's own): a ceiling
    # on its processes that binds root too, whom RLIMIT_NPROC does not (None: not set).
    pid_max: int | None = None

    def view(self) -> str:
        """Everything a child's prepared view depends on (mounts, covers, Landlock rules), as
        one comparable string; the rest of a plan (command, environment, folder, rlimits,
        identity checks aside) is the run's own."""
        return json.dumps([self.read_paths, self.write_paths, self.hidden_paths,
                           self.owner_mapped, self.protected_paths, self.closed_folders,
                           self.list_everywhere, self.uid, self.gid, self.proxy_port,
                           self.view_stamp, self.private_proc, self.private_shm,
                           self.sized_home, self.pid_max],
                          sort_keys=True)

    def to_json(self) -> dict[str, Any]:
        # Shallow: asdict() deep-copies the ~250 paths, a measurable part of a run's cost.
        return {field.name: getattr(self, field.name) for field in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChildPlan:
        return cls(**data)


def send_message(sock: socket.socket, message: dict[str, Any], fds: list[int] = ()) -> None:
    """One launcher message and its descriptors (raises OSError when the other side is gone).

    Linux passes at most 253 descriptors in one message, and a policy may grant more folders
    than that: the descriptors beyond `FDS_PER_MESSAGE` go ahead in messages of their own
    (`_MORE_FDS`), which `receive_message` gathers. Callers already send one message at a
    time on a socket (under a lock), so the parts of one are never interleaved with another's."""
    fds = list(fds)
    while len(fds) > FDS_PER_MESSAGE:
        socket.send_fds(sock, [_MORE_FDS], fds[:FDS_PER_MESSAGE])
        fds = fds[FDS_PER_MESSAGE:]
    socket.send_fds(sock, [json.dumps(message).encode()], fds)


def receive_message(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One launcher message and its descriptors, however many; (b"", []) once the other
    side is gone, or when descriptors were lost on the way (a truncated message: none of
    them is kept, so nothing runs with part of its folders)."""
    gathered: list[int] = []
    while True:
        try:
            data, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE, FDS_PER_MESSAGE)
        except OSError:
            data, fds, flags = b"", [], 0
        gathered += fds
        if not data or flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC):
            for fd in gathered:
                os.close(fd)
            return b"", []
        if data != _MORE_FDS:
            return data, gathered


def read_to_end(fd: int) -> bytes:
    """Everything until end of file, then close `fd` (pipes and memfds of the plumbing)."""
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def encode_value(value: Any, name: str, depth: int = 0,
                 other: Callable[[Any, str], Any] | None = None) -> Any:
    """JSON-safe data: None, bool, int, float, str, bytes, lists/tuples and str-keyed dicts;
    `other` gives the tagged form of anything else it knows (None: it does not)."""
    if depth > _MAX_DEPTH:
        raise TypeError(f"output variable {name!r} is nested more than {_MAX_DEPTH} levels deep")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return {_BYTES_TAG: base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (list, tuple)):
        return [encode_value(item, name, depth + 1, other) for item in value]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"output variable {name!r} has a non-string key {key!r}")
            out[key] = encode_value(item, name, depth + 1, other)
        return out
    tagged = other(value, name) if other is not None else None
    if tagged is not None:
        return tagged
    raise TypeError(
        f"output variable {name!r} is a {type(value).__name__}; only JSON-safe data "
        "(None, bool, numbers, str, bytes, lists and str-keyed dicts) leaves a sandbox"
    )


def decode_value(value: Any, tagged: Callable[[str, Any], Any] | None = None) -> Any:
    """The trusted side of `encode_value`: the bytes tag, and with `tagged` the array tags
    (`tagged(tag, content)`); any other dict is data."""
    if isinstance(value, list):
        return [decode_value(item, tagged) for item in value]
    if isinstance(value, dict):
        if set(value) == {_BYTES_TAG} and isinstance(value[_BYTES_TAG], str):
            return base64.b64decode(value[_BYTES_TAG], validate=True)
        if tagged is not None and len(value) == 1 and next(iter(value)) in ARRAY_TAGS:
            tag = next(iter(value))
            return tagged(tag, value[tag])
        return {key: decode_value(item, tagged) for key, item in value.items()}
    return value
