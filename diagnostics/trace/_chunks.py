"""Decode slices of a trace's traceEvents array into numpy columns (worker-safe: no pandas).

A slice is a run of whole events separated by commas. msgspec decodes it in one call into
small structs holding only the fields the analyses use; `Columns` turns those into numpy arrays
with slice-local string tables, exported as plain data so a worker process can send them back.
A slice that fails to decode as a whole is split at its real object boundaries (a vectorised
scan that honours strings) and decoded event by event; bad events are counted, not fatal.
"""

from __future__ import annotations

import math
import re
import zlib
from operator import attrgetter
from typing import Union

import msgspec
import numpy as np
import orjson

from diagnostics.trace.classify import GPU_CATS, KERNEL_CATS, MEMCPY_CATS, MEMSET_CATS

MAX_EVENT_BYTES = 64 << 20      # one event larger than this is treated as corrupt and skipped
# A carry that starts with SKIPPING is inside an event too large to keep: the bytes up to the next
# event boundary are dropped as they come (only the last SKIP_TAIL_BYTES are held, for the array's end).
SKIPPING = b"\x00skipping an oversized event\x00"
SKIP_TAIL_BYTES = 1 << 20
MAX_WARNINGS = 20               # distinct warning lines kept (counts are always exact)
BOUNDARY = re.compile(rb"\}\s*,\s*\{")
STRING_FIELDS = ("ph", "cat", "name", "pid", "tid")
# A kernel's launch dimensions, interned (a trace has few distinct ones): code -1 when absent.
LAUNCH_FIELDS = ("grid", "block")
NUMERIC_FIELDS = ("ts", "dur", "ext_id", "corr", "device", "stream", "flow_id", "nbytes",
                  "total_allocated", "device_type", "seq", "fwd_tid", "registers", "occupancy")
_NUMBER_TYPES = (int, float)
_STRING_KEY = attrgetter(*STRING_FIELDS)
# What decoding hostile bytes can raise: bad JSON or types, nesting deeper than msgspec's
# limit (RecursionError), and strings that are not UTF-8 (UnicodeDecodeError).
DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeDecodeError)
_FLOW_PHASES = frozenset({"s", "f", "t"})
# Integer columns and their types. Ids, streams and devices are int64: real files hold a uint32 -1
# ("stream": 4294967295 on HTA's captures) and 64-bit ids. Registers and device types are small
# by nature; a value past its column's range (or past int64: a uint64 -1) is read as absent (-1)
# and counted in a warning, never an OverflowError.
INT_TYPES = {"ext_id": np.int64, "corr": np.int64, "seq": np.int64, "fwd_tid": np.int64, "device": np.int64,
             "stream": np.int64, "nbytes": np.int64, "total_allocated": np.int64, "device_type": np.int8,
             "registers": np.int16}
_INSTANT_PHASES = frozenset({"i", "I"})
#: The slow path decodes a run of events this long or shorter one by one (add_one_by_one).
ONE_BY_ONE = 16


class _Args(msgspec.Struct, frozen=True, gc=False):
    external_id: int = msgspec.field(name="External id", default=-1)
    correlation: int = -1
    device: int = -1
    stream: int = -1
    nbytes: int = msgspec.field(name="Bytes", default=0)
    # A memcpy's / memset's size ("bytes", lower case, as Kineto writes it): -1 when not recorded. ROCm's
    # runtime calls write it as a string ("bytes": "616"): taken here as it comes (_copy_bytes reads it),
    # so that a block holding one still decodes as a whole (issue #42: every block of xDiT's traces did not).
    copy_bytes: Union[int, str] = msgspec.field(name="bytes", default=-1)
    total_allocated: int = msgspec.field(name="Total Allocated", default=-1)
    device_type: int = msgspec.field(name="Device Type", default=-1)
    device_id: int = msgspec.field(name="Device Id", default=-1)
    label: str = msgspec.field(name="name", default="")
    # Backward-to-module attribution: the autograd sequence number of an op, and on a backward op
    # the forward thread it belongs to (absent or 0 on forward ops).
    seq: int = msgspec.field(name="Sequence number", default=-1)
    fwd_tid: int = msgspec.field(name="Fwd thread id", default=-1)
    # Kernels' launch configuration.
    grid: tuple[int, ...] = ()
    block: tuple[int, ...] = ()
    registers: int = msgspec.field(name="registers per thread", default=-1)
    occupancy: float = msgspec.field(name="est. achieved occupancy %", default=math.nan)


