"""The storage contract, checked alike on the in-memory store and on the host backend
(both with openat2 and with the component-walk fallback)."""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_kernel_ext.files import host_backend
from sandbox_kernel_ext.files.backend import EntryInfo, FileBackend, Rel
from sandbox_kernel_ext.files.host_backend import TEMP_SUFFIX, HostBackend
from sandbox_kernel_ext.files.store_backend import StoreBackend

KINDS = ["store", "host", "host-component-walk"]


def _no_openat2(*args: object) -> int:
    raise OSError(errno.ENOSYS, "simulated kernel without openat2")


@pytest.fixture(params=KINDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FileBackend]:
    if request.param == "store":
        made: FileBackend = StoreBackend()
    else:
        if request.param == "host-component-walk":
            monkeypatch.setattr(host_backend, "_openat2", _no_openat2)
        (tmp_path / "root").mkdir()
        made = HostBackend(tmp_path / "root")
        assert made.resolution == ("openat2" if request.param == "host" else "component-walk")
    with made:
        yield made


@pytest.fixture
def host(tmp_path: Path) -> Iterator[HostBackend]:
    (tmp_path / "root").mkdir()
    with HostBackend(tmp_path / "root") as made:
        yield made


def write(backend: FileBackend, rel: Rel, data: bytes, *, exclusive: bool = False) -> None:
    with backend.atomic_writer(rel, exclusive=exclusive) as out:
        out.write(data)


def read(backend: FileBackend, rel: Rel) -> bytes:
    f, _ = backend.open_read(rel)
    with f:
        return f.read()


def names(backend: FileBackend, rel: Rel = ()) -> list[str]:
    return [name for name, _ in backend.scandir(rel)]


def open_fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


# ----------------------------------------------------------------- read/write
def test_write_then_read_with_info(backend: FileBackend) -> None:
    write(backend, ("a", "b", "c.txt"), b"hello world")
    assert read(backend, ("a", "b", "c.txt")) == b"hello world"
    info = backend.info(("a", "b", "c.txt"))
    assert info is not None and (info.kind, info.size) == ("file", 11)
    assert backend.info(("a", "b")).kind == "dir"  # type: ignore[union-attr]
    assert backend.info(()).kind == "dir"  # type: ignore[union-attr]


def test_open_read_is_seekable_and_reports_the_opened_version(backend: FileBackend) -> None:
    write(backend, ("f.bin",), bytes(range(256)) * 4)
    f, info = backend.open_read(("f.bin",))
    with f:
        assert f.seekable()
        f.seek(1000)
        assert f.read(10) == (bytes(range(256)) * 4)[1000:1010]
    assert info == backend.info(("f.bin",))


def test_identity_changes_on_every_write_and_only_then(backend: FileBackend) -> None:
    write(backend, ("f",), b"one")
    first = backend.info(("f",))
    assert backend.info(("f",)) == first
    write(backend, ("f",), b"two")  # same size: the identity must still move
    second = backend.info(("f",))
    assert first is not None and second is not None
    assert second.identity != first.identity


def test_missing_paths(backend: FileBackend) -> None:
    write(backend, ("file",), b"x")
    assert backend.info(("nope",)) is None
    assert backend.info(("nope", "deeper")) is None
    assert backend.info(("file", "under-a-file")) is None
    with pytest.raises(FileNotFoundError):
        backend.open_read(("nope",))
    with pytest.raises(FileNotFoundError):
        backend.delete(("nope",))
    with pytest.raises(FileNotFoundError):
        backend.rename(("nope",), ("other",))
    assert backend.info(("other",)) is None
    with pytest.raises(FileNotFoundError):
        backend.scandir(("nope",))
    with pytest.raises(FileNotFoundError):
        list(backend.walk(("nope",)))


def test_directories_are_not_files(backend: FileBackend) -> None:
    backend.mkdirs(("d",))
    for rel in [("d",), ()]:
        with pytest.raises(IsADirectoryError):
            backend.open_read(rel)
        with pytest.raises(IsADirectoryError):
            backend.delete(rel)
        with pytest.raises(IsADirectoryError):
            write(backend, rel, b"x")
    assert backend.info(("d",)).kind == "dir"  # type: ignore[union-attr]


