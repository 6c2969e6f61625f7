"""load_trace(path) -> Trace: stream a Chrome/Kineto JSON trace (.json, .json.gz) into columns.

Why it is fast and bounded: the file is read (and gunzipped, in a background thread that runs
beside the parser) in blocks; each block of the traceEvents array is cut at an event boundary and
decoded by msgspec into small typed structs that keep only the fields the analyses use (args
such as "Input Dims" are skipped without building objects); those become numpy columns and are
dropped (see _chunks). A big trace can be read by helper processes beside this one (load_trace's
``split``: their columns come back as checked records, never a pickle). Peak memory is the columns plus a
few blocks.

Bad input raises TraceError (not gzip, not JSON, no traceEvents, truncated, empty); malformed
events are skipped, counted in Trace.skipped_events and described in Trace.warnings.
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Iterator

import numpy as np
import orjson

from diagnostics.trace._chunks import (
    BOUNDARY, DECODE_ERRORS, INT_TYPES, LAUNCH_FIELDS, MAX_WARNINGS, NUMERIC_FIELDS, SKIPPING,
    STRING_FIELDS, Columns, _decode_events, _Interner, consume, consume_block, consume_spans,
    last_boundary, scan,
)
from diagnostics.trace.classify import KNOWN_CATS
from diagnostics.trace.errors import TraceError
from diagnostics.trace.model import COLUMNS, Trace
from diagnostics.trace.pages import small_pages

try:  # ISA-L inflates about 2x faster than zlib; optional.
    from isal import isal_zlib as _zlib
except ImportError:  # pragma: no cover - depends on the environment
    import zlib as _zlib

BLOCK_BYTES = 16 << 20          # decoded bytes handed to the parser at a time
GZ_READ_BYTES = 1 << 20         # compressed bytes read at a time
HEADER_LIMIT_BYTES = 64 << 20   # the traceEvents array must start within this many bytes
GZ_RATIO_GUESS = 8              # decoded / compressed size, to guess a .gz trace's size
# load_trace(split=True): a trace whose events take at least SPLIT_MIN_BYTES (decoded) is read by two
# processes on a machine with two usable cores or more: a helper (diagnostics.trace._first_part) decodes
# the first part of the event array while this process decodes the rest. The helper's share is a little
# under half: it starts an interpreter first (~0.2 s), and this process skips its part by seeking (.json).
# On a .gz this process must inflate the helper's part to get past it; the helper starts before this process
# reads the header, so it takes 47 % (measured on the 1 GB .gz, 3 runs each: 0.42 -> 4.34-4.50 s, 0.46 ->
# 4.13-4.34 s, 0.48 -> 4.16-4.34 s, 0.50 -> 4.32-4.48 s, the helper late past 0.48; the .json stays at 0.44:
# 3.53-3.59 s against 3.60-3.69 s at 0.47).
# Below SPLIT_MIN_BYTES the helper's start (an interpreter and its imports: ~0.3 s) costs more than it saves:
# measured 0.70 s split against 0.64 s alone on the 100 MB trace, 3.5 s against 5.9 s on the 1 GB one (about
# 0.34 s + 3.6 s/GB against 5.9 s/GB: even at ~150 MB, a clear gain from ~250 MB). A .json on a machine with
# more cores is read by one helper per spare core (SPLIT_MAX_HELPERS at most), each part chained to the next at
# an event boundary (_split_targets; measured on 2 cores only: the parts' sizes for more are the one-helper
# ratio, not a measurement).
SPLIT_MIN_BYTES = 256 << 20
SPLIT_SHARE = {False: 0.44, True: 0.47}     # the helper's share of the events' bytes, by is_gz
#: Helpers at most for a .json on a machine with more cores (one per core beside this process; a .gz has one:
#: each further helper would inflate everything before its part again).
SPLIT_MAX_HELPERS = 7
SPLIT_SEARCH_BYTES = 64 << 20   # how far past the split point an event boundary is looked for
#: From this many bytes of columns, two threads join their chunks (_joined).
JOIN_THREADS_MIN_BYTES = 64 << 20
# A .gz that expands more than GZ_BOMB_RATIO-fold past GZ_BOMB_MIN_BYTES is a decompression bomb
# (whitespace or one repeated byte), not a trace: real traces expand 5-30 fold.
GZ_BOMB_RATIO = 200
GZ_BOMB_MIN_BYTES = 256 << 20
#: Physical bounds on time in a trace (µs): no profiled event lasts less than 0 or longer than MAX_DUR_US,
#: and no timestamp (epoch or boot time: about 1.7e15 today) lies past MAX_TS_US (3,170 years). A dur of
#: INT64_MAX, a negative dur, a ts of 1e18 or -1e18 is an odd event: skipped and counted.
MAX_DUR_US = 7 * 86400 * 1e6
MAX_TS_US = 1e17
UNREAD_CATS_NAMED = 8            # categories no view reads named one by one in the warning; the rest counted
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_ARRAY_END = re.compile(rb"\}\s*\]")
_WS_COMMA = b" \t\r\n,"


# ---- reading bytes ---------------------------------------------------------------------------

def _open_blocks(path: Path) -> tuple[Iterator[bytes], bool]:
    """Blocks of decoded bytes, and whether the file was gzip. Sniffs the gzip magic bytes."""
    with open(path, "rb") as f:
        magic = f.read(2)
    is_gz = magic == b"\x1f\x8b"
    if path.suffix == ".gz" and not is_gz:
        raise TraceError(f"{path.name}: the name ends in .gz but the file is not gzip "
                         f"(it starts with {magic!r}); rename it or gzip it")
    return (_gunzip_blocks(path) if is_gz else _plain_blocks(path)), is_gz


class _Bomb(Exception):
    pass


def _plain_blocks(path: Path, offset: int = 0) -> Iterator[bytes]:
    with open(path, "rb") as f:
        if offset:
            f.seek(offset)
        while True:
            block = f.read(BLOCK_BYTES)
            if not block:
                return
            yield block


def _gunzip_blocks(path: Path) -> Iterator[bytes]:
    """Inflate in a background thread (zlib and ISA-L release the GIL) through a 2-block queue."""
    q: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()

    def produce():
        try:
            with open(path, "rb") as f:
                d = _zlib.decompressobj(31)
                pending: list = []
                size = 0
                read = made = 0
                while not stop.is_set():
                    data = f.read(GZ_READ_BYTES)
                    if not data:
                        break
                    read += len(data)
                    while data and not stop.is_set():
                        out = d.decompress(data, BLOCK_BYTES)  # bounded: a bomb never lands in memory whole
                        pending.append(out)
                        size += len(out)
                        made += len(out)
                        if made > GZ_BOMB_MIN_BYTES and made > GZ_BOMB_RATIO * read:
                            raise _Bomb(f"{path.name}: the gzip data expands more than {GZ_BOMB_RATIO}-fold "
                                        f"({made >> 20:,} MB from the first {read / 2**20:.1f} MB): a "
                                        "decompression bomb, not a trace; refused")
                        if d.eof:
                            data = d.unused_data
                            if data:  # a further gzip member follows
                                d = _zlib.decompressobj(31)
                        else:
                            data = d.unconsumed_tail
                        if size >= BLOCK_BYTES:
                            q.put(b"".join(pending))
                            pending, size = [], 0
                pending.append(d.flush())
                if not d.eof:
                    pending.append(None)  # marks a cut-off gzip stream
                q.put(b"".join(p for p in pending if p is not None))
                if pending[-1] is None:
                    q.put(TraceError(f"{path.name}: the gzip stream is truncated (the file ends "
                                     "before the compressed data does)"))
        except _Bomb as exc:
            q.put(TraceError(str(exc)))
        except (OSError, _zlib.error, EOFError) as exc:
            q.put(TraceError(f"{path.name}: cannot decompress the gzip data: {exc}"))
        finally:
            q.put(None)

    thread = threading.Thread(target=produce, name="trace-gunzip", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is None:
                return
            if isinstance(item, Exception):
                raise item
            if item:
                yield item
    finally:
        stop.set()
        while thread.is_alive():  # drain so the producer can finish
            try:
                q.get(timeout=0.05)
            except queue.Empty:
                pass



class _Merger:
    """Concatenates exported slices in file order, re-coding their string tables globally."""

    def __init__(self):
        self.tables = {f: _Interner() for f in STRING_FIELDS + LAUNCH_FIELDS}
        self.arrays: dict = {c: [] for c in STRING_FIELDS + LAUNCH_FIELDS + NUMERIC_FIELDS}
        self.n = 0
        self.meta_events: list = []
        self.skipped = 0
        self.warnings: list = []

    def add(self, part: dict | None) -> None:
        if not part:
            return
        self.skipped += part["skipped"]
        for w in part["warnings"]:
            self.warn(w)
        if not part["n"]:
            return
        arrays = part["arrays"]
        for f in STRING_FIELDS + LAUNCH_FIELDS:
            table = self.tables[f]
            # One extra slot maps code -1 (absent: launch fields only) to -1.
            remap = np.fromiter([*map(table.__getitem__, part["tables"][f]), -1], np.int32)
            self.arrays[f].append(remap[arrays[f]])
        for f in NUMERIC_FIELDS:
            self.arrays[f].append(arrays[f])
        self.meta_events.extend(part["meta_events"])
        self.n += part["n"]

    def add_columns(self, cols: Columns) -> None:
        if cols.n or cols.skipped:
            self.add(cols.export())

    def add_merger(self, other: "_Merger") -> None:
        """Append ``other``'s columns after these (its string codes re-coded into these tables)."""
        self.skipped += other.skipped
        for w in other.warnings:
            self.warn(w)
        for f in STRING_FIELDS + LAUNCH_FIELDS:
            table = self.tables[f]
            remap = np.fromiter([*map(table.__getitem__, other.tables[f]), -1], np.int32)
            self.arrays[f].extend(remap[a] for a in other.arrays[f])
        for f in NUMERIC_FIELDS:
            self.arrays[f].extend(other.arrays[f])
        self.meta_events.extend(other.meta_events)
        self.n += other.n

    def warn(self, message: str) -> None:
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(message)


