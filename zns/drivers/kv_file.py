"""The KV store of §6: namespaces of string keys and values, durable in one file.

A put or delete returns only after the new file is on disk: it is written to a
temporary file, fsynced, the current file is kept as `<path>.bak`, and the new
one is renamed into place (then the directory is fsynced). At every instant a
complete file exists at `path`, so a crash at any point loses nothing that was
acknowledged. A file that cannot be read at start is an error, never silently
replaced.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from zns.core.errors import KvFileError

_FileFormat = dict[str, dict[str, str]]


class KvStore:
    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        """`path` None keeps the store in memory only (for tests and tools)."""
        self.path = Path(path).expanduser() if path is not None else None
        self._data: _FileFormat = self._load() if self.path is not None else {}

    def get(self, namespace: str, key: str) -> str | None:
        return self._data.get(namespace, {}).get(key)

    def list(self, namespace: str) -> dict[str, str]:
        return dict(self._data.get(namespace, {}))

    def count(self, namespace: str | None = None) -> int:
        """Entries in `namespace`, or with None the number of namespaces."""
        return len(self._data) if namespace is None else len(self._data.get(namespace, {}))

    def put(self, namespace: str, key: str, value: str) -> bool:
        """Store durably; False when the value was already there (nothing written)."""
        entries = self._data.setdefault(namespace, {})
        if entries.get(key) == value:
            return False
        old = entries.get(key)
        entries[key] = value
        try:
            self._persist()
        except BaseException:
            if old is None:
                del entries[key]
                if not entries:
                    del self._data[namespace]
            else:
                entries[key] = old
            raise
        return True

    def delete(self, namespace: str, key: str) -> bool:
        entries = self._data.get(namespace)
        if not entries or key not in entries:
            return False
        old = entries.pop(key)
        if not entries:
            del self._data[namespace]
        try:
            self._persist()
        except BaseException:
            self._data.setdefault(namespace, {})[key] = old
            raise
        return True

    def _load(self) -> _FileFormat:
        assert self.path is not None
        backup = self.path.with_name(self.path.name + ".bak")
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            if backup.exists():
                raise KvFileError(
                    f"KV file {self.path} is missing but {backup} exists; "
                    f"rename the backup into place to keep its entries, or delete it to start empty"
                ) from None
            return {}
        except OSError as exc:
            raise KvFileError(f"cannot read KV file {self.path}: {exc}") from exc
        try:
            return msgspec.json.decode(raw, type=_FileFormat)
        except msgspec.DecodeError as exc:
            hint = f"; the previous version is {backup}" if backup.exists() else ""
            raise KvFileError(
                f"KV file {self.path} is corrupt ({exc}){hint}. zns will not start over it: "
                f"repair it, restore the backup, or move it away to start empty"
            ) from exc

    def _persist(self) -> None:
        if self.path is None:  # an in-memory store: nothing to make durable
            return
        path = self.path
        created = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
        path.parent.mkdir(parents=True, exist_ok=True)
        for directory in reversed(created):  # a new directory is durable once its parent is
            _fsync_dir(directory.parent)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(msgspec.json.encode(self._data))
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            # A hard link keeps `path` in place while the backup is refreshed.
            bak_tmp = path.with_name(path.name + ".bak.tmp")
            bak_tmp.unlink(missing_ok=True)
            os.link(path, bak_tmp)
            os.replace(bak_tmp, path.with_name(path.name + ".bak"))
        os.replace(tmp, path)
        _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
