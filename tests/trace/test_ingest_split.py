"""load_trace(split=True): a helper process decodes the first part of the event array, this process the
rest; the Trace equals the one-process load to the last value, and any doubt about the split falls back."""

import gzip
import io
import json
import threading
from pathlib import Path

import numpy as np
import pytest

from diagnostics.trace import ingest
from diagnostics.trace import load_trace
from diagnostics.trace._chunks import BOUNDARY

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
PUBLIC = [DATA / "public" / "hta" / "ns_resolution_rank0.json.gz",
          DATA / "public" / "tracelens" / "mi300_resnet_rccl_no_pyfn.json.gz",
          DATA / "with_stack" / "vllm_prefilldecode_piecewise.json.gz",
          DATA / "gpu_small.json"]


def _same(a, b):
    assert len(a) == len(b)
    assert set(a.columns) == set(b.columns)
    for k in a.columns:
        x, y = a.columns[k], b.columns[k]
        assert x.dtype == y.dtype, k
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), k
    for k in a.tables:
        assert list(a.tables[k]) == list(b.tables[k]), k
    assert (a.meta, a.warnings, a.skipped_events, a.process_names, a.thread_names, a.n_bytes, a.origin_us) == \
           (b.meta, b.warnings, b.skipped_events, b.process_names, b.thread_names, b.n_bytes, b.origin_us)


@pytest.fixture
def small_split(monkeypatch):
    """Split traces of any size (the helper is told its target; the size floor is this process' choice)."""
    monkeypatch.setattr(ingest, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(ingest, "_cores", lambda: 2)


def _split(path):
    """The split load itself (None: it fell back), and the one-process load."""
    path = Path(path)
    return ingest._load_split(path, path.name, path.stat().st_size, False), load_trace(path)


@pytest.mark.parametrize("path", PUBLIC, ids=lambda p: p.name)
def test_split_equals_one_process_on_public_traces(small_split, path):
    split, whole = _split(path)
    assert split is not None, "the split load fell back on a clean trace"
    _same(split, whole)
    _same(load_trace(path, split=True), whole)


def test_split_point_is_an_event_boundary_past_the_target(small_split, tmp_path):
    """Both processes find the same boundary: the first `}` `,` `{` at or after the target, whatever the
    blocks they read (the helper reads the whole small file in one block, this one from the target)."""
    doc = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1}
                           for i in range(400)]}
    p = tmp_path / "t.json"
    p.write_bytes(json.dumps(doc, indent=1).encode())
    data = p.read_bytes()
    target = len(data) // 2
    parts = []
    end = ingest.first_part(p, target, parts.append)
    m = BOUNDARY.search(data, target)
    assert end == {"end": True, "clean": True, "split": m.start()}
    names = [n for part in parts for n in part["tables"]["name"]]
    # the helper's events are exactly those that end at or before the split
    assert names == [f"op{i}" for i in range(data[:m.start() + 1].count(b'"name"'))]
    split, whole = _split(p)
    _same(split, whole)


def test_helper_decodes_block_by_block_before_the_target(monkeypatch, tmp_path):
    """Blocks wholly before the target are decoded as load_trace does (consume_block), their columns emitted
    as they are made; the helper's events then equal the one-process load's first events."""
    monkeypatch.setattr(ingest, "BLOCK_BYTES", 700)
    doc = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": f"k{i % 7}", "pid": 0, "tid": 7, "ts": 10 * i,
                            "dur": 3, "args": {"device": 0, "stream": 7, "correlation": i, "grid": [i % 3 + 1, 1, 1]}}
                           for i in range(300)]}
    p = tmp_path / "k.json"
    p.write_text(json.dumps(doc))
    data = p.read_bytes()
    target = int(len(data) * 0.6)
    parts = []
    end = ingest.first_part(p, target, parts.append)
    assert end["clean"] is True and len(parts) > 5   # many blocks before the target
    merged = ingest._Merger()
    for part in parts:
        merged.add(part)
    n = merged.n
    assert n == data[:end["split"] + 1].count(b'"ph"')
    corr = np.concatenate(merged.arrays["corr"])
    assert corr.tolist() == list(range(n))
    whole = load_trace(p)
    assert whole.column("corr")[:n].tolist() == corr.tolist()