def _parse(blocks: Iterator[bytes], name: str, allow_truncated: bool) -> tuple:
    """(the merged columns, the trace's metadata, the decoded bytes read) of the blocks of one file:
    its header, its events, the end of its array."""
    out = _Merger()
    it = iter(blocks)
    header, carry, bare, total = _header(it, name)
    carry, read = _event_blocks(it, out, carry)
    meta = _array_end(out, carry, header, bare, name, allow_truncated, total + read)
    return out, meta, total + read


def _header(it: Iterator[bytes], name: str) -> tuple[bytes, bytes, bool, int]:
    """Everything before the traceEvents array (or a bare top-level array): (the header, the bytes after
    the array's ``[``, whether the file is a bare array, the bytes read)."""
    total = 0
    head = b""
    bare = False
    while True:
        first = head.lstrip()[:1]
        if first == b"[":
            bare = True
            start = head.index(b"[") + 1
            break
        if first and first != b"{":
            raise TraceError(f"{name}: not a JSON trace (it starts with {head.lstrip()[:20]!r})")
        m = _EVENTS_KEY.search(head)
        if m:
            start = m.end()
            break
        block = next(it, None)
        if block is None:
            _raise_no_events(name, head)
        total += len(block)
        head += block
        if len(head) > HEADER_LIMIT_BYTES:
            raise TraceError(f"{name}: no traceEvents array in the first "
                             f"{HEADER_LIMIT_BYTES >> 20} MB: not a torch.profiler trace")
    return head[:start - 1], head[start:], bare, total