def test_files_are_not_directories(backend: FileBackend) -> None:
    write(backend, ("f",), b"x")
    with pytest.raises(NotADirectoryError):
        backend.scandir(("f",))
    with pytest.raises(NotADirectoryError):
        list(backend.walk(("f",)))
    with pytest.raises(NotADirectoryError):
        backend.mkdirs(("f",))
    with pytest.raises(NotADirectoryError):
        backend.mkdirs(("f", "sub"))
    with pytest.raises(NotADirectoryError):
        write(backend, ("f", "sub", "g"), b"x")
    assert read(backend, ("f",)) == b"x"


@pytest.mark.parametrize("bad", [("",), (".",), ("..",), ("a/b",), ("a\0",), ("ok", "..")])
def test_invalid_components_are_rejected_before_any_io(backend: FileBackend, bad: Rel) -> None:
    for call in (
        lambda: backend.info(bad),
        lambda: backend.open_read(bad),
        lambda: backend.delete(bad),
        lambda: backend.mkdirs(bad),
        lambda: backend.scandir(bad),
        lambda: list(backend.walk(bad)),
        lambda: backend.rename(bad, ("x",)),
        lambda: backend.rename(("x",), bad),
        lambda: write(backend, bad, b"x"),
    ):
        with pytest.raises(ValueError):
            call()


# -------------------------------------------------------------- atomic writer
def test_replace_keeps_old_content_when_the_write_fails(backend: FileBackend) -> None:
    write(backend, ("d", "f.txt"), b"old")
    with pytest.raises(RuntimeError):
        with backend.atomic_writer(("d", "f.txt")) as out:
            out.write(b"new partial")
            raise RuntimeError("boom")
    assert read(backend, ("d", "f.txt")) == b"old"
    assert names(backend, ("d",)) == ["f.txt"]  # no temp file left behind


def test_failed_new_file_leaves_nothing(backend: FileBackend) -> None:
    with pytest.raises(RuntimeError):
        with backend.atomic_writer(("new.txt",)) as out:
            out.write(b"x")
            raise RuntimeError("boom")
    assert backend.info(("new.txt",)) is None
    assert names(backend) == []


def test_nothing_is_visible_under_the_final_name_before_commit(backend: FileBackend) -> None:
    write(backend, ("f",), b"old")
    with backend.atomic_writer(("f",)) as out:
        out.write(b"new")
        out.flush()
        assert read(backend, ("f",)) == b"old"
    assert read(backend, ("f",)) == b"new"
    assert names(backend) == ["f"]


def test_writer_closed_by_the_caller_still_commits(backend: FileBackend) -> None:
    with backend.atomic_writer(("f",)) as out:
        out.write(b"data")
        out.close()
    assert read(backend, ("f",)) == b"data"


def test_exclusive_refuses_an_existing_target(backend: FileBackend) -> None:
    write(backend, ("f",), b"old")
    with pytest.raises(FileExistsError):
        write(backend, ("f",), b"new", exclusive=True)
    assert read(backend, ("f",)) == b"old"
    write(backend, ("g",), b"fresh", exclusive=True)
    assert read(backend, ("g",)) == b"fresh"
    assert names(backend) == ["f", "g"]


def test_exclusive_refuses_a_target_created_during_the_write(backend: FileBackend) -> None:
    with pytest.raises(FileExistsError):
        with backend.atomic_writer(("f",), exclusive=True) as out:
            out.write(b"mine")
            write(backend, ("f",), b"theirs")
    assert read(backend, ("f",)) == b"theirs"
    assert names(backend) == ["f"]


def test_a_directory_appearing_during_the_write_is_not_replaced(backend: FileBackend) -> None:
    with pytest.raises(IsADirectoryError):
        with backend.atomic_writer(("f",)) as out:
            out.write(b"x")
            backend.mkdirs(("f", "inner"))
    assert backend.info(("f", "inner")).kind == "dir"  # type: ignore[union-attr]
    assert names(backend) == ["f"]


def test_large_write_in_chunks(backend: FileBackend) -> None:
    chunk = os.urandom(64 * 1024)
    with backend.atomic_writer(("big",)) as out:
        for _ in range(32):
            out.write(chunk)
    f, info = backend.open_read(("big",))
    with f:
        assert info.size == 32 * len(chunk)
        f.seek(31 * len(chunk))
        assert f.read() == chunk


