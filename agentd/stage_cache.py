"""The stager's on-disk cache: its entries, their LRU order, the pins and the index file.

Layout under the cache directory:

    data/<name>/<item>   one entry; <name> is a hash of the input's key (never the user's
                         path, so a URL cannot steer a write), <item> the input's base name,
                         a file or a directory tree
    tmp/                 transfers in progress and entries being deleted; emptied at start
    index.json           entries (key, size, last use) and pins, replaced atomically

An entry appears in `data/` only by one rename of a finished, fsynced directory, so a
crash never leaves a partial entry that looks complete. Sizes are apparent sizes (the sum
of the regular files' lengths), not disk blocks.

`load`, `write_index` and `delete_trees` block: call them in a thread.
Everything else is bookkeeping for the event loop's thread; the renames it does are single
metadata operations.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

INDEX_VERSION = 1


@dataclass
class Entry:
    key: str
    name: str  # the directory under data/
    item: str  # the file or directory inside it
    size: int
    used: int  # LRU clock at the last use: higher is more recent
    source: str  # where it came from: a later version of the same source supersedes it


class CacheFull(Exception):
    """No room: what is left is pinned by running jobs or held by other transfers."""


@dataclass(frozen=True)
class LoadReport:
    entries: int
    dropped: int  # listed in the index but missing or damaged on disk
    leftovers: int  # temp files and unlisted directories deleted


def is_plain_name(name: str) -> bool:
    """One path component that stays where it is put."""
    return name not in ("", ".", "..") and "/" not in name and "\0" not in name


def entry_name(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


class StageCache:
    def __init__(self, root: Path, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.root = root
        self.data_dir = root / "data"
        self.tmp_dir = root / "tmp"
        self.index_path = root / "index.json"
        self.max_bytes = max_bytes
        self.entries: dict[str, Entry] = {}
        self.pins: dict[str, set[str]] = {}  # job key -> keys of the entries it uses
        self.used_bytes = 0
        self.reserved_bytes = 0  # promised to transfers in progress
        self._clock = 0

    # -- start (blocking) --

    def load(self) -> LoadReport:
        """Reads the index, drops what is not on disk, deletes leftovers of a crash."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        leftovers = list(self.tmp_dir.iterdir())
        dropped = 0
        for raw in self._read_index_entries():
            entry = Entry(**raw)
            if self._intact(entry):
                self.entries[entry.key] = entry
            else:
                dropped += 1
        for job in list(self.pins):
            self.pins[job] &= self.entries.keys()
            if not self.pins[job]:
                del self.pins[job]
        self.used_bytes = sum(e.size for e in self.entries.values())
        self._clock = max((e.used for e in self.entries.values()), default=0)
        leftovers += self._shrink()  # the configured size may be smaller than last time
        names = {e.name for e in self.entries.values()}
        # A directory not in the index was renamed in just before a crash, or its
        # removal was: its key is unknown, so it cannot be found again.
        leftovers += [p for p in self.data_dir.iterdir() if p.name not in names]
        self.delete_trees(leftovers)
        return LoadReport(len(self.entries), dropped, len(leftovers))

    def _read_index_entries(self) -> list[dict[str, Any]]:
        try:
            doc = json.loads(self.index_path.read_bytes())
        except FileNotFoundError:
            return []
        except (OSError, ValueError):
            return []  # unreadable: start empty, the directories are deleted as unlisted
        if not isinstance(doc, dict) or doc.get("version") != INDEX_VERSION:
            return []
        for job, keys in doc.get("pins", {}).items():
            self.pins[str(job)] = {str(k) for k in keys}
        return [e for e in doc.get("entries", []) if _well_formed(e)]

    def _intact(self, entry: Entry) -> bool:
        if entry.name != entry_name(entry.key) or not is_plain_name(entry.item):
            return False
        try:
            st = (self.data_dir / entry.name / entry.item).lstat()
        except OSError:
            return False
        # A file's length is cheap to check; a tree's would mean walking it.
        return not stat.S_ISREG(st.st_mode) or st.st_size == entry.size

    def _shrink(self) -> list[Path]:
        pinned = self.pinned_keys()
        trash: list[Path] = []
        for entry in sorted(self.entries.values(), key=lambda e: e.used):
            if self.used_bytes <= self.max_bytes:
                break
            if entry.key not in pinned:
                trash += self._remove(entry)
        return trash

    # -- lookups and LRU --

    def get(self, key: str) -> Entry | None:
        return self.entries.get(key)

    def path(self, entry: Entry) -> Path:
        return self.data_dir / entry.name / entry.item

    def touch(self, key: str) -> None:
        entry = self.entries.get(key)
        if entry is not None:
            self._clock += 1
            entry.used = self._clock

    # -- pins --

    def pin(self, job: str, key: str) -> None:
        self.pins.setdefault(job, set()).add(key)

    def unpin(self, job: str) -> set[str]:
        """Forgets the job's pins; its entries count as used now."""
        keys = self.pins.pop(job, set())
        for key in sorted(keys):
            self.touch(key)
        return keys

    def pinned_keys(self) -> set[str]:
        return set().union(*self.pins.values())

    def pinned_bytes(self) -> int:
        return sum(self.entries[k].size for k in self.pinned_keys() if k in self.entries)

    # -- room --

    def reserve(self, n: int) -> list[Path]:
        """Promises n bytes to a transfer, evicting unpinned entries, least recently used
        first. Returns the evicted directories, to delete with `delete_trees`."""
        excess = self.used_bytes + self.reserved_bytes + n - self.max_bytes
        trash: list[Path] = []
        if excess > 0:
            pinned = self.pinned_keys()
            candidates = sorted(
                (e for e in self.entries.values() if e.key not in pinned), key=lambda e: e.used
            )
            if sum(e.size for e in candidates) < excess:
                raise CacheFull(self._full_reason(n))
            for entry in candidates:
                if excess <= 0:
                    break
                excess -= entry.size
                trash += self._remove(entry)
        self.reserved_bytes += n
        return trash

    def _full_reason(self, n: int) -> str:
        return (
            f"cache full: {n} bytes needed, {self.pinned_bytes()} bytes in use by jobs and "
            f"{self.reserved_bytes} bytes held by other transfers (cache size {self.max_bytes})"
        )

    def unreserve(self, n: int) -> None:
        self.reserved_bytes -= n

    def _remove(self, entry: Entry) -> list[Path]:
        del self.entries[entry.key]
        self.used_bytes -= entry.size
        return self._to_trash(self.data_dir / entry.name)

    def _to_trash(self, path: Path) -> list[Path]:
        # Renamed out of data/ at once, so the same name can be filled again before the
        # (slow) deletion of the old tree is over.
        trash = self.tmp_dir / f"deleted-{path.name}-{secrets.token_hex(4)}"
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            return []
        return [trash]

    def commit(self, key: str, staged: Path, item: str, size: int, source: str) -> list[Path]:
        """Renames a finished temp directory into place as the entry for `key`; unpinned
        entries of an older version of the same source go. Returns what to delete."""
        name = entry_name(key)
        trash = self._to_trash(self.data_dir / name)
        os.rename(staged, self.data_dir / name)
        stale = [e for e in self.entries.values() if e.source == source and e.key != key]
        pinned = self.pinned_keys()
        for old in stale:
            if old.key not in pinned:
                trash += self._remove(old)
        self.entries[key] = Entry(key, name, item, size, 0, source)
        self.used_bytes += size
        self.touch(key)
        return trash

    # -- files (blocking) --

    def temp_dir(self, key: str) -> Path:
        """A new name in tmp/ to build an entry in."""
        return self.tmp_dir / f"{entry_name(key)}.{secrets.token_hex(4)}.part"

    def index_bytes(self) -> bytes:
        pins = {job: sorted(keys) for job, keys in self.pins.items() if keys}
        entries = [asdict(e) for e in self.entries.values()]
        return json.dumps({"version": INDEX_VERSION, "entries": entries, "pins": pins}).encode()

    def write_index(self, data: bytes) -> None:
        tmp = self.root / "index.json.tmp"
        # 0600: a URL may carry a token.
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.index_path)

    @staticmethod
    def delete_trees(paths: list[Path]) -> None:
        for path in paths:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


_ENTRY_FIELDS = {"key": str, "name": str, "item": str, "size": int, "used": int, "source": str}


def _well_formed(raw: Any) -> bool:
    return (
        isinstance(raw, dict)
        and raw.keys() == _ENTRY_FIELDS.keys()
        and all(isinstance(raw[k], t) for k, t in _ENTRY_FIELDS.items())
    )