def _event_blocks(it: Iterator[bytes], out: _Merger, carry: bytes) -> tuple[bytes, int]:
    """The events: each block is cut at its last event boundary and the part before it decoded here.
    Returns what is left after the last boundary and the bytes read."""
    total = 0
    for block in it:
        total += len(block)
        cols = Columns()
        carry = consume_block(cols, carry, block)
        out.add_columns(cols)
    return carry, total


def _array_end(out: _Merger, carry: bytes, header: bytes, bare: bool, name: str, allow_truncated: bool,
               total: int) -> dict:
    """The end of the array: the rest holds the last events, `]` and the trailing keys. Returns the
    trace's metadata (_meta); a file that ends before its `]` is refused unless ``allow_truncated``."""
    buf = carry.lstrip(_WS_COMMA)
    if buf.startswith(SKIPPING):  # the file ended inside (or right after) an oversized last event
        closes = list(_ARRAY_END.finditer(buf, len(SKIPPING)))
        if closes:
            return _meta(header, buf[closes[-1].end():], bare, out)
        buf = b""  # no `]` after it: truncated, as below
    cut = last_boundary(buf)
    if cut >= 0:
        cols = Columns()
        buf = consume(cols, buf, cut=cut)
        out.add_columns(cols)
    starts, ends, close = scan(buf)
    cols = Columns()
    if close < 0:
        msg = (f"{name}: the trace is truncated (or corrupt): the traceEvents array is not "
               f"closed when the file ends, after {total:,} bytes of JSON")
        if not allow_truncated:
            raise TraceError(msg)
        out.warn(msg + "; the events before the cut were loaded")
        consume_spans(cols, buf, starts, ends)
        out.add_columns(cols)
        return _meta(header, b"}", bare, out)
    consume_spans(cols, buf[:close], starts, ends, whole=True)
    out.add_columns(cols)
    return _meta(header, buf[close + 1:], bare, out)


