"""Removing a folder a sandbox wrote in: however deep, whatever its modes, following no link.

`shutil.rmtree` recurses once per level (Python 3.11): a sandbox that nests a thousand
folders makes it raise `RecursionError`, which `ignore_errors` does not catch, and the
folder stays. Here every folder met is first moved up to the top (a rename within the tree),
so the walk is never more than two levels deep and holds two descriptors, and a folder a
sandbox made unreadable is given its owner's bits back first. Called once no process of the
sandbox is left to change the tree under it.
"""

from __future__ import annotations

import os
import secrets
import stat

__all__ = ["remove_tree"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: str) -> bool:
    """Remove `path` and all under it; True if it is gone. A link given as `path` is not
    followed (nor removed); nothing raises."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            _owner_bits(None, path)
        top = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        moved: set[str] = set()  # the names this removal gave folders at the top
        pending: list[str | None] = [None]  # None: the top itself; else a folder moved up
        while pending:
            name = pending.pop()
            _empty(top, name, pending, moved)
            if name is not None:
                _quietly(os.rmdir, name, dir_fd=top)
    finally:
        os.close(top)
    _quietly(os.rmdir, path)
    return not os.path.lexists(path)


def _empty(top: int, name: str | None, pending: list[str | None], moved: set[str]) -> None:
    """Unlink what is not a folder in `name` (a folder at the top), move its folders up;
    an entry that cannot be listed, moved or unlinked is left, the rest goes on."""
    try:
        folder = top if name is None else os.open(name, _DIR_FLAGS, dir_fd=top)
    except OSError:
        return
    try:
        while True:
            try:
                with os.scandir(folder) as entries:
                    listed = [(e.name, _is_folder(e)) for e in entries]
            except OSError:
                return
            again = False
            for entry, is_dir in listed:
                if not is_dir:
                    _quietly(os.unlink, entry, dir_fd=folder)
                elif name is None and entry in moved:
                    continue  # already pending
                else:
                    _owner_bits(folder, entry)
                    target = f".removing-{secrets.token_hex(8)}"
                    if _quietly(os.rename, entry, target, src_dir_fd=folder,
                                dst_dir_fd=top):
                        moved.add(target)
                        pending.append(target)
                        again = True
            if not again:
                return
    finally:
        if folder != top:
            os.close(folder)


def _is_folder(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _owner_bits(folder: int | None, entry: str) -> None:
    """Owner's rwx on a folder (a sandbox may have taken them away), through a descriptor
    that names the folder itself: a link put in its place meanwhile is never followed."""
    try:
        held = os.open(entry, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC,
                       dir_fd=folder if folder is not None else None)
    except OSError:
        return
    try:
        os.chmod(f"/proc/self/fd/{held}", 0o700)
    except OSError:
        pass
    finally:
        os.close(held)


def _quietly(call, *args, **kwargs) -> bool:  # type: ignore[no-untyped-def]
    try:
        call(*args, **kwargs)
    except OSError:
        return False
    return True