# ---------------------------------------------------------- delete and rename
def test_delete(backend: FileBackend) -> None:
    write(backend, ("d", "f"), b"x")
    backend.delete(("d", "f"))
    assert backend.info(("d", "f")) is None
    assert names(backend, ("d",)) == []


def test_rename_file_creates_parents_and_never_overwrites(backend: FileBackend) -> None:
    write(backend, ("a",), b"A")
    write(backend, ("b",), b"B")
    with pytest.raises(FileExistsError):
        backend.rename(("a",), ("b",))
    assert (read(backend, ("a",)), read(backend, ("b",))) == (b"A", b"B")
    backend.rename(("a",), ("x", "y", "a2"))
    assert read(backend, ("x", "y", "a2")) == b"A"
    assert backend.info(("a",)) is None


def test_rename_directory_moves_its_tree(backend: FileBackend) -> None:
    write(backend, ("src", "sub", "f"), b"deep")
    backend.mkdirs(("dst",))
    with pytest.raises(FileExistsError):
        backend.rename(("src",), ("dst",))
    backend.rename(("src",), ("moved",))
    assert read(backend, ("moved", "sub", "f")) == b"deep"
    assert names(backend) == ["dst", "moved"]
    with pytest.raises(OSError) as into_itself:
        backend.rename(("moved",), ("moved", "sub", "again"))
    assert into_itself.value.errno == errno.EINVAL


# ----------------------------------------------------------- listing, mkdirs
def test_scandir_is_sorted_and_typed(backend: FileBackend) -> None:
    for name in ["b.txt", "a.txt", "C.txt"]:
        write(backend, (name,), name.encode())
    backend.mkdirs(("dir",))
    listing = backend.scandir(())
    assert [n for n, _ in listing] == ["C.txt", "a.txt", "b.txt", "dir"]
    kinds = {n: i.kind for n, i in listing}
    assert kinds == {"C.txt": "file", "a.txt": "file", "b.txt": "file", "dir": "dir"}
    assert dict(listing)["a.txt"].size == 5


def build_tree(backend: FileBackend) -> None:
    for rel in [("top", "b", "y"), ("top", "a", "z"), ("top", "a", "inner", "x"), ("top", "c")]:
        write(backend, rel, b"12345")
    backend.mkdirs(("top", "empty"))


def test_walk_is_depth_first_sorted_and_root_relative(backend: FileBackend) -> None:
    build_tree(backend)
    seen = [(rel, info.kind) for rel, info in backend.walk(("top",))]
    assert seen == [
        (("top", "a"), "dir"),
        (("top", "a", "inner"), "dir"),
        (("top", "a", "inner", "x"), "file"),
        (("top", "a", "z"), "file"),
        (("top", "b"), "dir"),
        (("top", "b", "y"), "file"),
        (("top", "c"), "file"),
        (("top", "empty"), "dir"),
    ]
    assert sum(i.size for _, i in backend.walk(()) if i.kind == "file") == 20


def test_walk_checks_before_each_directory_and_stops_when_check_raises(backend: FileBackend) -> None:
    build_tree(backend)
    calls: list[int] = []
    list(backend.walk(("top",), check=lambda: calls.append(1)))
    assert len(calls) == 5  # top, a, a/inner, b, empty

    class Stop(Exception):
        pass

    def stop_at_third() -> None:
        calls.append(1)
        if len(calls) > 2:
            raise Stop

    calls.clear()
    seen: list[Rel] = []
    with pytest.raises(Stop):
        for rel, _ in backend.walk(("top",), check=stop_at_third):
            seen.append(rel)
    assert seen == [("top", "a"), ("top", "a", "inner")]


def test_walk_tolerates_changes_while_it_runs(backend: FileBackend) -> None:
    build_tree(backend)
    seen = []
    for rel, _ in backend.walk(("top",)):
        seen.append(rel)
        if rel == ("top", "a"):
            backend.rename(("top", "b"), ("elsewhere",))
            write(backend, ("top", "d"), b"late")
    # Each directory is listed once, when entered; a child that left since is skipped.
    assert ("top", "b") in seen and ("top", "b", "y") not in seen
    assert ("top", "d") not in seen
    assert ("top", "a", "z") in seen