def _raise_no_events(name: str, head: bytes) -> None:
    try:
        doc = orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        if not head.strip():
            raise TraceError(f"{name}: the file is empty") from None
        if "unexpected end" in str(exc).lower() or "eof" in str(exc).lower():
            raise TraceError(f"{name}: the JSON is truncated and holds no traceEvents array "
                             "(not a complete torch.profiler trace)") from None
        raise TraceError(f"{name}: not valid JSON ({exc})") from None
    if isinstance(doc, dict) and "traceEvents" in doc:
        kind = {dict: "an object", str: "a string", type(None): "null"}.get(type(doc["traceEvents"]),
                                                                          type(doc["traceEvents"]).__name__)
        raise TraceError(f"{name}: not a trace: its traceEvents is {kind}, not an array of events")
    keys = ", ".join(list(doc)[:8]) if isinstance(doc, dict) else type(doc).__name__
    raise TraceError(f"{name}: not a trace: the JSON has no traceEvents array (found: {keys})")


def _meta(header: bytes, trailer: bytes, bare: bool, cols: _Merger) -> dict:
    """Top-level keys other than traceEvents, parsed from the bytes around the array."""
    if bare:
        return {}
    try:
        doc = orjson.loads(header + b"[]" + trailer)
    except orjson.JSONDecodeError as exc:
        cols.warn(f"could not read the trace's top-level keys ({exc})")
        return {}
    if not isinstance(doc, dict):
        return {}
    doc.pop("traceEvents", None)
    return doc


# ---- two processes on one trace (load_trace(split=True)) ------------------------------------------
#
# The helper decodes the events from the array's start up to the split: the `}` of the first event
# boundary (BOUNDARY, `}` `,` `{`) that starts at or after a target offset in the decoded bytes. This
# process finds the same boundary by the same rule (the leftmost match starting at or after the target:
# the same in any buffer that holds the bytes from the target to the match's end), decodes everything
# after it and the array's end, then takes the helper's columns and puts them first. A boundary inside a
# string or a nested array is not an event's end: the helper's last events then do not decode as a whole,
# and it says so (clean: false); any doubt (that, a helper that fails, a different split) and the trace is
# read again the ordinary way, in this process alone. The helper's columns cross as data: a JSON header and
# raw arrays of the dtypes expected, never a pickle.

_PART_DTYPES = {f: np.dtype(np.int32) for f in STRING_FIELDS + LAUNCH_FIELDS}
_PART_DTYPES.update({f: np.dtype(INT_TYPES.get(f, np.float64)) for f in NUMERIC_FIELDS})
_PART_DTYPES.update({"flow_id": np.dtype(np.int64), "occupancy": np.dtype(np.float32)})


def _cores() -> int:
    from diagnostics.devices import usable_cores   # (the one place cores are read)

    return usable_cores()


def _decoded_size(path: Path, size: int, is_gz: bool) -> int:
    """The decoded size of a trace file: its size, or for a .gz its (last member's) ISIZE, the decoded
    size modulo 4 GiB, taken past 4 GiB while it is under 4x the compressed size (traces expand 5-30 fold)."""
    if not is_gz:
        return size
    if size < 18:   # shorter than a gzip header and trailer: the ordinary read says what is wrong
        return 0
    with open(path, "rb") as f:
        f.seek(-4, os.SEEK_END)
        guess = int.from_bytes(f.read(4), "little")
    for _ in range(64):
        if guess >= 4 * size:
            break
        guess += 1 << 32
    return guess


def _split_target(decoded: int, is_gz: bool) -> int:
    """The decoded offset (from the file's start) from which the split's boundary is looked for: the helper's
    share of the file."""
    return int(decoded * SPLIT_SHARE[is_gz])


def _split_targets(decoded: int, is_gz: bool, helpers: int) -> list[int]:
    """The decoded offsets (from the file's start) where the parts of ``helpers`` helpers end (the last one: where
    this process's part begins). One helper: SPLIT_SHARE. More (a .json on more cores): equal parts, this
    process's part larger by the same ratio as with one (it starts at once; the helpers start a new interpreter)."""
    if helpers <= 1:
        return [_split_target(decoded, is_gz)]
    share = SPLIT_SHARE[is_gz]
    part = 1 / (helpers + (1 - share) / share)
    return [int(decoded * part * i) for i in range(1, helpers + 1)]