_NO_ARGS = _Args()


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: Union[int, str] = -1
    tid: Union[int, str] = -1
    ts: float = math.nan
    dur: float = math.nan
    id: Union[int, str] = -1
    args: _Args = _NO_ARGS


_decode_events = msgspec.json.Decoder(list[_Event]).decode
_decode_event = msgspec.json.Decoder(_Event).decode


class _Interner(dict):
    """value -> dense code, assigned on first sight (dict lookups stay in C for known values)."""

    def __missing__(self, key):
        code = self[key] = len(self)
        return code

    def values_list(self) -> list:
        return list(self.keys())


# ---- structure scanning ----------------------------------------------------------------------

def scan(buf: bytes) -> tuple[np.ndarray, np.ndarray, int]:
    """Top-level structure of a slice of the traceEvents array that starts between two events.

    Returns (starts, ends, close): byte offsets of each complete top-level object's `{` and `}`,
    and the offset of the `]` that closes the array (-1 if not in `buf`). Strings and escapes are
    honoured. Vectorised with numpy; used only at the end of the array and on malformed data.
    """
    a = np.frombuffer(buf, dtype=np.uint8)
    quote = a == 34
    q = np.flatnonzero(quote)
    esc = q[(q > 0) & (a[np.maximum(q - 1, 0)] == 92)]
    for pos in esc:  # rare: a quote after backslashes is escaped when the run is odd
        run = 0
        while pos - 1 - run >= 0 and a[pos - 1 - run] == 92:
            run += 1
        if run % 2:
            quote[pos] = False
    in_str = np.bitwise_xor.accumulate(quote.view(np.uint8))
    outside = in_str == 0
    opens = ((a == 123) | (a == 91)) & outside
    closes = ((a == 125) | (a == 93)) & outside
    depth = np.cumsum(opens.astype(np.int32) - closes.astype(np.int32), dtype=np.int32)
    below = np.flatnonzero(closes & (depth < 0))
    close = int(below[0]) if below.size else -1
    limit = close if close >= 0 else a.size
    ends = np.flatnonzero((a[:limit] == 125) & closes[:limit] & (depth[:limit] == 0))
    starts = np.flatnonzero((a[:limit] == 123) & opens[:limit] & (depth[:limit] == 1))
    return starts, ends, close


def last_boundary(buf: bytes) -> int:
    """Offset of the `}` of the last `}, {` in buf (a likely event boundary), or -1."""
    window = 1 << 16
    n = len(buf)
    while True:
        lo = max(0, n - window)
        last = None
        for last in BOUNDARY.finditer(buf, lo):
            pass
        if last is not None:
            return last.start()
        if lo == 0:
            return -1
        window *= 4


# ---- events -> columns -----------------------------------------------------------------------

def _flow_number(ident) -> int:
    """A flow id written as a string ("0x1f", "42"): its number, else a stable hash."""
    try:
        return int(ident, 0)
    except (TypeError, ValueError):
        return zlib.crc32(str(ident).encode())


