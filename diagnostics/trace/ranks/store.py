"""Ranks' summaries kept on disk, so reopening a job of many ranks reads a small file per rank.

    summaries = SummaryStore(root)             # root: <data folder>/trace_cache/rank_summaries
    s = summaries.get(path, "summary")         # None: not kept, or the file changed since
    summaries.put(path, "summary", s)

Keyed like the parsed-trace cache (diagnostics.trace.cache.stamp and cache_key: the file's resolved
path, size and mtime in ns) plus the task and its options and SUMMARY_VERSION, so a changed, touched
or moved file is a miss. A summary is JSON (orjson: numpy arrays and numbers as they are), written
to a temporary file and renamed into place; one that cannot be read is removed and recomputed. The
folder is bounded like the trace cache (least recently used first, at MAX_BYTES).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import orjson

from diagnostics.trace.cache import cache_key, stamp
from diagnostics.trace.errors import TraceError
from diagnostics.trace.ranks.summary import SUMMARY_VERSION

#: The summaries' folder holds at most this many bytes (least recently used removed first).
MAX_BYTES = 512 << 20


class SummaryStore:
    def __init__(self, root: str | Path | None, max_bytes: int = MAX_BYTES):
        self.root = Path(root) if root is not None else None
        self.max_bytes = max_bytes
        self.hits = self.misses = 0

    def _file(self, path: str, task: str, options: dict | None) -> tuple[Path, dict] | None:
        if self.root is None:
            return None
        try:
            st = stamp(path)
        except (OSError, TraceError):  # gone, or not a file: no kept summary
            return None
        key = cache_key(st, {"task": task, "options": options or {}, "summary_version": SUMMARY_VERSION})
        return self.root / f"{key}.json", st

    def get(self, path: str, task: str, options: dict | None = None) -> dict | None:
        found = self._file(path, task, options)
        if found is None:
            return None
        f, st = found
        try:
            doc = orjson.loads(f.read_bytes())
        except FileNotFoundError:
            self.misses += 1
            return None
        except (OSError, orjson.JSONDecodeError):
            _unlink(f)
            self.misses += 1
            return None
        if not isinstance(doc, dict) or doc.get("stamp") != st or "value" not in doc:
            _unlink(f)
            self.misses += 1
            return None
        try:
            os.utime(f)  # last use, for the LRU order
        except OSError:
            pass
        self.hits += 1
        value = doc["value"]
        if isinstance(value, dict) and "file" in value:
            value["file"] = str(path)  # the path as given this time (a folder reached another way)
        return value

    def put(self, path: str, task: str, value: dict, options: dict | None = None) -> None:
        found = self._file(path, task, options)
        if found is None:
            return
        f, st = found
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = f.with_name(f".tmp-{f.name}-{uuid.uuid4().hex[:8]}")
            tmp.write_bytes(orjson.dumps({"stamp": st, "value": value},
                                         option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS))
            os.replace(tmp, f)
        except (OSError, TypeError):
            return  # a cache that cannot be written costs speed, never the result
        self._evict()

    def _evict(self) -> None:
        try:
            files = [(p.stat().st_mtime, p.stat().st_size, p) for p in self.root.iterdir()
                     if p.suffix == ".json" and not p.name.startswith(".")]
        except OSError:
            return
        total = sum(s for _, s, _ in files)
        for _, size, p in sorted(files):
            if total <= self.max_bytes:
                break
            _unlink(p)
            total -= size


def _unlink(p: Path) -> None:
    try:
        p.unlink()
    except OSError:
        pass
