"""Events read with their args, streaming: named_events(path, names) -> the complete events of the
given names, in file order, each as the profiler wrote it (ph, cat, name, pid, tid, ts, dur, args).

The columnar ingest keeps no args beyond the few the views read (for speed and memory), and decoding
every event's args would cost every trace their memory. What reads args reads them here, the trace
file's one second pass: the collectives' (message sizes, sequence numbers, process groups: the
"Collective name", "In msg nelems", "Seq", "Process Group Name" of record_param_comms and NCCL
kernels, "Input Dims" of gloo annotations) and the operators' input shapes the profiler's timeline
shows. This pass reads the file again in blocks (the ingest's reader: gunzipped as it does), finds the
events whose "name" is one of ``names`` by a substring search per name, and decodes only those (each
from its own bytes): memory is one block, time a fraction of the parse. The caller passes names the trace's columns hold (for
collectives: classify.is_comm over the name table, so the rule is classify's).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import orjson

from diagnostics.trace._chunks import last_boundary
from diagnostics.trace.errors import TraceError
from diagnostics.trace.ingest import _open_blocks

#: An event found by name is searched for its opening brace this many braces back at most (a trace
#: writer that puts nested objects before "name"); past that it is counted as unreadable.
MAX_BRACES_BACK = 8
_DECODER = json.JSONDecoder()
#: Bytes after the name decoded at first (an event with larger args: four times more, and so on).
WINDOW_BYTES = 4096
#: Closing braces after the name at which an event is first tried as a whole object (orjson, exact
#: bytes: an event closes its args, then itself); past them the window decode above takes over.
FAST_CLOSES = 8


#: What stands before a name's string when it is the event's "name" (not an arg's value).
_NAME_KEY = re.compile(rb'"name"\s*:\s*$')


def _needles(names) -> list[tuple[bytes, str]]:
    """Each name as JSON writes it, quotes included (escapes too), with the name itself."""
    return [(json.dumps(str(n)).encode(), str(n)) for n in sorted({str(n) for n in names if n})]


def _find(buf: bytes, needles: list, end: int) -> list[tuple[int, str]]:
    """(position of the "name" key, name) of every event named one of ``needles``, in file order:
    a plain substring search per name (memchr speed), each hit checked to follow a "name" key."""
    hits = []
    for needle, name in needles:
        at = buf.find(needle, 0, end)
        while at >= 0:
            key = _NAME_KEY.search(buf, max(0, at - 32), at)
            if key is not None:
                hits.append((key.start(), name))
            at = buf.find(needle, at + len(needle), end)
    hits.sort()
    return hits


def _event_at(buf: bytes, pos: int, name: str) -> dict | None:
    """The JSON object holding the "name" key found at ``pos`` (its own name ``name``), or None.
    Only the bytes around it are decoded: up to one of the next closing braces (``_closed_at``), else
    a window after it that grows until the object fits."""
    start = pos
    for _ in range(MAX_BRACES_BACK):
        start = buf.rfind(b"{", 0, start)
        if start < 0:
            return None
        obj = _closed_at(buf, start, pos)
        if isinstance(obj, dict) and obj.get("name") == name:
            return obj
        window = WINDOW_BYTES
        while True:
            text = buf[start:pos + window].decode("utf-8", "replace")
            try:
                obj, end = _DECODER.raw_decode(text)
                break
            except ValueError:
                if pos + window >= len(buf):
                    obj = None
                    break
                window *= 4
        if isinstance(obj, dict) and obj.get("name") == name:
            return obj
    return None


def _closed_at(buf: bytes, start: int, pos: int):
    """The object that opens at ``start`` if it closes at one of the FAST_CLOSES braces after ``pos``
    (decoded by orjson from exactly its bytes), else None."""
    end = pos
    for _ in range(FAST_CLOSES):
        end = buf.find(b"}", end + 1)
        if end < 0:
            return None
        try:
            return orjson.loads(buf[start:end + 1])
        except orjson.JSONDecodeError:
            continue
    return None


def named_events(path, names) -> tuple[list[dict], int]:
    """(events, unreadable): the complete ("ph": "X") events of ``path`` whose name is in ``names``,
    in file order, as dicts (args included), and how many name matches could not be decoded.

    Raises TraceError for a file that cannot be read (as load_trace would)."""
    pattern = _needles(names)
    if not pattern:
        return [], 0
    blocks, _ = _open_blocks(Path(path))
    out: list[dict] = []
    bad = 0
    carry = b""
    try:
        for block in blocks:
            buf = carry + block if carry else block
            cut = last_boundary(buf)
            if cut < 0:
                carry = buf
                continue
            bad += _scan(buf, cut + 1, pattern, out)
            carry = buf[cut + 1:]
        if carry:
            bad += _scan(carry, len(carry), pattern, out)
    except TraceError:
        raise
    except OSError as e:
        raise TraceError(f"{Path(path).name}: cannot read ({e})") from None
    finally:
        blocks.close()
    return out, bad


def _scan(buf: bytes, end: int, needles: list, out: list) -> int:
    """The events named one of ``needles`` whose name lies in buf[:end] (whole events: end is a boundary)."""
    bad = 0
    for pos, name in _find(buf, needles, end):
        ev = _event_at(buf, pos, name)
        if ev is None:
            bad += 1
            continue
        dur, ts = ev.get("dur"), ev.get("ts")
        if ev.get("ph") != "X" or not isinstance(dur, (int, float)) or dur < 0 or not isinstance(ts, (int, float)):
            continue
        out.append(ev)
    return bad