class Columns:
    """Accumulates decoded event structs into numpy column chunks and interned string tables."""

    def __init__(self):
        self.ph, self.cat, self.name = _Interner(), _Interner(), _Interner()
        self.pid, self.tid = _Interner(), _Interner()
        self.grid, self.block = _Interner(), _Interner()
        # (ph, cat, name, pid, tid) -> one code: one dict lookup per event instead of five; the
        # per-field codes of each distinct combination are kept beside it (few thousand at most).
        self.combos = _Interner()
        self.combo_codes: dict = {f: [] for f in STRING_FIELDS}
        self.chunks: dict = {c: [] for c in STRING_FIELDS + LAUNCH_FIELDS + NUMERIC_FIELDS}
        self.n = 0
        self.meta_events: list = []
        self.skipped = 0
        self.warnings: list = []

    def export(self) -> dict:
        """The columns so far as plain data: arrays, slice-local string tables, counts."""
        arrays = {k: (np.concatenate(v) if len(v) > 1 else v[0]) if v else
                  np.empty(0, np.int32) for k, v in self.chunks.items()}
        tables = {}
        for f in STRING_FIELDS + LAUNCH_FIELDS:
            tables[f] = getattr(self, f).values_list()
        return {"n": self.n, "arrays": arrays, "tables": tables, "meta_events": self.meta_events,
                "skipped": self.skipped, "warnings": self.warnings}

    def warn(self, message: str) -> None:
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(message)

    def add(self, evs: list) -> None:
        k = len(evs)
        if not k:
            return
        ch = self.chunks
        fi = np.fromiter

        def col(attr, dtype, items=evs):
            return fi(map(attrgetter(attr), items), dtype, k)

        def ints(attr, column, items):
            try:
                return col(attr, INT_TYPES[column], items)
            except OverflowError:  # rare: redo this chunk's column value by value
                return self._ints(list(map(attrgetter(attr), items)), column)

        ch["ts"].append(col("ts", np.float64))
        ch["dur"].append(col("dur", np.float64))
        combos = self.combos
        seen = len(combos)
        combo = fi(map(combos.__getitem__, map(_STRING_KEY, evs)), np.int32, k)
        if len(combos) > seen:  # new combinations: intern their fields one by one
            new = list(combos)[seen:]
            for i, f in enumerate(STRING_FIELDS):
                table = getattr(self, f)
                self.combo_codes[f].extend(table[key[i]] for key in new)
        for f in STRING_FIELDS:
            ch[f].append(np.asarray(self.combo_codes[f], dtype=np.int32)[combo])
        args = list(map(attrgetter("args"), evs))
        ch["ext_id"].append(ints("external_id", "ext_id", args))
        ch["corr"].append(ints("correlation", "corr", args))
        ch["seq"].append(ints("seq", "seq", args))
        # "Fwd thread id" is RecordFunction's own thread counter (1, 2, ...), not an OS thread id.
        ch["fwd_tid"].append(ints("fwd_tid", "fwd_tid", args))
        # Sparse fields are read only for the events that can carry them.
        ph = ch["ph"][-1]
        cat = ch["cat"][-1]
        flow_rows = self._rows(ph, self.ph, _FLOW_PHASES)
        gpu_rows = self._rows(cat, self.cat, GPU_CATS)
        mem_rows = self._rows(ph, self.ph, _INSTANT_PHASES)
        flow = np.full(k, -1, np.int64)
        if flow_rows.size:
            ids = [evs[i].id for i in flow_rows.tolist()]
            flow[flow_rows] = [i if i.__class__ is int else _flow_number(i) for i in ids]
        ch["flow_id"].append(flow)
        device = np.full(k, -1, INT_TYPES["device"])
        stream = np.full(k, -1, INT_TYPES["stream"])
        if gpu_rows.size:
            sub = [args[i] for i in gpu_rows.tolist()]
            device[gpu_rows] = self._ints(list(map(attrgetter("device"), sub)), "device")
            stream[gpu_rows] = self._ints(list(map(attrgetter("stream"), sub)), "stream")
        nbytes = np.zeros(k, INT_TYPES["nbytes"])
        total = np.full(k, -1, INT_TYPES["total_allocated"])
        dev_type = np.full(k, -1, INT_TYPES["device_type"])
        copy_rows = self._rows(cat, self.cat, MEMCPY_CATS | MEMSET_CATS)
        if copy_rows.size:  # a copy's size: -1 when the trace does not record it (older Kineto)
            nbytes[copy_rows] = self._ints([_copy_bytes(args[i].copy_bytes) for i in copy_rows.tolist()], "nbytes")
        if mem_rows.size:
            sub = [args[i] for i in mem_rows.tolist()]
            nbytes[mem_rows] = self._ints(list(map(attrgetter("nbytes"), sub)), "nbytes")
            total[mem_rows] = self._ints(list(map(attrgetter("total_allocated"), sub)), "total_allocated")
            dev_type[mem_rows] = self._ints(list(map(attrgetter("device_type"), sub)), "device_type")
            device[mem_rows] = self._ints(list(map(attrgetter("device_id"), sub)), "device")
        ch["device"].append(device)
        ch["stream"].append(stream)
        ch["nbytes"].append(nbytes)
        ch["total_allocated"].append(total)
        ch["device_type"].append(dev_type)
        self._add_launches(cat, args)
        m_code = self.ph.get("M")
        if m_code is not None and (ch["ph"][-1] == m_code).any():
            self.meta_events.extend((e.name, e.pid, e.tid, e.args.label) for e in evs
                                    if e.ph == "M")
        self.n += k

    def _add_launches(self, cat: np.ndarray, args: list) -> None:
        """grid / block codes, registers per thread and occupancy of the kernels among ``args``."""
        k = len(args)
        grid = np.full(k, -1, np.int32)
        block = np.full(k, -1, np.int32)
        registers = np.full(k, -1, INT_TYPES["registers"])  # at most 255 per thread
        occupancy = np.full(k, np.nan, np.float32)
        rows = self._rows(cat, self.cat, KERNEL_CATS)
        if rows.size:
            sub = [args[i] for i in rows.tolist()]
            gt, bt = self.grid, self.block
            grid[rows] = [gt[a.grid] if a.grid else -1 for a in sub]
            block[rows] = [bt[a.block] if a.block else -1 for a in sub]
            registers[rows] = self._ints(list(map(attrgetter("registers"), sub)), "registers")
            occupancy[rows] = list(map(attrgetter("occupancy"), sub))
        ch = self.chunks
        ch["grid"].append(grid)
        ch["block"].append(block)
        ch["registers"].append(registers)
        ch["occupancy"].append(occupancy)

    def _ints(self, values: list, column: str) -> np.ndarray:
        """``values`` (Python ints) as ``column``'s integer type; those outside its range become -1
        (absent), counted in a warning that names the column."""
        dtype = INT_TYPES[column]
        try:
            return np.array(values, dtype=dtype)
        except OverflowError:
            pass
        info = np.iinfo(dtype)
        bad = sum(1 for v in values if not info.min <= v <= info.max)
        self.warn(f"{bad:,} values of {column!r} outside its range ({info.min:,} to {info.max:,}) were read as "
                  "absent (-1)")
        return np.array([v if info.min <= v <= info.max else -1 for v in values], dtype=dtype)

    @staticmethod
    def _rows(codes: np.ndarray, table: dict, wanted: frozenset) -> np.ndarray:
        hit = [c for v, c in table.items() if (v.lower() if isinstance(v, str) else v) in wanted]
        if not hit:
            return np.empty(0, np.int64)
        return np.flatnonzero(np.isin(codes, hit))

    def add_one_by_one(self, buf: bytes, starts: np.ndarray, ends: np.ndarray) -> None:
        """Decode events individually (the slow path for a block that failed as a whole): runs of them
        that decode together are decoded in one call (halved until they do, down to ONE_BY_ONE events),
        the others one by one. The same events in the same order either way."""
        good: list = []
        spans = list(zip(starts.tolist(), ends.tolist()))
        todo = [(0, len(spans))]   # a stack of [i, j) runs, the first on top
        while todo:
            i, j = todo.pop()
            if j - i > ONE_BY_ONE:
                try:
                    good.extend(_decode_events(b"[" + b",".join(buf[s:e + 1] for s, e in spans[i:j]) + b"]"))
                    continue
                except DECODE_ERRORS:
                    mid = (i + j) // 2
                    todo += [(mid, j), (i, mid)]
                    continue
            for s, e in spans[i:j]:
                self._one(buf[s:e + 1], good)
        self.add(good)

    def _one(self, raw: bytes, good: list) -> None:
        """One event's bytes decoded into ``good`` (leniently when the schema refuses it), or counted
        as skipped with a warning."""
        try:
            good.append(_decode_event(raw))
            return
        except DECODE_ERRORS as exc:
            first_error = exc
        ev = _lenient_event(raw)
        # Whether the bytes are UTF-8 is asked of Python's own decoder, not read from the decoder's
        # exception: older msgspec raised UnicodeDecodeError, 0.23 raises DecodeError("Invalid UTF-8
        # encoded string"); the event is kept with its bad bytes replaced either way.
        if ev is None and not _is_utf8(raw):
            ev = _lenient_event(raw.decode("utf-8", "replace").encode())
            if ev is not None:
                self.warn("an event holds text that is not UTF-8; its bad bytes were "
                          f"replaced by \ufffd: {raw[:120].decode('utf-8', 'replace')}")
        if ev is None:
            self.skipped += 1
            why = ("nested deeper than the JSON decoder allows"
                   if isinstance(first_error, RecursionError) else str(first_error))
            self.warn(f"skipped an event ({why}): {raw[:120].decode('utf-8', 'replace')}")
        else:
            good.append(ev)


