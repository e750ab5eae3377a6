"""The host backend never reaches outside its root: not through planted symlinks, and
not when the tree is swapped under it while it works (the check-then-open race)."""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox_kernel_ext.files import host_backend
from sandbox_kernel_ext.files.backend import EscapeRefused, Rel
from sandbox_kernel_ext.files.host_backend import REASON_NO_SYMLINKS, HostBackend

SECRET = b"TOP SECRET - must never be read through the backend"
PUBLIC = b"public"
MODES = ["openat2", "deny-symlinks", "component-walk"]
_RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _no_openat2(*args: object) -> int:
    raise OSError(errno.ENOSYS, "simulated kernel without openat2")


def make_backend(root: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> HostBackend:
    if mode == "component-walk":
        monkeypatch.setattr(host_backend, "_openat2", _no_openat2)
    made = HostBackend(root, deny_symlinks=mode == "deny-symlinks")
    assert made.resolution == ("component-walk" if mode == "component-walk" else "openat2")
    return made


@dataclass
class Layout:
    """tmp/root is the backend's root; tmp/outside holds what must stay untouched."""

    top: Path
    root: Path
    outside: Path


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (outside / "nested").mkdir(parents=True)
    for name in ["secret.txt", "data.txt", "nested/secret.txt"]:
        (outside / name).write_bytes(SECRET)
    (root / "sub").mkdir(parents=True)
    (root / "inside.txt").write_bytes(PUBLIC)
    (root / "sub" / "inside.txt").write_bytes(PUBLIC)
    links = {
        # escaping
        "abs_dir": str(outside),
        "rel_dir": "../outside",
        "sneak_dir": "sub/up/../outside",  # `..` smuggled in after an in-root symlink
        "sub/deep_dir": "../../outside",
        "abs_file": str(outside / "secret.txt"),
        "rel_file": "../outside/secret.txt",
        "abs_in": str(root / "sub"),  # absolute, even pointing inside, is refused
        # staying inside
        "sub/up": "..",
        "link_dir": "sub",
        "link_file": "sub/inside.txt",
    }
    for name, target in links.items():
        os.symlink(target, root / name)
    return Layout(tmp_path, root, outside)


def snapshot(path: Path) -> dict[str, tuple[object, ...]]:
    """Everything that could betray a change: names, kinds, content, inode and times."""
    state: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for name in ["", *dirnames, *filenames]:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            content = Path(full).read_bytes() if os.path.isfile(full) else None
            state[os.path.relpath(full, path)] = (st.st_mode, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, content)
    return state


def read(backend: HostBackend, rel: Rel) -> bytes:
    f, _ = backend.open_read(rel)
    with f:
        return f.read()


def write(backend: HostBackend, rel: Rel, data: bytes) -> None:
    with backend.atomic_writer(rel) as out:
        out.write(data)


def every_operation_on(backend: HostBackend, rel: Rel) -> dict[str, Callable[[], object]]:
    """Each way the backend can touch `rel` (a folder) or something inside it."""
    return {
        "read": lambda: read(backend, rel + ("secret.txt",)),
        "write": lambda: write(backend, rel + ("planted.txt",), b"x"),
        "replace": lambda: write(backend, rel + ("secret.txt",), b"x"),
        "delete": lambda: backend.delete(rel + ("secret.txt",)),
        "rename out": lambda: backend.rename(rel + ("secret.txt",), ("stolen.txt",)),
        "rename in": lambda: backend.rename(("inside.txt",), rel + ("moved.txt",)),
        "scandir": lambda: backend.scandir(rel),
        "walk": lambda: list(backend.walk(rel)),
        "mkdirs": lambda: backend.mkdirs(rel + ("made",)),
        "info": lambda: backend.info(rel + ("secret.txt",)),
    }


# ------------------------------------------------------------ planted symlinks
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("link", [("abs_dir",), ("rel_dir",), ("sneak_dir",), ("sub", "deep_dir")])
def test_symlinked_folders_leading_out_are_refused(
    layout: Layout, mode: str, link: Rel, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = snapshot(layout.outside)
    with make_backend(layout.root, mode, monkeypatch) as backend:
        for what, operation in every_operation_on(backend, link).items():
            with pytest.raises(EscapeRefused) as refused:
                operation()
            assert str(layout.top) not in refused.value.reason, what
    assert snapshot(layout.outside) == before
    assert (layout.root / "inside.txt").read_bytes() == PUBLIC
    assert not (layout.root / "stolen.txt").exists()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("link", ["abs_file", "rel_file"])
def test_symlinked_files_leading_out_are_refused(
    layout: Layout, mode: str, link: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = snapshot(layout.outside)
    with make_backend(layout.root, mode, monkeypatch) as backend:
        with pytest.raises(EscapeRefused):
            read(backend, (link,))
        with pytest.raises(EscapeRefused):  # replacing a link would detach it silently
            write(backend, (link,), b"x")
        assert backend.info((link,)).kind == "symlink"  # type: ignore[union-attr]
        backend.rename((link,), ("renamed_link",))  # moves the link itself
        backend.delete(("renamed_link",))  # removes the link, never its target
        assert backend.info(("renamed_link",)) is None
    assert snapshot(layout.outside) == before


@pytest.mark.parametrize("mode", MODES)
def test_walk_and_listing_never_follow_symlinks(layout: Layout, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with make_backend(layout.root, mode, monkeypatch) as backend:
        walked = {rel: info.kind for rel, info in backend.walk(())}
        listed = dict(backend.scandir(()))
    links = {rel for rel, kind in walked.items() if kind == "symlink"}
    assert {"/".join(rel) for rel in links} == {
        "abs_dir", "rel_dir", "sneak_dir", "sub/deep_dir", "abs_file", "rel_file", "abs_in",
        "sub/up", "link_dir", "link_file",
    }  # fmt: skip
    assert not any(rel[: len(link)] == link and rel != link for rel in walked for link in links)
    assert listed["abs_dir"].kind == "symlink"


@pytest.mark.parametrize("mode", MODES)
def test_symlinks_that_stay_inside(layout: Layout, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    inside_paths: list[Rel] = [("link_file",), ("link_dir", "inside.txt"), ("sub", "up", "inside.txt")]
    with make_backend(layout.root, mode, monkeypatch) as backend:
        with pytest.raises(EscapeRefused):
            read(backend, ("abs_in", "inside.txt"))  # RESOLVE_BENEATH refuses absolute targets
        if mode == "openat2":
            assert [read(backend, rel) for rel in inside_paths] == [PUBLIC] * 3
            assert [n for n, _ in backend.scandir(("link_dir",))] == ["deep_dir", "inside.txt", "up"]
            write(backend, ("link_dir", "new.txt"), b"via link")
            assert (layout.root / "sub" / "new.txt").read_bytes() == b"via link"
            return
        for rel in inside_paths:
            with pytest.raises(EscapeRefused) as refused:
                read(backend, rel)
            if mode == "deny-symlinks":
                assert refused.value.reason == REASON_NO_SYMLINKS
        with pytest.raises(EscapeRefused):
            write(backend, ("link_dir", "new.txt"), b"x")
        assert not (layout.root / "sub" / "new.txt").exists()


def test_scripted_check_then_swap_then_use(layout: Layout) -> None:
    """The race made deterministic: a check passes, the tree is swapped, then the use.
    A path-string open leaks the secret; the backend refuses."""
    (layout.root / "swap").mkdir()
    (layout.root / "swap" / "data.txt").write_bytes(PUBLIC)
    path = layout.root / "swap" / "data.txt"
    with HostBackend(layout.root) as backend:
        assert os.path.realpath(path).startswith(str(layout.root) + os.sep)  # naive check
        assert backend.info(("swap", "data.txt")).kind == "file"  # type: ignore[union-attr]
        (layout.root / "swap").rename(layout.root / "parked")
        (layout.root / "swap").symlink_to(layout.outside)
        assert path.read_bytes() == SECRET  # what the naive use would do
        with pytest.raises(EscapeRefused):
            backend.open_read(("swap", "data.txt"))


# ----------------------------------------------------------------------- races
def exchange(a: Path, b: Path) -> None:
    """Atomically swap two names (renameat2 RENAME_EXCHANGE): the path is always there,
    just a different thing each time, so every access lands on one or the other."""
    if _libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


class Swapper(threading.Thread):
    """Swaps each (path, alternative) pair in a tight loop until stopped."""

    def __init__(self, pairs: list[tuple[Path, Path]], max_swaps: int = 5_000_000) -> None:
        super().__init__(daemon=True)
        self.pairs = pairs
        self.max_swaps = max_swaps
        self.swaps = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set() and self.swaps < self.max_swaps:
                for a, b in self.pairs:
                    exchange(a, b)
                self.swaps += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def __enter__(self) -> Swapper:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join()
        assert self.error is None, self.error


@pytest.fixture
def swap_layout(layout: Layout) -> Iterator[tuple[Layout, list[tuple[Path, Path]]]]:
    """root/swap flips between a real folder and a symlink to the outside folder, and
    root/fswap between a real file and a symlink to the outside secret."""
    (layout.root / "swap").mkdir()
    (layout.root / "swap" / "data.txt").write_bytes(PUBLIC)
    (layout.root / "fswap").write_bytes(PUBLIC)
    pairs = [(layout.root / "swap", layout.root / "rel_dir"), (layout.root / "fswap", layout.root / "abs_file")]
    try:
        exchange(*pairs[0])
        exchange(*pairs[0])
    except OSError as exc:
        pytest.skip(f"this filesystem cannot exchange names atomically: {exc}")
    yield layout, pairs


ALLOWED_FAILURES = (EscapeRefused, FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError)


@pytest.mark.parametrize("mode", MODES)
def test_swapping_the_tree_during_operations_never_escapes(
    swap_layout: tuple[Layout, list[tuple[Path, Path]]], mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout, pairs = swap_layout
    outside_before = snapshot(layout.outside)
    top_before = sorted(os.listdir(layout.top))
    outcomes: Counter[str] = Counter()
    unexpected: list[BaseException] = []
    returned: list[bytes] = []
    listed: set[str] = set()

    def attempt(operation: Callable[[], object]) -> None:
        try:
            operation()
            outcomes["ok"] += 1
        except ALLOWED_FAILURES as exc:
            outcomes[type(exc).__name__] += 1
        except BaseException as exc:  # noqa: BLE001 - collected, asserted below
            unexpected.append(exc)

    swap, fswap = ("swap",), ("fswap",)
    operations: list[Callable[[], object]] = [
        lambda: returned.append(read(backend, swap + ("data.txt",))),
        lambda: returned.append(read(backend, fswap)),
        lambda: listed.update(n for n, _ in backend.scandir(swap)),
        lambda: listed.update(rel[-1] for rel, _ in backend.walk(())),
        lambda: write(backend, swap + ("written.txt",), PUBLIC),
        lambda: write(backend, fswap, PUBLIC),
        lambda: backend.delete(swap + ("written.txt",)),
        lambda: backend.rename(swap + ("data.txt",), swap + ("renamed.txt",)),
        lambda: backend.rename(swap + ("renamed.txt",), swap + ("data.txt",)),
        lambda: backend.info(swap + ("data.txt",)),
        lambda: backend.mkdirs(swap + ("made",)),
    ]
    with make_backend(layout.root, mode, monkeypatch) as backend, Swapper(pairs) as swapper:
        for _ in range(250):
            for operation in operations:
                attempt(operation)
    assert unexpected == []
    # Both states were met (each is seen hundreds of times even on one CPU).
    assert swapper.swaps > 0 and outcomes["ok"] > 0 and outcomes["EscapeRefused"] > 0
    assert SECRET not in returned
    assert set(returned) <= {PUBLIC}
    assert "secret.txt" not in listed and "nested" not in listed
    assert snapshot(layout.outside) == outside_before
    assert sorted(os.listdir(layout.top)) == top_before
    print(f"{mode}: {swapper.swaps} swaps, outcomes {dict(outcomes)}")


def test_a_path_string_check_then_open_does_leak_in_the_same_race(
    swap_layout: tuple[Layout, list[tuple[Path, Path]]],
) -> None:
    """The contrast, so the race test above is known to exercise a real race. Stops at
    the first leak (after a few tries with 2+ CPUs, a few thousand with one); the cap is
    far beyond what is needed, so this does not flake."""
    layout, pairs = swap_layout
    path = str(layout.root / "swap" / "data.txt")
    inside = str(layout.root) + os.sep
    leaked = False
    with Swapper(pairs[:1]):
        for _ in range(200_000):
            try:
                if os.path.realpath(path).startswith(inside):  # the check...
                    with open(path, "rb") as f:  # ...then the use, by name
                        leaked = f.read() == SECRET
            except OSError:
                continue
            if leaked:
                break
    assert leaked


def test_toolset_reads_and_writes_race_a_symlink_swap_without_escaping(tmp_path: Path) -> None:
    """The same race one layer up: the toolset must not re-resolve path strings."""
    from sandbox_kernel_ext import FileLimits, FileSystemToolset, SandboxError
    from sandbox_kernel_ext.policy.sandbox import Sandbox

    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in outside.iterdir())
    tools = FileSystemToolset(
        FileSystemToolset.create_default(root).sandbox, limits=FileLimits(max_total_bytes=None)
    )
    assert isinstance(tools.sandbox, Sandbox)
    stop = threading.Event()

    def swap() -> None:
        sub = root / "sub"
        for n in range(200_000):
            if stop.is_set():
                return
            try:
                if sub.is_symlink():
                    sub.unlink()
                elif sub.exists():
                    shutil.rmtree(sub, ignore_errors=True)
                if n % 2:
                    sub.symlink_to(outside)
                else:
                    sub.mkdir()
                    (sub / "secret.txt").write_text("inside")
                    time.sleep(0.0005)  # a real folder for a moment, so some calls succeed
            except OSError:
                pass

    def seen_both() -> bool:
        return outcomes.get("PathNotInSandboxError", 0) > 0 and (
            outcomes.get("read", 0) + outcomes.get("write", 0) > 0)

    swapper = threading.Thread(target=swap)
    swapper.start()
    outcomes: dict[str, int] = {}
    try:
        for i in range(30_000):  # at least 3,000 calls, more until both outcomes were seen
            if i >= 3000 and seen_both():
                break
            try:
                if i % 2:
                    content = tools.read("/data/sub/secret.txt").content
                    assert "SECRET" not in content
                    outcomes["read"] = outcomes.get("read", 0) + 1
                else:
                    tools.write(f"/data/sub/new{i}.txt", "x")
                    outcomes["write"] = outcomes.get("write", 0) + 1
            except SandboxError as exc:
                outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1
    finally:
        stop.set()
        swapper.join()
        tools.close()
    assert sorted((p.name, p.stat().st_mtime_ns) for p in outside.iterdir()) == before
    assert outcomes.get("PathNotInSandboxError", 0) > 0, outcomes  # the race was really run
    assert outcomes.get("read", 0) + outcomes.get("write", 0) > 0, outcomes