def _find_split(it, buf: bytes, read_end: int, target: int) -> tuple[int, bytes, int] | None:
    """Read on from ``it`` (``buf``: the bytes so far, ending at decoded offset ``read_end``) to the first event
    boundary at or after ``target``: (its offset, the bytes after it from the next event on, read_end), or None
    when none lies within SPLIT_SEARCH_BYTES of the target or the events end first."""
    while True:
        if read_end > target:
            base = read_end - len(buf)
            cut = _boundary_at_or_after(buf, base, target)
            if cut >= 0:
                return base + cut, buf[cut + 1:].lstrip(_WS_COMMA), read_end
            if read_end - target > SPLIT_SEARCH_BYTES:
                return None
        block = next(it, None)
        if block is None:
            return None
        read_end += len(block)
        buf = (buf + block if buf else block) if read_end > target else b""


def _boundary_at_or_after(buf: bytes, base: int, target: int) -> int:
    """Index in ``buf`` (which starts at decoded offset ``base``) of the `}` of the first event boundary
    starting at or after ``target``, or -1."""
    m = BOUNDARY.search(buf, max(0, target - base))
    return -1 if m is None else m.start()


def first_part(path: Path, target: int, emit, start: int | None = None) -> dict:
    """The helper's work: decode the events from the array's start (or, with ``start``, a .json's only, from the
    first event boundary at or after it) to the split at or after ``target``, handing each block's columns to
    ``emit`` (a part, as Columns.export makes) as they are made. Returns the end record: {"end": True, "clean":
    True, "split": the decoded offset of the split's `}`} (with ``start``, also "from": the boundary it began
    after), or "clean": False when the split's last events do not decode as a whole (or no boundary
    qualifies)."""
    not_clean = {"end": True, "clean": False}
    begun = {}

    def put(cols: Columns) -> None:
        if cols.n or cols.skipped:
            emit(cols.export())

    # a middle part reads from ``start`` on (a .json: the caller read the header and checked the array)
    blocks = _open_blocks(path)[0] if start is None else _plain_blocks(path, start)
    try:
        it = iter(blocks)
        if start is None:
            _header_bytes, buf, _bare, read_end = _header(it, path.name)
        else:   # from the first boundary at or after ``start``
            found = _find_split(it, b"", start, start)
            if found is None:
                return not_clean
            begun["from"], buf, read_end = found
        while True:
            if read_end > target:
                base = read_end - len(buf)
                cut = _boundary_at_or_after(buf, base, target)
                if cut >= 0:
                    cols = Columns()
                    try:
                        cols.add(_decode_events(b"[" + buf[:cut + 1].lstrip(_WS_COMMA) + b"]"))
                    except DECODE_ERRORS:
                        return not_clean
                    put(cols)
                    return {"end": True, "clean": True, "split": base + cut, **begun}
                if read_end - target > SPLIT_SEARCH_BYTES:
                    return not_clean
            block = next(it, None)
            if block is None:
                return not_clean
            if read_end + len(block) <= target:  # wholly before the split: decode as load_trace does
                cols = Columns()
                rest = consume_block(cols, buf, block)
                put(cols)
                read_end += len(block)
                if len(rest) > len(block) or not block.endswith(rest):  # an event longer than a block
                    return not_clean
                buf = rest
            else:
                buf = buf + block if buf else block
                read_end += len(block)
    finally:
        blocks.close()


def write_record(stream, head: dict, arrays: dict | None = None) -> None:
    """One record onto a binary stream: an 8-byte length, a JSON header naming the arrays (name, dtype,
    length), then each array's raw bytes."""
    arrays = arrays or {}
    head = dict(head, arrays=[[k, a.dtype.str, int(a.size)] for k, a in arrays.items()])
    blob = orjson.dumps(head)
    stream.write(len(blob).to_bytes(8, "little"))
    stream.write(blob)
    for a in arrays.values():
        stream.write(memoryview(np.ascontiguousarray(a)).cast("B"))


def write_part(part: dict, stream) -> None:
    """A part (Columns.export) as a record."""
    write_record(stream, {k: v for k, v in part.items() if k != "arrays"}, part["arrays"] if part["n"] else None)


