"""Parsed traces kept on disk, so a second open of an unchanged trace reads columns instead of JSON.

    trace, hit = cached_load(path, root)      # root: e.g. <data dir>/trace_cache

An entry is one folder named by a key over the file's resolved path, size and mtime (ns), the
ingest options and CACHE_VERSION: a changed, touched or moved file is a miss. It holds the events
as Arrow/Feather (events.feather) and the rest of the Trace as JSON (trace_meta.json, with the
file's stamp written into it and checked on reading). No pickle: a planted entry can hold wrong
numbers, never code. A trace run keeps its columns in its own folder with the same writer and reader
(write_columns / read_columns): one form, checked wherever it is read back.

Writers build an entry in a temporary folder beside the cache and rename it into place, so a
reader never sees half an entry and two writers of the same key do not mix their files (the
second rename fails or replaces a whole entry with a whole entry). An entry that cannot be read
(corrupt, partial, another version) is removed and rebuilt. The cache holds at most max_bytes
(MAX_BYTES, or $TORCHSCOPE_TRACE_CACHE_MB); the least recently used entries go first.

Beside the columns an entry keeps the **analyses' results** (keep_result / kept_result): one JSON per
result key (the job's options, the stamps of every other file it read, and CODE_VERSION, a hash of
the trace layer's and the trace analysis' source), and the files the result names (renamed into the
entry as ``result-<key>.<name>``). A second open of an unchanged trace with the same options reads
that JSON instead of running the analyses again; any change of a file, an option or the code is a
miss. Results go with their entry when it is evicted.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import threading
import time
import uuid
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from diagnostics.errors import TorchScopeError
from diagnostics.settings import env_number
from diagnostics.trace.errors import TraceError
from diagnostics.trace.schema import CACHE_ENTRY, CACHE_PENDING, COLUMNS

if TYPE_CHECKING:
    import pandas as pd

    from diagnostics.trace.model import Trace

# numpy (the model), pandas, pyarrow and the ingest are imported where a trace is read or written, not with this module:
# a reopen (analyses/trace/stored.py: find and link a stored result) needs none of them (issue #42).

#: Bumped whenever the columns, their types or the Trace fields change: older entries are misses.
CACHE_VERSION = 3   # 2: device and stream int64 (real files hold a uint32 -1 stream), fwd_tid int64;
#                     3: events past a physical bound (a negative or endless duration, a far timestamp) skipped
#: Total bytes the cache may hold (all entries); least recently used entries are evicted past it.
MAX_BYTES = 4 << 30
MAX_BYTES_ENV = "TORCHSCOPE_TRACE_CACHE_MB"
#: A temporary folder this old is a writer that died; it is removed by the next writer.
STALE_TMP_S = 3600
EVENTS_FILE = "events.feather"
META_FILE = "trace_meta.json"
ENTRY = CACHE_ENTRY  # Trace._cache key: the entry folder a trace was read from or kept in
RESULT_PREFIX = "result-"
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"


def max_bytes() -> int:
    """MAX_BYTES, or $TORCHSCOPE_TRACE_CACHE_MB megabytes (0: no cache), read by the one environment-number
    parser (settings.env_number); a malformed, negative or endless value is a TraceError naming it."""
    try:
        mb = env_number(MAX_BYTES_ENV, MAX_BYTES / 2**20, zero_ok=True)
    except TorchScopeError as e:  # a TraceError: the trace layer's callers name a rank or a file that fails by it
        raise TraceError(str(e)) from None
    if not math.isfinite(mb):
        raise TraceError(f"the environment variable {MAX_BYTES_ENV}={os.environ[MAX_BYTES_ENV].strip()!r} "
                         "must be a finite number of megabytes")
    return int(mb * 2**20)


def stamp(path: str | Path) -> dict:
    """What identifies a file's content cheaply, the one stamp of a trace file (cache keys, a run's
    options): resolved path, size, mtime in nanoseconds (a rewrite within the same second counts).
    A path that is not a file is a TraceError naming it."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"trace file not found: {path}")
    p = p.resolve()
    st = p.stat()
    return {"path": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def cache_key(file_stamp: dict, options: dict) -> str:
    """The entry name for a file stamp and the ingest options that shape the columns."""
    blob = json.dumps({"version": CACHE_VERSION, "stamp": file_stamp, "options": options}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def cached_load(path: str | Path, root: str | Path | None, *, allow_truncated: bool = False,
                limit: int | None = None, defer_write: bool = False,
                split: bool = False) -> tuple[Trace, bool]:
    """load_trace(path) through the cache in ``root``: (trace, True) when it was read from the cache.

    root None, or a limit of 0 bytes: no cache (plain load_trace). A cache that cannot be written
    (disk full, read-only) costs the speed-up only; the trace is still returned. ``defer_write``: a trace
    read from the file is kept in the cache only when finish_write(trace) is called (the trace job calls it
    after its first answer, the Summary: writing needs pandas and pyarrow, issue #42). ``split``: as
    load_trace's (two processes on one big trace).
    """
    from diagnostics.trace.ingest import load_trace

    limit = max_bytes() if limit is None else limit
    if root is None or limit <= 0:
        return load_trace(path, allow_truncated=allow_truncated, split=split), False
    root = Path(root)
    file_stamp = stamp(path)
    key = cache_key(file_stamp, {"allow_truncated": bool(allow_truncated)})
    trace = read_entry(root / key, file_stamp)
    if trace is not None:
        trace.source = str(path)
        trace._cache[ENTRY] = root / key
        return trace, True
    trace = load_trace(path, allow_truncated=allow_truncated, split=split)
    if stamp(path) == file_stamp:  # not rewritten while it was being read
        trace._cache[_PENDING] = (root, key, file_stamp, limit)
        if not defer_write:
            finish_write(trace)
    return trace, False


_PENDING = CACHE_PENDING   # Trace._cache key: the entry cached_load(defer_write=True) has yet to write


def finish_write(trace: Trace) -> None:
    """Keep ``trace`` in the cache as cached_load(defer_write=True) would have (nothing when it came from
    the cache, was already kept, or the file changed while it was read)."""
    pending = trace._cache.pop(_PENDING, None)
    if pending is None:
        return
    root, key, file_stamp, limit = pending
    folder = write_entry(root, key, trace, file_stamp, limit)
    if folder is not None:
        trace._cache[ENTRY] = folder


def finish_write_beside(trace: Trace):
    """finish_write(trace) in a thread, beside the caller's next work (Arrow's conversion and write run
    mostly outside the GIL, on the core the parse's helper used); returns ``wait``, to call before the entry
    is read (write_columns links it) and before the result is returned. ``wait`` re-raises what the write
    raised (write_entry itself turns a cache that cannot be written into no entry). The DataFrame the entry
    is made from is made here, in the caller's thread: the views after it read the same one."""
    if trace._cache.get(_PENDING) is None:
        return lambda: None
    trace.events   # noqa: B018 - made here, not in the thread
    box: dict = {}

    def run():
        try:
            finish_write(trace)
        except BaseException as exc:  # noqa: BLE001 - handed to wait()
            box["error"] = exc

    thread = threading.Thread(target=run, name="trace-cache-write", daemon=True)
    thread.start()

    def wait() -> None:
        thread.join()
        if "error" in box:
            raise box.pop("error")

    return wait


def entry_folder(path: str | Path, root: str | Path, *, allow_truncated: bool = False) -> Path:
    """The entry folder cached_load uses for ``path`` (it may not exist)."""
    return Path(root) / cache_key(stamp(path), {"allow_truncated": bool(allow_truncated)})


_CODE_VERSION: list = []


def code_version() -> str:
    """A hash of the source the stored results come from (diagnostics/trace and
    diagnostics/analyses/trace): a change of either makes every stored result a miss."""
    if not _CODE_VERSION:
        here = Path(__file__).resolve().parent
        h = hashlib.sha256(str(CACHE_VERSION).encode())
        for folder in (here, here.parent / "analyses" / "trace"):
            for f in sorted(folder.rglob("*.py")):
                h.update(f.relative_to(folder).as_posix().encode())
                h.update(f.read_bytes())
        _CODE_VERSION.append(h.hexdigest()[:16])
    return _CODE_VERSION[0]


def result_key(options: dict) -> str:
    """A stored result's key: the job's options (with the stamps of the other files it read) and the code."""
    blob = json.dumps({"code": code_version(), "options": options}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def kept_result(folder: Path, key: str) -> tuple[dict, dict] | None:
    """(result, {name: path of a file it keeps}) stored under ``key`` in the entry ``folder``, or None.
    A result that cannot be read is removed (a miss)."""
    f = Path(folder) / f"{RESULT_PREFIX}{key}.json"
    try:
        doc = orjson.loads(f.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError):
        _unlink(f)
        return None
    files = {n: Path(folder) / f"{RESULT_PREFIX}{key}.{n}" for n in doc.get("files", [])}
    if not isinstance(doc.get("result"), dict) or not all(p.is_file() for p in files.values()):
        _unlink(f)
        return None
    _touch(Path(folder))
    return doc["result"], files


def keep_result(trace: Trace, key: str, result: dict, files: dict | None = None, limit: int | None = None) -> bool:
    """Store ``result`` (and the files it names: {name: path}, linked or copied) in the entry ``trace``
    was read from or kept in; False when there is none or it cannot be written (a cache that cannot
    be written costs speed, never the result)."""
    folder = trace._cache.get(ENTRY)
    if folder is None or not Path(folder).is_dir():
        return False
    folder = Path(folder)
    names = []
    try:
        for name, src in (files or {}).items():
            dest = folder / f"{RESULT_PREFIX}{key}.{name}"
            tmp = dest.with_name(f"{_TMP_PREFIX}{dest.name}-{uuid.uuid4().hex[:8]}")
            try:
                os.link(src, tmp)
            except OSError:
                shutil.copyfile(src, tmp)
            os.replace(tmp, dest)
            names.append(name)
        body = orjson.dumps({"result": result, "files": names},
                            option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
        dest = folder / f"{RESULT_PREFIX}{key}.json"
        tmp = dest.with_name(f"{_TMP_PREFIX}{dest.name}-{uuid.uuid4().hex[:8]}")
        tmp.write_bytes(body)
        os.replace(tmp, dest)
    except (OSError, TypeError):
        return False
    evict(folder.parent, max_bytes() if limit is None else limit, keep=folder)
    return True


def link_events(trace: Trace, dest: Path) -> bool:
    """Hard-link the events file of the entry ``trace`` came from (or was kept in) to ``dest``:
    the same columns kept beside a run without writing them again. False when it cannot be done
    (no entry, evicted meanwhile, another file system); then the caller writes them. The entry's
    file is never written again (a new entry is a new folder), so the link stays valid after an
    eviction."""
    folder = trace._cache.get(ENTRY)
    return folder is not None and link_file(Path(folder) / EVENTS_FILE, dest)


def link_file(src: Path, dest: Path) -> bool:
    """Hard-link ``src`` (a file of an entry: never written again) to ``dest``; False when it cannot."""
    dest = Path(dest)
    tmp = dest.with_name(f"{_TMP_PREFIX}{dest.name}-{uuid.uuid4().hex[:8]}")
    try:
        os.link(src, tmp)
        os.replace(tmp, dest)  # a file already there is replaced, never written through the link
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
        return False
    return True


def write_columns(trace: Trace, folder: str | Path, file_stamp: dict | None) -> None:
    """Keep ``trace`` in ``folder`` as an entry holds it, for read_columns: EVENTS_FILE (Arrow/Feather,
    hard-linked from the entry the trace came from or was kept in when it can: the same bytes) and
    META_FILE (the other Trace fields, CACHE_VERSION, the trace file's stamp and the event count).
    The cache's entries and a trace run's kept columns (its folder) alike; OSError when it cannot write."""
    folder = Path(folder)
    if not link_events(trace, folder / EVENTS_FILE):
        import pyarrow as pa
        import pyarrow.feather as feather

        table = pa.Table.from_pandas(trace.events.reset_index(drop=True), preserve_index=False)
        feather.write_feather(table, folder / EVENTS_FILE, compression="uncompressed")
    from diagnostics.trace.model import Trace

    meta = {f.name: getattr(trace, f.name) for f in fields(Trace) if f.name not in Trace.EVENT_FIELDS}
    meta.update(cache_version=CACHE_VERSION, stamp=file_stamp, n_events=len(trace.events))
    (folder / META_FILE).write_text(json.dumps(meta, default=str))


def columns_kept(folder: str | Path) -> bool:
    """Whether ``folder`` holds both files write_columns keeps (it may still fail read_columns' checks)."""
    return (Path(folder) / EVENTS_FILE).is_file() and (Path(folder) / META_FILE).is_file()


def read_columns(folder: str | Path, file_stamp: dict | None = None) -> Trace:
    """The Trace write_columns kept in ``folder``, checked: this CACHE_VERSION, the columns of
    model.COLUMNS, as many events as were kept, and with ``file_stamp`` (an entry) that file's stamp.
    Columns a trace run kept before they were written with a version (no cache_version, no stamp: a
    stored run from before) are read when their columns match. Anything else is a TraceError naming
    the folder and what does not match. Our own files: Arrow and JSON, never a pickle."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / META_FILE).read_text())
        version, kept_stamp = meta.pop("cache_version", None), meta.pop("stamp", None)
        n_events = meta.pop("n_events", None)
        if version != CACHE_VERSION and (version is not None or file_stamp is not None):
            raise TraceError(f"the parsed trace in {folder} was kept by another version ({version}, "
                             f"this one reads {CACHE_VERSION}); open the trace again")
        if file_stamp is not None and kept_stamp != file_stamp:
            raise TraceError(f"the parsed trace in {folder} was kept for another file or an older copy of it")
        import pyarrow.feather as feather

        table = feather.read_table(folder / EVENTS_FILE, memory_map=False)
        if tuple(table.column_names) != COLUMNS or (n_events is not None and table.num_rows != n_events):
            raise TraceError(f"the parsed trace in {folder} does not hold the columns and events it was kept "
                             "with; open the trace again")
        return _trace_of_table(table, meta)
    except TraceError:
        raise
    except Exception as e:  # noqa: BLE001 - a file missing, partial, not JSON or not Arrow: said, never a crash
        raise TraceError(f"the parsed trace in {folder} cannot be read ({type(e).__name__}: {e}); "
                         "open the trace again") from None


def read_entry(folder: Path, file_stamp: dict) -> Trace | None:
    """The Trace kept in ``folder``, or None when there is none. One that cannot be read (corrupt,
    partial, another version, another file's: read_columns) is removed, so the caller rebuilds it."""
    if not folder.is_dir():
        return None
    try:
        trace = read_columns(folder, file_stamp)
    except TraceError:  # any unreadable entry is a miss, never an error
        _remove(folder)
        return None
    _touch(folder)
    return trace


def write_entry(root: Path, key: str, trace: Trace, file_stamp: dict, limit: int) -> Path | None:
    """Keep ``trace`` as entry ``key`` (built aside, renamed into place), then evict down to
    ``limit`` bytes. Returns the entry folder, or None when it was not kept."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f"{_TMP_PREFIX}{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
    except OSError:
        return None
    try:
        write_columns(trace, tmp, file_stamp)
        if _size(tmp) > limit:  # bigger than the whole cache: not kept
            _remove(tmp)
            return None
        final = root / key
        try:
            os.rename(tmp, final)
        except OSError:  # another writer's entry is there: a whole one (renamed in), or one to replace
            if _complete(final, file_stamp):
                _remove(tmp)
            else:
                _remove(final)
                os.rename(tmp, final)
    except Exception:  # noqa: BLE001 - a cache that cannot be written costs speed, not the result
        _remove(tmp)
        return None
    evict(root, limit, keep=final)
    return final


def entries(root: Path) -> list[tuple[float, int, Path]]:
    """(last used, bytes, folder) of each complete entry, least recently used first."""
    out = []
    try:
        listing = list(Path(root).iterdir())
    except OSError:
        return []
    for p in listing:
        if p.name.startswith(".") or not p.is_dir():
            continue
        try:
            out.append((p.stat().st_mtime, _size(p), p))
        except OSError:  # removed meanwhile
            continue
    return sorted(out, key=lambda e: e[0])


def total_bytes(root: Path) -> int:
    return sum(size for _, size, _ in entries(root))


def evict(root: Path, limit: int, keep: Path | None = None) -> None:
    """Remove least recently used entries until the cache holds at most ``limit`` bytes, and
    temporary folders left by writers that died."""
    now = time.time()
    try:
        for p in Path(root).iterdir():
            if p.name.startswith((_TMP_PREFIX, _TRASH_PREFIX)) and now - p.stat().st_mtime > STALE_TMP_S:
                shutil.rmtree(p, ignore_errors=True)
    except OSError:
        pass
    listed = entries(root)
    total = sum(size for _, size, _ in listed)
    for _, size, p in listed:
        if total <= limit:
            break
        if keep is not None and p == keep:
            continue
        _remove(p)
        total -= size


def _trace_of_table(table, meta: dict) -> Trace:
    """The Trace of an entry's Arrow table, straight into its numpy columns (no pandas: the Summary is the
    first answer of a reopen with other options too, issue #42): each string column's dictionary indices as
    its codes (null: -1) and its dictionary as its strings, each other column copied out of its buffer (null,
    a float column's NaN as Arrow keeps it: NaN). Anything else: the DataFrame's way, as before."""
    import numpy as np

    from diagnostics.trace.model import STRING_COLUMNS, Trace

    columns, tables = {}, {}
    for col in COLUMNS:
        chunked = table.column(col)
        arr = chunked.combine_chunks() if chunked.num_chunks != 1 else chunked.chunk(0)
        if col in STRING_COLUMNS:
            got = _numpy_of(arr, str(arr.type.index_type), -1) if hasattr(arr, "dictionary") else None
            if got is not None:
                tables[col] = np.array([str(c) for c in arr.dictionary.to_pylist()], dtype=object)
        else:
            got = _numpy_of(arr, str(arr.type), np.nan)
        if got is None:
            return Trace.from_frame(_object_categories(table.to_pandas()), **meta)
        columns[col] = got
    return Trace(columns=columns, tables=tables, **meta)


#: Arrow's primitive types as numpy's (the columns an entry holds).
_NUMPY_OF_ARROW = {"int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64", "uint8": "uint8",
                   "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "float": "float32", "double": "float64"}


def _numpy_of(arr, type_name: str, fill):
    """The values of a primitive Arrow array (or a dictionary array's indices, ``type_name`` their type) as a
    writable numpy array read from its buffers, nulls set to ``fill`` (an integer array's NaN: none, None
    returned); None for any type not in _NUMPY_OF_ARROW. (pyarrow's to_numpy and its compute module import
    pandas.)"""
    import numpy as np

    dtype = _NUMPY_OF_ARROW.get(type_name)
    if dtype is None:
        return None
    dtype = np.dtype(dtype)
    n = len(arr)
    validity, data = arr.buffers()[:2]
    if data is None:
        return np.empty(0, dtype) if n == 0 else None
    values = np.frombuffer(data, dtype=dtype, count=n, offset=arr.offset * dtype.itemsize).copy()
    if arr.null_count:
        if validity is None or (dtype.kind != "f" and not isinstance(fill, int)):
            return None
        bits = np.unpackbits(np.frombuffer(validity, np.uint8), bitorder="little")[arr.offset:arr.offset + n]
        values[bits == 0] = fill
    return values


def _object_categories(events: pd.DataFrame) -> pd.DataFrame:
    """Arrow gives string categories back as pandas' str dtype; load_trace makes object ones."""
    import pandas as pd

    for col in events.columns:
        s = events[col]
        if isinstance(s.dtype, pd.CategoricalDtype) and s.cat.categories.dtype != object:
            events[col] = pd.Categorical.from_codes(
                s.cat.codes.to_numpy(), categories=pd.Index(s.cat.categories.astype(object), dtype=object),
                validate=False)
    return events


def _complete(folder: Path, file_stamp: dict) -> bool:
    """Whether ``folder`` looks like a whole entry for this stamp (its meta read, its events there)."""
    try:
        meta = json.loads((folder / META_FILE).read_text())
        return (meta.get("cache_version") == CACHE_VERSION and meta.get("stamp") == file_stamp
                and (folder / EVENTS_FILE).stat().st_size > 0)
    except (OSError, ValueError):
        return False


def _unlink(p: Path) -> None:
    try:
        p.unlink()
    except OSError:
        pass


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def _touch(folder: Path) -> None:
    try:
        os.utime(folder)  # the folder's mtime is its last use (LRU order)
    except OSError:
        pass


def _remove(folder: Path) -> None:
    """Take a folder out of the cache at once (renamed aside), then delete it."""
    trash = folder.with_name(f"{_TRASH_PREFIX}{folder.name}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(folder, trash)
    except OSError:
        return  # gone already (another process removed or replaced it)
    shutil.rmtree(trash, ignore_errors=True)