def test_a_boundary_inside_a_string_is_not_a_split(small_split, tmp_path):
    """`}, {` inside an event's name at the target: the helper's last events do not decode as a whole, it says
    so, and the trace is read by one process: the same Trace, nothing skipped."""
    evs = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(200)]
    evs[100]["name"] = "a}, {b" * 50
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"traceEvents": evs}))
    data = p.read_bytes()
    target = data.index(b"a}, {b") + 1   # the first match at or after it is inside the string
    assert ingest.first_part(p, target, lambda part: None)["clean"] is False
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ingest, "_split_target", lambda decoded, is_gz: target)
        split, whole = _split(p)
        assert split is None
        t = load_trace(p, split=True)
    _same(t, whole)
    assert t.skipped_events == 0 and "a}, {b" in t.tables["name"][t.columns["name"][100]]


def test_bad_events_in_either_part_count_as_in_one_process(small_split, tmp_path):
    evs = [json.dumps({"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1})
           for i in range(200)]
    evs[20] = '{"ph": "X", "name": "bad", "ts": "soon"}'    # wrong type: skipped and counted
    evs[180] = '{"ph": "X", "name": "bad2", "ts": [1]}'
    p = tmp_path / "bad.json"
    p.write_text('{"traceEvents": [' + ",\n".join(evs) + "]}")
    split, whole = _split(p)
    assert whole.skipped_events == 2
    _same(load_trace(p, split=True), whole)


def test_gz_and_truncated(small_split, tmp_path):
    evs = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(500)]
    raw = json.dumps({"traceEvents": evs, "traceName": "x"}).encode()
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(raw))
    split, whole = _split(gz)
    assert split is not None
    _same(split, whole)
    assert split.meta == {"traceName": "x"}
    cut = tmp_path / "cut.json"
    cut.write_bytes(raw[: int(len(raw) * 0.8)])
    with pytest.raises(ingest.TraceError, match="truncated"):
        load_trace(cut, split=True)
    _same(load_trace(cut, split=True, allow_truncated=True), load_trace(cut, allow_truncated=True))


def test_a_failing_helper_falls_back(small_split, monkeypatch):
    """A helper that cannot run (here: an interpreter that exits 1) costs the speed-up only."""
    monkeypatch.setattr(ingest.sys, "executable", "/bin/false")
    path = PUBLIC[0]
    split, whole = _split(path)
    assert split is None
    _same(load_trace(path, split=True), whole)


def test_helpers_start_before_the_header_is_read_and_one_ending_inside_it_is_not_used(small_split, monkeypatch,
                                                                                   tmp_path):
    """The helper starts first (its interpreter starts while this process inflates its first block); its part is
    measured from the file's start. A header past the helper's share (a trace whose other keys come first and
    outweigh its events): the helper is not used, and the Trace is the one-process one."""
    order = []
    start_helper, header = ingest._start_helper, ingest._header
    monkeypatch.setattr(ingest, "_start_helper", lambda *a: order.append("helper") or start_helper(*a))
    monkeypatch.setattr(ingest, "_header", lambda *a: order.append("header") or header(*a))
    path = PUBLIC[0]
    split, whole = _split(path)
    assert split is not None and order[:2] == ["helper", "header"]
    _same(split, whole)
    evs = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(50)]
    p = tmp_path / "late.json"
    p.write_text(json.dumps({"deviceProperties": [{"name": "x" * 20000}], "traceEvents": evs}))
    assert ingest._split_targets(p.stat().st_size, False, 1)[0] < p.read_bytes().index(b"traceEvents")
    split, whole = _split(p)
    assert split is None
    _same(load_trace(p, split=True), whole)