def test_mkdirs_is_idempotent(backend: FileBackend) -> None:
    backend.mkdirs(("a", "b", "c"))
    backend.mkdirs(("a", "b", "c"))
    backend.mkdirs(())
    assert [rel for rel, _ in backend.walk(())] == [("a",), ("a", "b"), ("a", "b", "c")]


# --------------------------------------------------------- resources, threads
def test_no_file_descriptor_leaks(backend: FileBackend) -> None:
    build_tree(backend)
    before = open_fd_count()
    for i in range(50):
        write(backend, ("loop", f"f{i}"), b"x" * i)
        assert read(backend, ("loop", f"f{i}")) == b"x" * i
        backend.info(("loop", f"f{i}"))
        backend.scandir(("loop",))
        list(backend.walk(()))
        walk = backend.walk(())
        next(walk)
        walk.close()  # abandoned after one entry
        backend.rename(("loop", f"f{i}"), ("loop", "moved", f"f{i}"))
        backend.delete(("loop", "moved", f"f{i}"))
        with pytest.raises(RuntimeError):
            with backend.atomic_writer(("loop", "failing")) as out:
                out.write(b"x")
                raise RuntimeError
        for failing in (
            lambda: backend.open_read(("missing",)),
            lambda: backend.delete(("top",)),
            lambda: backend.scandir(("top", "c")),
            lambda: backend.rename(("top", "c"), ("top", "a", "z")),
            lambda: write(backend, ("top", "c"), b"x", exclusive=True),
        ):
            with pytest.raises(OSError):
                failing()
    assert open_fd_count() == before


def test_concurrent_writers_and_readers(backend: FileBackend) -> None:
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(40):
                payload = f"{n}:{i}".encode() * 100
                write(backend, ("shared", f"w{n}"), payload)
                assert read(backend, ("shared", f"w{n}")) == payload
                write(backend, ("shared", "common"), payload)
                assert len(read(backend, ("shared", "common"))) > 0
                backend.scandir(("shared",))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert names(backend, ("shared",)) == ["common", "w0", "w1", "w2", "w3"]


def test_closed_backend_refuses_work(backend: FileBackend) -> None:
    write(backend, ("f",), b"x")
    backend.close()
    backend.close()  # twice is fine
    if isinstance(backend, HostBackend):
        with pytest.raises(ValueError):
            backend.info(("f",))


# ------------------------------------------------------------- host-only parts
def test_host_permissions(host: HostBackend, tmp_path: Path) -> None:
    root = tmp_path / "root"
    old_umask = os.umask(0o022)
    try:
        write(host, ("new",), b"x")
        assert stat.S_IMODE((root / "new").stat().st_mode) == 0o644
        os.umask(0o077)
        write(host, ("private",), b"x")
        assert stat.S_IMODE((root / "private").stat().st_mode) == 0o600
    finally:
        os.umask(old_umask)
    (root / "script").write_bytes(b"old")
    (root / "script").chmod(0o750)
    write(host, ("script",), b"new")
    assert stat.S_IMODE((root / "script").stat().st_mode) == 0o750
    assert (root / "script").read_bytes() == b"new"


def test_host_temp_file_lives_beside_the_target_until_commit(host: HostBackend, tmp_path: Path) -> None:
    target = tmp_path / "root" / "d"
    with host.atomic_writer(("d", "f")) as out:
        out.write(b"x")
        temps = os.listdir(target)
        assert len(temps) == 1 and temps[0].startswith(".") and temps[0].endswith(TEMP_SUFFIX)
    assert os.listdir(target) == ["f"]


def test_host_fifo_is_refused_without_blocking(host: HostBackend, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "root" / "pipe")
    with pytest.raises(OSError) as refused:
        host.open_read(("pipe",))
    assert refused.value.errno == errno.EINVAL
    assert host.info(("pipe",)).kind == "other"  # type: ignore[union-attr]


def test_host_entry_info_matches_lstat(host: HostBackend, tmp_path: Path) -> None:
    write(host, ("f",), b"12345")
    st = os.lstat(tmp_path / "root" / "f")
    assert host.info(("f",)) == EntryInfo(
        "file", 5, st.st_mtime_ns, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    )


def test_host_backend_needs_an_existing_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        HostBackend(tmp_path / "missing")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        HostBackend(tmp_path / "file")
