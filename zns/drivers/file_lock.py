"""One NameServer per KV file: a lock beside it, held while the store is open.

Why: two `zns serve` on one host with the same KV file (the default `~/.zns`, or a copied
unit that kept the path) would each append to the log and each compact it by renaming a
copy of its own entries over the other's, and each rename its state dump (by default
beside the KV file) over the other's. Nothing said so. The KV store now takes an exclusive
`flock` on `<file>.lock` before it reads the file, and another process is refused at once,
in one line naming the holder's pid.

The lock is the kernel's: it goes with the process however it ends (SIGKILL included), so
a stale lock file never blocks a restart; the file stays, holding the last holder's pid.
A child forked from the holder (a worker of the state process) closes its copy at once:
the lock stays the holder's, and is free as soon as the holder is gone, not when its
last worker has noticed. A file system without `flock` refuses the start, saying so.

A store locks the real file: its path with every symlink resolved (`real_file`, once, where
the store is made), so that two names of one file (a symlink to it, or to its directory)
take one lock, and the store's renames replace the file, never a symlink to it. A hard
link is another name this cannot see: two hard links are two paths of their own.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from zns.core.errors import KvFileError

LOCK_SUFFIX = ".lock"


class FileLock:
    """A hold of one file's lock, from `hold` until `release` (or the process's end)."""

    def __init__(self, lock: Path) -> None:
        self.path = lock
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            _drop(self.path)


def real_file(path: Path) -> Path:
    """`path` with every symlink in it resolved (of the file and of its directories, those
    that exist; os.path.realpath, so a symlink loop is left as it is, for the caller's
    checks to refuse): the file a store locks, writes and renames over."""
    return Path(os.path.realpath(path))


# This process's locks: lock file -> [descriptor, holds]. A lock is per process: a second
# store of one file in this process (an in-process test's restart without a close) shares
# it, and the last release closes it.
_held: dict[Path, list[int]] = {}


def hold(path: Path, option: str) -> FileLock:
    """Lock `path` (the file it guards; the lock file is beside it) for this process, or
    raise KvFileError naming the process that holds it; `option` names the setting in the
    message."""
    lock = path.with_name(path.name + LOCK_SUFFIX)
    key = Path(os.path.realpath(lock))
    if (entry := _held.get(key)) is not None:
        entry[1] += 1
        return FileLock(key)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise KvFileError(f"{path}: cannot open its lock file {lock}: {exc.strerror} "
                          f"({option})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _pid_in(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise KvFileError(f"{path} is in use by another zns ({holder}): give each "
                              f"NameServer a file of its own ({option})") from None
        raise KvFileError(f"{path}: cannot lock {lock}: {exc.strerror} ({option})") from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:
        # The pid is only for another process's refusal ("its pid unknown" then): the lock
        # is held. A full disk (a new lock file needs a block for it) must not refuse the
        # start with a traceback, nor leave this descriptor open and locked outside
        # `_held`, where this process's next `hold` would find its own lock "in use".
        pass
    _held[key] = [fd, 1]
    return FileLock(key)


def _drop(key: Path) -> None:
    entry = _held.get(key)
    if entry is None:  # closed in a forked child
        return
    entry[1] -= 1
    if entry[1] == 0:
        del _held[key]
        os.close(entry[0])  # the lock goes with the last descriptor of its open file


def _pid_in(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        pid = ""
    return f"pid {pid}" if pid.isdigit() else "its pid unknown"


def _close_in_child() -> None:
    for fd, _ in _held.values():
        os.close(fd)  # the parent's descriptor still holds the lock
    _held.clear()


os.register_at_fork(after_in_child=_close_in_child)