def test_small_traces_and_one_core_are_not_split(monkeypatch):
    path = PUBLIC[0]
    assert ingest._load_split(path, path.name, path.stat().st_size, False) is None   # under SPLIT_MIN_BYTES
    started = []
    monkeypatch.setattr(ingest, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(ingest, "_cores", lambda: 1)
    monkeypatch.setattr(ingest, "_start_helper", lambda *a: started.append(a))
    load_trace(path, split=True)
    assert started == []


# ---- what crosses from the helper is data, checked ---------------------------------------------

def _records(parts, end):
    out = io.BytesIO()
    for part in parts:
        ingest.write_part(part, out)
    ingest.write_record(out, end)
    return out.getvalue()


def test_records_round_trip_and_reject_what_is_off():
    cols = ingest.Columns()
    cols.add(ingest._decode_events(b'[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":2,'
                                   b'"args":{"grid":[4,1,1],"stream":7,"device":0}},'
                                   b'{"ph":"M","name":"process_name","pid":0,"args":{"name":"GPU 0"}}]'))
    part = cols.export()
    end = {"end": True, "clean": True, "split": 123}
    parts, got_end = ingest.read_records(_records([part], end))
    assert {k: got_end[k] for k in end} == end and len(parts) == 1
    got = parts[0]
    assert got["tables"]["grid"] == [(4, 1, 1)] and got["meta_events"] == [("process_name", 0, -1, "GPU 0")]
    for k, a in part["arrays"].items():
        assert got["arrays"][k].dtype == a.dtype and np.array_equal(got["arrays"][k], a, equal_nan=True), k

    def broken(edit):
        blob = bytearray(_records([part], end))
        size = int.from_bytes(blob[:8], "little")
        head = json.loads(blob[8:8 + size])
        edit(head)
        new = json.dumps(head).encode()
        return ingest.read_records(bytes(len(new).to_bytes(8, "little")) + new + bytes(blob[8 + size:]))

    assert broken(lambda h: h["arrays"].__setitem__(0, [h["arrays"][0][0], "<f8", h["n"]]))[1] is None  # dtype
    assert broken(lambda h: h.__setitem__("n", h["n"] + 1))[1] is None                                # lengths
    assert broken(lambda h: h["tables"].__setitem__("name", []))[1] is None          # a code past its table
    assert broken(lambda h: h["tables"].__setitem__("name", "k"))[1] is None         # a table not a list
    assert broken(lambda h: h["arrays"].__setitem__(0, [h["arrays"][0][0]]))[1] is None   # a spec cut short
    assert broken(lambda h: h["arrays"].__setitem__(0, [h["arrays"][0][0], "no-such-dtype", h["n"]]))[1] is None
    assert broken(lambda h: h["tables"].__setitem__("grid", [4]))[1] is None          # a launch shape not a list
    assert ingest.read_records(_records([part], end)[:-40])[1] is None                # cut short
    assert ingest.read_records(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")[1] is None   # not JSON


def test_the_trace_job_splits_and_its_result_equals_one_process(tmp_path, monkeypatch):
    """The Trace explorer's job opens its trace with split=True (a helper started; here at any size), and its
    result equals the job's with the trace read by one process; the trace cache's entry, written beside the
    later views, is whole when the job returns (a second open reads it)."""
    from diagnostics.analyses.trace.job import analyze
    from diagnostics.results import to_plain

    class Ctx:
        artifact_dir = tmp_path / "art"

        def progress(self, fraction, message=""):
            pass

    Ctx.artifact_dir.mkdir()
    path = str(PUBLIC[0])

    def run(data, split_min):
        monkeypatch.setenv("TORCHSCOPE_DATA_DIR", str(tmp_path / data))
        monkeypatch.setattr(ingest, "SPLIT_MIN_BYTES", split_min)
        return analyze(Ctx(), {"path": path, "keep_columns": True})

    started = []
    real = ingest._start_helper
    monkeypatch.setattr(ingest, "_cores", lambda: 2)
    monkeypatch.setattr(ingest, "_start_helper", lambda *a: started.append(a) or real(*a))
    split = run("a", 0)
    assert len(started) == 1
    whole = run("b", 1 << 40)
    assert len(started) == 1
    a, b = to_plain(split), to_plain(whole)
    for d in (a, b):
        d.pop("trace_cache", None)
        d.pop("columns_dir", None)
    assert a == b
    monkeypatch.setenv("TORCHSCOPE_DATA_DIR", str(tmp_path / "a"))   # the split run's cache
    again = analyze(Ctx(), {"path": path, "keep_columns": True, "top": 11})   # other options: not the stored result
    assert again.trace_cache.hit is True


def test_bad_files_say_the_same_with_split(small_split, tmp_path):
    """A file too short for a gzip trailer, a non-trace JSON, an empty array: the error load_trace gives alone."""
    cases = {"tiny.json.gz": b"\x1f\x8b\x08", "other.json": b'{"a": 1}', "empty.json": b'{"traceEvents": []}'}
    for name, data in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(ingest.TraceError) as alone:
            load_trace(p)
        with pytest.raises(ingest.TraceError) as split:
            load_trace(p, split=True)
        assert str(split.value) == str(alone.value), name


@pytest.mark.parametrize("path", PUBLIC, ids=lambda p: p.name)
def test_columns_joined_by_two_threads_equal_those_joined_by_one(monkeypatch, path):
    """A big trace's column chunks are joined by two threads (ingest._joined): the same Trace as one
    thread's join, in small blocks (many chunks per column)."""
    monkeypatch.setattr(ingest, "BLOCK_BYTES", 1 << 16)
    one = load_trace(path)
    monkeypatch.setattr(ingest, "JOIN_THREADS_MIN_BYTES", 0)
    monkeypatch.setattr(ingest, "_cores", lambda: 2)
    seen = []
    real = ingest.np.concatenate
    monkeypatch.setattr(ingest.np, "concatenate", lambda parts, *a, **k: (
        seen.append(threading.current_thread().name), real(parts, *a, **k))[1])
    _same(load_trace(path), one)
    assert any(n.startswith("torchscope-join") for n in seen)


@pytest.mark.parametrize("path", PUBLIC, ids=lambda p: p.name)
def test_a_json_is_read_by_one_helper_per_spare_core(small_split, monkeypatch, tmp_path, path):
    """On four cores a .json is read by three helpers and this process: the first helper from the array's
    start, the others each from the first event boundary at or after the part before theirs ends, all four
    parts chained boundary to boundary. The same Trace as one process, to the last value; a .gz keeps one
    helper (a second would inflate everything before its part again)."""
    monkeypatch.setattr(ingest, "_cores", lambda: 4)
    p = tmp_path / path.name.removesuffix(".gz")
    p.write_bytes(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())
    started = []
    real = ingest._start_helper
    monkeypatch.setattr(ingest, "_start_helper", lambda *a: started.append(a) or real(*a))
    split, whole = _split(p)
    assert split is not None, "the split load fell back on a clean trace"
    _same(split, whole)
    targets = [a[1] for a in started]
    assert len(started) == 3 and targets == sorted(targets)
    assert [a[3] if len(a) > 3 else None for a in started] == [None] + targets[:-1]
    if path.suffix == ".gz":
        started.clear()
        _same(ingest._load_split(path, path.name, path.stat().st_size, False), load_trace(path))
        assert len(started) == 1


def test_a_middle_helper_starting_inside_a_string_is_not_clean(tmp_path):
    """A middle part's helper begins after the first `}, {` at or after its start: one inside a name is no
    event boundary, its first events do not decode, and it says so (the caller then reads the trace alone)."""
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1}
              for i in range(300)]
    events[150]["name"] = "a}, {b" + "x" * 50
    p = tmp_path / "t.json"
    p.write_bytes(json.dumps({"traceEvents": events}).encode())
    data = p.read_bytes()
    inside = data.index(b"a}, {b")
    end = ingest.first_part(p, len(data) - 200, lambda part: None, start=inside - 5)
    assert end["clean"] is False
    ok = ingest.first_part(p, len(data) - 200, lambda part: None, start=inside + 20)
    assert ok["clean"] is True and ok["from"] == BOUNDARY.search(data, inside + 20).start()