class _Records:
    """Reads records (write_record) from one buffer: the arrays are views into it, not copies."""

    def __init__(self, buf):
        self.view, self.pos = memoryview(buf), 0

    def take(self, n: int) -> memoryview | None:
        if n < 0 or self.pos + n > len(self.view):
            return None
        out = self.view[self.pos:self.pos + n]
        self.pos += n
        return out

    def next(self) -> dict | None:
        """The next record as data, checked: a part has the columns and dtypes expected, each as long as its
        event count, its tables as lists and every string code inside its table; an end record is returned as
        it is. None when the buffer ends or anything is off (a malformed header included: never an exception)."""
        try:
            return self._next()
        except (TypeError, ValueError, KeyError):   # an array spec or a table entry of the wrong shape
            return None

    def _next(self) -> dict | None:
        size = self.take(8)
        blob = None if size is None else self.take(int.from_bytes(size, "little"))
        if blob is None:
            return None
        try:
            head = orjson.loads(blob)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(head, dict):
            return None
        if head.get("end") is True:
            return head
        n, specs, tables = head.get("n"), head.get("arrays"), head.get("tables")
        if not isinstance(n, int) or n < 0 or not isinstance(specs, list) or not isinstance(tables, dict):
            return None
        if n and {s[0] for s in specs if isinstance(s, list) and s} != set(_PART_DTYPES):
            return None
        if not all(isinstance(tables.get(f), list) for f in STRING_FIELDS + LAUNCH_FIELDS):
            return None
        arrays = {}
        for name, dtype, count in specs if n else ():
            want = _PART_DTYPES[name]
            if np.dtype(dtype) != want or count != n:
                return None
            raw = self.take(want.itemsize * count)
            if raw is None:
                return None
            arrays[name] = np.frombuffer(raw, dtype=want)
        for f in LAUNCH_FIELDS:  # (64, 1, 1) crossed as a list
            tables[f] = [tuple(v) for v in tables[f]]
        for f in STRING_FIELDS + LAUNCH_FIELDS if n else ():  # every code names an entry (or is -1: absent)
            codes = arrays[f]
            if int(codes.min()) < -1 or int(codes.max()) >= len(tables[f]):
                return None
        return {"n": n, "arrays": arrays, "tables": tables,
                "meta_events": [tuple(e) for e in head.get("meta_events", [])],
                "skipped": int(head.get("skipped", 0)), "warnings": [str(w) for w in head.get("warnings", [])]}


def read_records(buf) -> tuple[list, dict | None]:
    """(the parts, the end record) written by the helper into ``buf``; the end record None when the
    records stop short of it or one is off."""
    records, parts = _Records(buf), []
    while True:
        rec = records.next()
        if rec is None:
            return parts, None
        if rec.get("end") is True:
            return parts, rec
        parts.append(rec)