def _copy_bytes(value: int | str) -> int:
    """A copy's "bytes" as an int: a string one read as _lenient_event reads a number written as a string
    (its float, truncated; -1 when it is no finite number)."""
    if value.__class__ is int:
        return value
    try:
        f = float(value)
    except ValueError:
        return -1
    return int(f) if math.isfinite(f) else -1


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _lenient_event(raw: bytes) -> _Event | None:
    """Rebuild an event whose fields have odd types; None if it has no usable timestamp."""
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(d, dict):
        return None

    def num(v, default=math.nan):
        if isinstance(v, bool):
            return default
        if isinstance(v, _NUMBER_TYPES):
            return float(v)
        if isinstance(v, str):
            try:
                return float(v)
            except ValueError:
                return default
        return default

    def integer(v, default=-1):
        f = num(v)
        return int(f) if math.isfinite(f) else default

    def ident(v):
        if isinstance(v, (int, str)) and not isinstance(v, bool):
            return v
        return -1 if v is None else str(v)

    def dims(v):
        ok = isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
        return tuple(v) if ok else ()

    ts = num(d.get("ts"))
    if not math.isfinite(ts):
        return None
    a = d.get("args") if isinstance(d.get("args"), dict) else {}
    label = a.get("name")
    args = _Args(
        external_id=integer(a.get("External id")), correlation=integer(a.get("correlation")),
        device=integer(a.get("device")), stream=integer(a.get("stream")),
        nbytes=integer(a.get("Bytes"), 0), copy_bytes=integer(a.get("bytes")), total_allocated=integer(a.get("Total Allocated")),
        device_type=integer(a.get("Device Type")), device_id=integer(a.get("Device Id")),
        label=label if isinstance(label, str) else "",
        seq=integer(a.get("Sequence number")), fwd_tid=integer(a.get("Fwd thread id")),
        grid=dims(a.get("grid")), block=dims(a.get("block")),
        registers=integer(a.get("registers per thread")),
        occupancy=num(a.get("est. achieved occupancy %")))
    dur = num(d.get("dur"))
    return _Event(ph=str(d.get("ph") or ""), cat=str(d.get("cat") or ""),
                  name=str(d.get("name") or ""), pid=ident(d.get("pid")), tid=ident(d.get("tid")),
                  ts=ts, dur=dur, id=ident(d.get("id")), args=args)