def _start_helper(path: Path, target: int, out_fd: int, start: int | None = None):
    """A helper process, writing its records to ``out_fd`` (an unlinked temporary file: it never waits
    on this process, and nothing is left behind if either is killed)."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    argv = [sys.executable, "-m", "diagnostics.trace._first_part", str(path), str(target)]
    try:
        return subprocess.Popen(argv + ([] if start is None else [str(start)]),
                                stdin=subprocess.DEVNULL, stdout=out_fd, stderr=subprocess.DEVNULL,
                                env=env, cwd=root)
    except OSError:
        return None


def _load_split(path: Path, name: str, size: int, allow_truncated: bool) -> Trace | None:
    """load_trace by this process and helper processes (see above); None when the trace is too small to
    split or the split is in doubt (the caller then reads it the ordinary way)."""
    source, path = str(path), path.resolve()
    blocks, is_gz = _open_blocks(path)
    helpers: list = []   # (process, spool)
    try:
        decoded = _decoded_size(path, size, is_gz)
        cores = _cores()
        if decoded < SPLIT_MIN_BYTES or cores < 2:
            return None
        n = 1 if is_gz else min(SPLIT_MAX_HELPERS, cores - 1)
        # The helpers start before this process reads the header (a first block to inflate: they start a new
        # interpreter meanwhile), their parts measured from the file's start (a header is a few kB of 1 GB);
        # one whose part would end inside the header is not used (the trace is then read alone).
        targets = _split_targets(decoded, is_gz, n)
        for i, target in enumerate(targets):
            try:
                spool = tempfile.TemporaryFile(prefix="torchscope-trace-part-")
            except OSError:   # no room for the helpers' columns: read alone
                return None
            proc = _start_helper(path, target, spool.fileno(), None if i == 0 else targets[i - 1])
            helpers.append((proc, spool))
            if proc is None:
                return None
        it = iter(blocks)
        header, buf, bare, read_end = _header(it, name)
        if read_end - len(buf) >= targets[0]:
            return None
        target = targets[-1]
        if not is_gz:  # skip the helpers' parts: read from the last target on
            blocks.close()
            blocks = _plain_blocks(path, target)
            it, buf, read_end = iter(blocks), b"", target
        found = _find_split(it, buf, read_end, target)
        if found is None:
            return None
        split_at, carry, read_end = found
        out = _Merger()
        try:
            carry, read = _event_blocks(it, out, carry)
            meta = _array_end(out, carry, header, bare, name, allow_truncated, read_end + read)
        except TraceError:  # real (a truncated file), or a split inside a string: the caller reads it alone
            return None
        merged = _Merger()
        begin = None   # where the next part must begin: the previous part's split
        for proc, spool in helpers:
            if proc.wait() != 0:
                return None
            spool.seek(0)
            parts, end = read_records(spool.read())
            if end is None or end.get("clean") is not True or end.get("from") != begin:
                return None
            begin = end.get("split")
            for part in parts:
                merged.add(part)
            del parts
        if begin != split_at:
            return None
        merged.add_merger(out)
        return _build(merged, meta, source, read_end + read, name)
    finally:
        for proc, spool in helpers:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
            spool.close()
        blocks.close()


# ---- public ----------------------------------------------------------------------------------

def load_trace(path, allow_truncated: bool = False, split: bool = False) -> Trace:
    """Load a torch.profiler / Kineto trace (.json, .json.gz, *.pt.trace.json.gz) into a Trace.

    Raises TraceError when the file is missing, not gzip though named .gz, not JSON, has no
    traceEvents, is truncated (unless allow_truncated: then the complete events before the cut
    are kept, with a warning) or holds no timed event. `split`: a
    trace of SPLIT_MIN_BYTES or more is read by this process and helper processes together, on a machine with
    two usable cores or more (one helper; a .json: one per spare core, SPLIT_MAX_HELPERS at most) (the Trace
    explorer's single trace; not the per-rank workers, which already fill the cores). The result is the same
    Trace either way.
    """
    path = Path(path)
    name = path.name
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    size = path.stat().st_size
    if size == 0:
        raise TraceError(f"{name}: the file is empty")
    with small_pages():
        return _load(path, name, size, allow_truncated, split)


def _load(path: Path, name: str, size: int, allow_truncated: bool, split: bool) -> Trace:
    if split:
        got = _load_split(path, name, size, allow_truncated)
        if got is not None:
            return got
    blocks, _ = _open_blocks(path)
    try:
        merged, meta, total = _parse(blocks, name, allow_truncated)
    finally:
        blocks.close()
    return _build(merged, meta, str(path), total, name)


def _build(merged: _Merger, meta: dict, source: str, total: int, name: str) -> Trace:
    if merged.n == 0:
        if merged.skipped:
            raise TraceError(f"{name}: none of its {merged.skipped} events could be read "
                             f"({'; '.join(merged.warnings[:2])})")
        raise TraceError(f"{name}: the trace holds no events: its event array is empty or holds no JSON "
                         "objects (not a torch.profiler trace?)")
    ch = _joined(merged.arrays)
    ph_table = merged.tables["ph"]
    ts = ch["ts"]
    ok = np.isfinite(ts)
    if not ok.all():
        bad = int((~ok).sum())
        merged.skipped += bad
        merged.warn(f"skipped {bad} events without a numeric ts")
        ch = {k: v[ok] for k, v in ch.items()}
        ts = ch["ts"]
        if ts.size == 0:
            raise TraceError(f"{name}: none of its {merged.skipped} events could be read: none has a "
                             "numeric ts")
    # Metadata (ph M) events carry ts 0 or the trace start: keep them out of the origin.
    timed = ch["ph"] != ph_table.get("M", -1)
    if not timed.any():
        raise TraceError(f"{name}: the trace is empty: it holds only metadata events")
    # Past a physical bound: a timestamp past MAX_TS_US, a duration that is negative or over MAX_DUR_US.
    # (Not "longer than the other events' span": the public HTA sample's ProfilerStep#1 lasts 13 s past
    # a 0.36 s span of starts, and is real.)
    with np.errstate(invalid="ignore"):
        odd = (np.abs(ts) > MAX_TS_US) | (ch["dur"] < 0) | (ch["dur"] > MAX_DUR_US)
    if odd.any():
        bad = int(odd.sum())
        merged.skipped += bad
        merged.warn(f"skipped {bad} events past a physical bound: a negative duration or one over "
                    f"{MAX_DUR_US / 86400e6:g} days, or a timestamp past {MAX_TS_US:g} µs")
        ch = {k: v[~odd] for k, v in ch.items()}
        ts, timed = ch["ts"], timed[~odd]
        if not timed.any():
            raise TraceError(f"{name}: none of its {merged.skipped} events could be read: every timed event is past "
                             "a physical bound")
    origin = float(ts[timed].min())
    ch["ts"] = ts - origin
    # The columns as arrays (the string ones as codes and their distinct strings): no DataFrame here, the
    # Summary reads the arrays and Trace.events is made after it (issue #42).
    columns, tables = {}, {}
    for col in COLUMNS:
        if col in STRING_FIELDS:
            columns[col], tables[col] = _strings(ch[col], merged.tables[col].values_list())
        elif col in LAUNCH_FIELDS:  # (64, 1, 1) -> "64×1×1", as the profiler's kernel table shows it
            columns[col], tables[col] = _strings(ch[col], ["×".join(map(str, v)) for v in merged.tables[col]])
        else:
            columns[col] = ch[col]
    process_names, thread_names = {}, {}
    for ev_name, pid, tid, label in merged.meta_events:
        if ev_name == "process_name" and label:
            process_names[str(pid)] = label
        elif ev_name == "thread_name" and label:
            thread_names[f"{pid}/{tid}"] = label
    warnings = list(merged.warnings)
    unread = _unread_categories(ch["cat"][timed], merged.tables["cat"].values_list())
    if unread:
        warnings.append(unread)
    if merged.skipped:
        warnings.insert(0, f"skipped {merged.skipped} malformed events")
    return Trace(columns=columns, tables=tables, meta=meta, origin_us=origin, source=source, n_bytes=total,
                 skipped_events=merged.skipped, warnings=warnings,
                 process_names=process_names, thread_names=thread_names)


def _joined(arrays: dict) -> dict:
    """Each column's chunks joined into one array (the chunk lists emptied). A big trace's columns are
    joined by two threads: np.concatenate copies without the GIL, and the copy and the fresh pages' faults
    are most of the work (the 1 GB trace: 350 MB of columns, 0.3 s in one thread)."""
    def join(parts: list) -> np.ndarray:
        out = np.concatenate(parts) if len(parts) > 1 else parts[0]
        parts.clear()   # its chunks freed once it is joined (not after every column is)
        return out

    if sum(a.nbytes for parts in arrays.values() for a in parts) >= JOIN_THREADS_MIN_BYTES and _cores() >= 2:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(2, thread_name_prefix="torchscope-join") as pool:
            out = dict(zip(arrays, pool.map(join, arrays.values())))
    else:
        out = {k: join(parts) for k, parts in arrays.items()}
    return out


def _unread_categories(codes: np.ndarray, table: list) -> str | None:
    """A warning naming the categories no view reads (not in KNOWN_CATS), with their event counts,
    or None. Their duration events still count as host events on their own thread."""
    counts = np.bincount(codes[codes >= 0], minlength=len(table))
    unread = sorted(((int(counts[i]), str(c)) for i, c in enumerate(table)
                     if counts[i] and str(c) and str(c).lower() not in KNOWN_CATS), key=lambda x: (-x[0], x[1]))
    if not unread:
        return None
    shown = ", ".join(f"{n:,} events of category {c!r}" for n, c in unread[:UNREAD_CATS_NAMED])
    more = unread[UNREAD_CATS_NAMED:]
    if more:
        shown += f" and {sum(n for n, _ in more):,} events of {len(more)} more categories"
    return (f"skipped {shown}: no device, launch or GPU step figure reads these categories (their "
            "timed events count only as host events on their own thread)")


def _strings(codes: np.ndarray, table: list) -> tuple[np.ndarray, np.ndarray]:
    """A string column: its codes (-1 for missing) and its distinct strings (an object array), each
    string once (5 and "5", both seen, are one)."""
    labels = [str(v) for v in table]
    if len(set(labels)) != len(labels):  # 5 and "5" both seen: merge them
        merged = _Interner()
        remap = np.r_[np.fromiter((merged[s] for s in labels), np.int32, len(labels)), np.int32(-1)]
        codes = remap[codes]   # code -1 (missing) reads remap's last entry: -1
        labels = merged.values_list()
    return codes, np.array(labels, dtype=object)


def trace_files(folder) -> list[Path]:
    """Trace files in a folder (TensorBoard plugin layout included), newest first."""
    folder = Path(folder)
    found = [p for p in folder.rglob("*") if p.is_file() and
             (p.name.endswith(".json") or p.name.endswith(".json.gz"))]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


__all__ = ["load_trace", "trace_files", "TraceError"]