def skip_oversized(buf: bytes) -> bytes:
    """``buf`` = SKIPPING + bytes inside an oversized event: what follows its end (the next event
    on), or SKIPPING + a bounded tail while it has not ended yet."""
    data = buf[len(SKIPPING):]
    m = BOUNDARY.search(data)
    if m is None:
        return SKIPPING + data[-SKIP_TAIL_BYTES:]
    return data[m.start() + 1:].lstrip(b" \t\r\n,")


def consume(cols: Columns, buf: bytes, cut: int | None = None) -> bytes:
    """Decode the complete events at the front of buf; return the unconsumed rest."""
    if buf.startswith(SKIPPING):
        buf, cut = skip_oversized(buf), None
        if buf.startswith(SKIPPING):
            return buf
    if cut is None:
        cut = last_boundary(buf)
    if cut < 0:
        buf = buf.rstrip(b" \t\r\n")  # whitespace between events is JSON, not a corrupt stretch
        if len(buf) > MAX_EVENT_BYTES:
            return resync(cols, buf)
        return buf
    # Decode "[" + buf[:cut + 1] + "]" without copying buf twice: one bytearray, and the byte
    # after the cut (a comma or a space) briefly becomes the closing bracket.
    work = bytearray(b"[")
    work += buf
    work[cut + 2] = 93
    view = memoryview(work)
    try:
        cols.add(_decode_events(view[:cut + 3]))
        return buf[cut + 1:].lstrip(b" \t\r\n,")
    except DECODE_ERRORS:
        pass
    finally:
        view.release()
        del work
    # Slow path: find the real boundaries and decode the events one by one.
    starts, ends, close = scan(buf)
    if close >= 0:  # the array closed early, or a stray `]`: keep the rest for the end step
        ends = ends[ends < close]
    if ends.size == 0:
        if len(buf) > MAX_EVENT_BYTES:
            return resync(cols, buf)
        return buf
    last = int(ends[-1])
    consume_spans(cols, buf, starts, ends)
    return buf[last + 1:].lstrip(b" \t\r\n,")


def consume_block(cols: Columns, carry: bytes, block: bytes) -> bytes:
    """consume(carry + block) with one copy: both go straight into the decode buffer.

    The hot path of a sequential load: `[` + carry + block in one bytearray, the byte after the
    last event boundary becomes `]`, and msgspec decodes the view up to it. Anything unusual
    (no boundary, a block that does not decode as a whole) goes through consume().
    """
    if carry.startswith(SKIPPING):  # inside an oversized event: drop bytes up to its end first
        carry, block = b"", skip_oversized(carry + block)
        if block.startswith(SKIPPING):
            return block
    work = bytearray().join((b"[", carry, block))  # one allocation, one copy
    cut = last_boundary(work)
    if cut < 0:
        return consume(cols, bytes(memoryview(work)[1:]))
    saved = work[cut + 1]
    work[cut + 1] = 93  # `]`
    view = memoryview(work)
    try:
        cols.add(_decode_events(view[:cut + 2]))
        return bytes(view[cut + 2:]).lstrip(b" \t\r\n,")
    except DECODE_ERRORS:
        work[cut + 1] = saved
        return consume(cols, bytes(view[1:]), cut=cut - 1)
    finally:
        view.release()


def consume_spans(cols: Columns, buf: bytes, starts: np.ndarray, ends: np.ndarray,
                   whole: bool = False) -> None:
    """Decode the objects whose `{` .. `}` spans are given (pairs matched in order)."""
    if ends.size == 0:
        return
    starts = starts[starts < ends[-1]]
    if starts.size != ends.size:  # unbalanced structure: pair each end with the start before it
        idx = np.searchsorted(starts, ends) - 1
        ok = idx >= 0
        starts, ends = starts[idx[ok]], ends[ok]
    _count_non_objects(cols, buf, starts, ends)
    if whole:
        try:
            cols.add(_decode_events(b"[" + buf[int(starts[0]):int(ends[-1]) + 1] + b"]"))
            return
        except DECODE_ERRORS:
            pass
    cols.add_one_by_one(buf, starts, ends)


def _count_non_objects(cols: Columns, buf: bytes, starts: np.ndarray, ends: np.ndarray) -> None:
    """Count array items between the objects that are not objects (numbers, strings, nulls)."""
    # Only a gap between objects holding a byte other than a comma or white space can hold an item:
    # found with numpy over the gaps' bytes (a few per event), the few such gaps split in Python.
    prev = np.concatenate(([0], ends[:-1] + 1)).astype(np.int64)
    gap = np.maximum(starts.astype(np.int64) - prev, 0)
    junk = 0
    if gap.sum():
        a = np.frombuffer(buf, dtype=np.uint8)
        first = np.repeat(prev, gap)
        offset = np.arange(first.size, dtype=np.int64) - np.repeat(np.cumsum(gap) - gap, gap)
        other = ~np.isin(a[first + offset], _GAP_BYTES)
        which = np.repeat(np.arange(gap.size), gap)[other]
        for k in np.unique(which).tolist():
            p, s = int(prev[k]), int(starts[k])
            junk += sum(1 for tok in buf[p:s].split(b",") if tok.strip())
    if junk:
        cols.skipped += junk
        cols.warn(f"skipped {junk} array items that are not event objects")


#: Bytes that hold no array item between two objects: the comma and what bytes.strip() strips.
_GAP_BYTES = np.frombuffer(b", \t\n\r\x0b\x0c", dtype=np.uint8)


def resync(cols: Columns, buf: bytes) -> bytes:
    """A corrupt stretch with no event boundary for MAX_EVENT_BYTES: drop it, count it, go on.

    With no boundary in its second half either, it is one event larger than MAX_EVENT_BYTES (or a
    corrupt stretch that long): skip it to its end, however far (SKIPPING), and count it once."""
    m = BOUNDARY.search(buf, len(buf) // 2)
    cols.skipped += 1
    if m is None:
        cols.warn(f"skipped an event larger than {MAX_EVENT_BYTES >> 20} MB (the most one event may "
                  "hold), or a corrupt stretch that long")
        return SKIPPING + buf[-SKIP_TAIL_BYTES:]
    cut = m.start() + 1
    cols.warn(f"skipped {cut:,} bytes that do not parse as trace events")
    return buf[cut:].lstrip(b" \t\r\n,")
