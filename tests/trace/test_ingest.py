"""load_trace: recorded and hand-written traces, chunk boundaries, workers, and bad input."""

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from diagnostics.errors import TorchScopeError
from diagnostics.trace import _chunks, ingest
from diagnostics.trace import TraceError, load_trace

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
GPU = DATA / "gpu_small.json"
CPU = DATA / "cpu_small.pt.trace.json.gz"


def _events(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _write(tmp_path, name, doc_or_text):
    p = tmp_path / name
    p.write_text(doc_or_text if isinstance(doc_or_text, str) else json.dumps(doc_or_text))
    return p


def _x(name, ts, dur, **extra):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            **extra}


def test_gpu_trace_columns_and_metadata():
    t = load_trace(GPU)
    ev = t.events
    assert len(ev) == 41
    assert t.rank == 0
    assert t.meta["deviceProperties"][0]["name"] == "NVIDIA A100-SXM4-40GB"
    assert t.meta["baseTimeNanoseconds"] == 1700000000000000000
    assert "traceEvents" not in t.meta
    assert t.origin_us == 995.0   # the profiler's frame span starts first
    step1 = ev[ev["name"] == "ProfilerStep#1"].iloc[0]
    assert (step1["ts"], step1["dur"]) == (5.0, 100.0)
    k = ev[ev["name"] == "ampere_sgemm_128x64_nn"]
    assert k["corr"].tolist() == [11, 21, 22]
    assert k["stream"].tolist() == [7, 7, 7] and k["device"].tolist() == [0, 0, 0]
    assert ev.loc[ev["cat"] == "cudaLaunchKernel", "corr"].empty
    mem = ev[ev["name"] == "[memory]"]
    assert mem["nbytes"].tolist() == [4096, -4096]
    assert mem["total_allocated"].tolist() == [4096, 0]
    assert mem["device_type"].tolist() == [1, 1] and mem["device"].tolist() == [0, 0]
    flows = ev[ev["cat"] == "ac2g"]
    assert sorted(flows["flow_id"].tolist()) == [11, 11, 12, 12, 14, 14]
    assert t.thread_names["100/100"] == "thread 100 (python)"
    assert t.process_names["0"] == "python"
    assert t.skipped_events == 0 and t.warnings == []


def test_kernel_launch_and_autograd_args_are_kept():
    ev = load_trace(GPU).events
    k = ev[ev["cat"] == "kernel"]
    assert set(k["grid"]) == {"64×1×1"} and set(k["block"]) == {"128×1×1"}
    assert set(k["registers"]) == {128} and set(k["occupancy"]) == {12.0}
    host = ev[ev["cat"] != "kernel"]
    assert host["grid"].isna().all() and (host["registers"] == -1).all() and host["occupancy"].isna().all()
    raw = _events(CPU)
    cpu = load_trace(CPU).events
    assert cpu["seq"].tolist() == [(e.get("args") or {}).get("Sequence number", -1) for e in raw]
    assert cpu["fwd_tid"].tolist() == [(e.get("args") or {}).get("Fwd thread id", -1) for e in raw]
    assert (cpu["fwd_tid"] > 0).any() and (cpu["seq"] >= 0).any()


def test_launch_dims_survive_slices(tmp_path, monkeypatch):
    """Each slice interns its own grid table; the merge re-codes them (absent stays absent)."""
    doc = json.loads(GPU.read_text())
    for i, e in enumerate(doc["traceEvents"]):
        if e.get("cat") == "kernel":
            e["args"]["grid"] = [i, 1, 1]
    path = _write(tmp_path, "g.json", json.dumps(doc, indent=1))
    whole = load_trace(path)
    monkeypatch.setattr(ingest, "BLOCK_BYTES", 600)
    small = load_trace(path)
    assert small.strings("grid").tolist() == whole.strings("grid").tolist()
    kernels = whole.events["cat"] == "kernel"
    assert whole.strings("grid")[kernels.to_numpy()].tolist() == ["20×1×1", "21×1×1", "23×1×1", "37×1×1", "38×1×1"]
    assert set(whole.strings("grid")[~kernels.to_numpy()]) == {""}


def test_odd_launch_args_fall_back_to_the_lenient_decoder(tmp_path):
    k = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.0, "dur": 2.0}
    evs = [dict(k, args={"grid": [2, 1, 1], "block": [32, 1, 1], "registers per thread": 16}),
           dict(k, ts=5.0, args={"grid": "2x1x1", "block": [32, 1.5, 1], "registers per thread": "16",
                                 "est. achieved occupancy %": 50, "Sequence number": "7"})]
    ev = load_trace(_write(tmp_path, "k.json", {"traceEvents": evs})).events
    assert ev["grid"].tolist()[0] == "2×1×1" and ev["grid"].isna().tolist() == [False, True]
    assert ev["block"].isna().tolist() == [False, True]
    assert ev["registers"].tolist() == [16, 16] and ev["occupancy"].isna().tolist() == [True, False]
    assert ev["seq"].tolist() == [-1, 7]


def test_recorded_cpu_trace_gz_matches_json_module():
    t = load_trace(CPU)
    raw = _events(CPU)
    assert len(t) == len(raw)
    want = Counter(e.get("cat", "") for e in raw)
    got = Counter(t.strings("cat").tolist())
    assert got == want
    assert t.rank is None   # recorded without distributed info
    x = [e for e in raw if e.get("ph") == "X"]
    assert np.isclose(t.events["dur"].sum(), sum(e["dur"] for e in x))
    origin = min(e["ts"] for e in raw if e.get("ph") != "M")
    assert np.isclose(t.events["ts"].max(), max(e["ts"] for e in raw) - origin)


def test_plain_and_bare_array_and_compact_forms_agree(tmp_path):
    raw = _events(CPU)
    a = load_trace(_write(tmp_path, "a.json", json.dumps({"traceEvents": raw}, indent=2)))
    b = load_trace(_write(tmp_path, "b.json", json.dumps(raw, separators=(",", ":"))))
    assert len(a) == len(b) == len(raw)
    assert np.array_equal(a.events["ts"], b.events["ts"])
    assert a.strings("name").tolist() == b.strings("name").tolist()
    assert b.meta == {}


def test_tiny_blocks_cut_everywhere(tmp_path, monkeypatch):
    """Blocks far smaller than an event, a string holding '}, {', escapes: same result."""
    raw = _events(CPU)
    raw.insert(5, _x('weird }, { "name" \\ }', 1.0, 2.0, args={"note": "}, {"}))
    path = _write(tmp_path, "t.json", json.dumps({"traceEvents": raw, "traceName": "x"}, indent=1))
    whole = load_trace(path)
    monkeypatch.setattr(ingest, "BLOCK_BYTES", 1000)
    small = load_trace(path)
    assert len(small) == len(whole) == len(raw)
    assert small.skipped_events == 0
    assert small.strings("name").tolist() == whole.strings("name").tolist()
    assert np.array_equal(small.events["ts"], whole.events["ts"])
    assert 'weird }, { "name" \\ }' in set(small.strings("name"))
    assert small.meta == {"traceName": "x"}


def test_trace_error_is_a_torchscope_error():
    assert issubclass(TraceError, TorchScopeError)


@pytest.mark.parametrize("content, fragment", [
    ("", "empty"),
    ("hello", "not a JSON trace"),
    ('{"foo": 1, "bar": [1, 2]}', "no traceEvents"),
    ('{"traceEvents": []}', "the trace holds no events: its event array is empty or holds no JSON objects"),
    ("[1, 2, 3]", "the trace holds no events: its event array is empty or holds no JSON objects"),
    ('{"traceEvents": {"ph": "X"}}', "not a trace: its traceEvents is an object, not an array of events"),
    ('{"traceEvents": [{"ph": "X", "name": "a", "ts": "soon", "dur": 1}, {"ph": "X", "name": "b", "dur": 1}]}',
     "none of its 2 events could be read"),
    ('{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "ts": 0}]}',
     "only metadata"),
    ('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}, {"ph": "X", "na',
     "truncated"),
    ('{"schemaVersion": 1, "deviceProp', "truncated"),
    ('{"traceEvents": [{"name": "a"}, {"name": "b"}]}', "could be read"),
])
def test_bad_input_raises_clear_errors(tmp_path, content, fragment):
    with pytest.raises(TraceError, match=fragment):
        load_trace(_write(tmp_path, "bad.json", content))


def test_missing_file_and_not_gzip(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "nope.json")
    p = _write(tmp_path, "x.pt.trace.json.gz", '{"traceEvents": []}')
    with pytest.raises(TraceError, match="not gzip"):
        load_trace(p)


def test_truncated_gzip(tmp_path):
    data = gzip.compress(json.dumps({"traceEvents": _events(CPU)}).encode())
    p = tmp_path / "cut.json.gz"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="truncated"):
        load_trace(p)


def test_truncated_json_can_be_loaded_partially(tmp_path):
    text = json.dumps({"traceEvents": [_x("a", 1, 2), _x("b", 4, 2), _x("c", 7, 2)]})
    p = _write(tmp_path, "cut.json", text[: text.index('"c"') + 5])
    with pytest.raises(TraceError, match="truncated"):
        load_trace(p)
    t = load_trace(p, allow_truncated=True)
    assert t.strings("name").tolist() == ["a", "b"]
    assert any("truncated" in w for w in t.warnings)


def test_odd_fields_are_coerced_or_counted(tmp_path):
    events = [
        _x("ok", 1, 2),
        _x("string ts", "3.5", "1"),               # numbers as strings: read
        {"ph": "X", "name": "null args", "ts": 5, "dur": 1, "args": None, "pid": 1, "tid": 1},
        {"ph": "X", "name": "float pid", "ts": 6, "dur": 1, "pid": 1.5, "tid": [1]},
        {"ph": "X", "name": "no ts", "dur": 1},      # skipped
        {"ph": "X", "name": "bad ts", "ts": {"x": 1}, "dur": 1},  # skipped
        7,                                            # not an object: skipped
        _x("last", 9, 1),
    ]
    t = load_trace(_write(tmp_path, "odd.json", {"traceEvents": events}))
    assert t.strings("name").tolist() == ["ok", "string ts", "null args", "float pid", "last"]
    assert t.events["ts"].tolist() == [0.0, 2.5, 4.0, 5.0, 8.0]
    assert t.skipped_events == 3
    assert t.warnings[0] == "skipped 3 malformed events"


def test_corrupt_stretch_is_skipped_with_bounded_memory(tmp_path, monkeypatch):
    good = ",".join(json.dumps(_x(f"op{i}", i * 10, 5)) for i in range(200))
    junk = '{"ph": "X", "name": "broken", "ts": 1, "args": {"a": "unterminated}, ' + "x" * 5000
    p = _write(tmp_path, "junk.json", '{"traceEvents": [' + junk + ", " + good + "]}")
    monkeypatch.setattr(ingest, "BLOCK_BYTES", 2000)
    monkeypatch.setattr(_chunks, "MAX_EVENT_BYTES", 4000)
    t = load_trace(p)
    assert t.skipped_events >= 1
    assert 150 <= len(t) <= 200
    assert t.strings("name")[-1] == "op199"


def test_one_event_larger_than_the_limit_is_skipped_not_called_truncated(tmp_path, monkeypatch):
    """An event bigger than MAX_EVENT_BYTES (1 GiB in the field; 4 kB here) is skipped and named;
    the events after it are read and the trace is not called truncated."""
    huge = json.dumps(_x("huge", 5, 1, args={"blob": "x" * 20000}))
    after = ",".join(json.dumps(_x(f"op{i}", 100 + i * 10, 5)) for i in range(50))
    p = _write(tmp_path, "huge.json", '{"traceEvents": [' + json.dumps(_x("first", 0, 1)) + ", " + huge + ", "
               + after + "]}")
    monkeypatch.setattr(ingest, "BLOCK_BYTES", 2000)
    monkeypatch.setattr(_chunks, "MAX_EVENT_BYTES", 4000)
    t = load_trace(p)
    names = list(t.strings("name"))
    assert "huge" not in names and names[-1] == "op49" and len(names) >= 50
    assert t.skipped_events == 1
    assert any("larger than" in w for w in t.warnings) and not any("truncated" in w for w in t.warnings)


def test_a_whitespace_gzip_bomb_is_refused_as_a_bomb(tmp_path, monkeypatch):
    """Megabytes of spaces inside the array gzip a thousand-fold: refused by name, never read as events."""
    body = b'{"traceEvents": [' + json.dumps(_x("a", 0, 1)).encode() + b"," + b" " * (8 << 20) + b"]}"
    p = tmp_path / "bomb.json.gz"
    p.write_bytes(gzip.compress(body, 9))
    monkeypatch.setattr(ingest, "GZ_BOMB_MIN_BYTES", 1 << 20)
    with pytest.raises(TraceError, match=r"a decompression bomb, not a trace; refused"):
        load_trace(p)


def test_whitespace_between_events_is_json_not_corruption(tmp_path, monkeypatch):
    doc = '{"traceEvents": [' + json.dumps(_x("a", 0, 1)) + "," + " " * 9000 + json.dumps(_x("b", 5, 1)) + "]}"
    monkeypatch.setattr(ingest, "BLOCK_BYTES", 2000)
    monkeypatch.setattr(_chunks, "MAX_EVENT_BYTES", 4000)
    t = load_trace(_write(tmp_path, "ws.json", doc))
    assert list(t.strings("name")) == ["a", "b"] and t.skipped_events == 0


def test_an_absurd_timestamp_prints_as_a_short_duration():
    from diagnostics.render.text import _ms

    assert _ms(1e308) == "1e+305 ms" and _ms(1500.0) == "1.500 ms" and _ms(None) == "-"


def test_wide_integers_from_real_files_are_kept(tmp_path):
    """Real traces carry ids and streams past int32 (issue #31: HTA's critical-path captures hold
    "stream": 4294967295, a uint32 -1, on their cuda_sync events; ingest raised OverflowError).
    Streams and devices are read as int64, pids and tids as strings; a value past int64 (a uint64 -1)
    is read as absent and said in a warning, never a crash."""
    k = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "dur": 2.0}
    evs = [
        dict(k, ts=1.0, args={"stream": 4294967295, "device": 0, "correlation": 2**62, "External id": 2**63 - 1}),
        dict(k, ts=4.0, args={"stream": 2**40, "device": 2**33, "registers per thread": 70000}),
        dict(k, ts=7.0, args={"stream": 2**64 - 1, "device": 0}),
        {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": "rank0 GPU", "tid": 2**40, "ts": 9.0,
         "dur": 1.0, "args": {"stream": 4294967295, "device": 0}},
        {"ph": "X", "cat": "cpu_op", "name": "op", "pid": "worker-3", "tid": 4294967295, "ts": 10.0, "dur": 1.0,
         "args": {"Fwd thread id": 2**40, "Sequence number": 2**50}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 11.0, "s": "t",
         "args": {"Device Type": 300, "Device Id": 2**35, "Bytes": 2**62, "Total Allocated": 2**62}},
    ]
    t = load_trace(_write(tmp_path, "wide.json", {"traceEvents": evs}))
    ev = t.events
    assert ev["stream"].tolist()[:4] == [4294967295, 2**40, -1, 4294967295]
    assert ev["device"].tolist()[:4] == [0, 2**33, 0, 0]
    assert ev["corr"].iat[0] == 2**62 and ev["ext_id"].iat[0] == 2**63 - 1
    assert ev["fwd_tid"].iat[4] == 2**40 and ev["seq"].iat[4] == 2**50
    assert ev["nbytes"].iat[5] == 2**62 and ev["device"].iat[5] == 2**35
    assert t.strings("pid").tolist()[3:5] == ["rank0 GPU", "worker-3"]
    assert t.strings("tid").tolist()[3:5] == [str(2**40), "4294967295"]
    # Out of their columns' range: read as absent, each named in a warning.
    assert ev["stream"].iat[2] == -1 and ev["registers"].iat[1] == -1 and ev["device_type"].iat[5] == -1
    text = " ".join(t.warnings)
    for field in ("stream", "registers", "device_type"):
        assert f"'{field}'" in text, (field, t.warnings)


def test_hta_capture_with_a_uint32_stream_opens():
    """The public trace of the report (HTA's critical-path simple_add capture) opens."""
    t = load_trace(DATA / "public" / "hta" / "critical_path_simple_add.json.gz")
    sync = t.events[t.events["cat"] == "cuda_sync"]
    assert (sync["stream"] == 4294967295).any()


def test_times_past_a_physical_bound_are_skipped_and_counted(tmp_path):
    """issue 45, item 6: a dur of INT64_MAX (the trace would last 1.84e16 ms, one event 100 % of the
    self time) or a start a century from the others is an odd event: skipped, counted, said."""
    start = 1_700_000_000_000_000  # epoch microseconds, as torch.profiler writes
    events = [_x("a", start, 10), _x("forever", start + 5, 2**63 - 1), _x("b", start + 20, 30),
              _x("far", start + 10**17, 1), _x("before", -10**18, 1), _x("c", start + 60, 5),
              _x("negative", start + 30, -4), _x("a week", start + 40, 7 * 86400e6 + 1),
              _x("step", start, 7 * 86400e6)]  # the longest an event may last (the public HTA sample's
    t = load_trace(_write(tmp_path, "bound.json", {"traceEvents": events}))  # step outlasts its trace 37x)
    assert t.strings("name").tolist() == ["a", "b", "c", "step"]
    assert t.events["ts"].tolist() == [0.0, 20.0, 60.0, 0.0]
    assert t.events["dur"].tolist() == [10.0, 30.0, 5.0, 7 * 86400e6]
    assert t.skipped_events == 5
    assert t.warnings[0] == "skipped 5 malformed events"
    assert ("skipped 5 events past a physical bound: a negative duration or one over 7 days, or a timestamp past "
            "1e+17 µs") in t.warnings
    only = [_x("forever", start, 2**63 - 1)]
    with pytest.raises(TraceError, match="every timed event is past a physical bound"):
        load_trace(_write(tmp_path, "only.json", {"traceEvents": only}))


def _rocm_copy_events(n):
    """ROCm's runtime copies write "bytes" as a string (TraceLens' xDiT traces: "bytes": "616")."""
    out = []
    for i in range(n):
        out.append({"ph": "X", "cat": "cuda_runtime", "name": "hipMemcpyAsync", "pid": 1, "tid": 1, "ts": 10 * i,
                    "dur": 2, "args": {"External id": i, "correlation": i, "bytes": str(100 + i), "kind": "1"}})
        out.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7, "ts": 10 * i + 3,
                    "dur": 1, "args": {"correlation": i, "device": 0, "stream": 7,
                                       "bytes": str(100 + i) if i % 2 else 100 + i}})
    return out


def test_rocm_string_bytes_decode_on_the_fast_path(tmp_path, monkeypatch):
    """A block holding ROCm's string "bytes" decodes as a whole (issue #42: every block of xDiT's traces went
    event by event, 6x the parse), and a copy's string size reads as the number it writes."""
    slow = []
    monkeypatch.setattr(_chunks.Columns, "add_one_by_one", lambda self, *a: slow.append(a))
    t = load_trace(_write(tmp_path, "rocm.json", {"traceEvents": _rocm_copy_events(50)}))
    assert slow == []
    copies = t.events[t.events["cat"] == "gpu_memcpy"]
    assert copies["nbytes"].tolist() == [100 + i for i in range(50)]
    assert t.skipped_events == 0 and t.warnings == []
    assert [_chunks._copy_bytes(v) for v in (616, "616", "6.5e2", "n/a", "inf")] == [616, 616, 650, -1, -1]


def test_slow_path_decodes_runs_together_and_keeps_every_event_in_order(tmp_path, monkeypatch):
    """A block that fails as a whole: runs of good events are decoded in one call (halved until they decode),
    the bad ones one by one; the same columns, skips and warnings as decoding each event by itself."""
    events = [_x(f"op{i}", i, 1, args={"External id": i}) for i in range(200)]
    events[37] = {"ph": "X", "name": "bad ts", "ts": {"x": 1}, "dur": 1}       # skipped
    events[150] = _x("string ts", "150", "1")                                   # the lenient decoder's
    events.insert(90, 7)                                                         # not an object: skipped
    path = _write(tmp_path, "mixed.json", {"traceEvents": events})
    singles = []
    real = _chunks._decode_event
    monkeypatch.setattr(_chunks, "_decode_event", lambda b: singles.append(1) or real(b))
    batched = load_trace(path)
    assert 2 <= len(singles) <= 4 * _chunks.ONE_BY_ONE   # the runs around the two bad events, not all 200
    monkeypatch.setattr(_chunks, "ONE_BY_ONE", 10 ** 6)   # every event by itself, as before #42
    singles.clear()
    one_by_one = load_trace(path)
    assert len(singles) == 200
    assert batched.events.equals(one_by_one.events)
    assert batched.skipped_events == one_by_one.skipped_events == 2
    assert batched.warnings == one_by_one.warnings
    names = batched.strings("name").tolist()
    assert len(names) == 199 and names[36:38] == ["op36", "op38"] and names[149] == "string ts"


def test_small_pages_turns_numpys_huge_page_request_off_for_the_block_and_puts_it_back():
    """diagnostics.trace.pages.small_pages: inside, numpy makes big arrays without madvise(MADV_HUGEPAGE);
    after it (an error included) the process' setting is what it was, on or off; load_trace leaves it so."""
    from numpy._core import multiarray as ma

    from diagnostics.trace.pages import small_pages

    before = ma._get_madvise_hugepage()
    try:
        for setting in (True, False):
            ma._set_madvise_hugepage(setting)
            with small_pages():
                assert ma._get_madvise_hugepage() is False
            assert ma._get_madvise_hugepage() is setting
            with pytest.raises(ZeroDivisionError), small_pages():
                1 / 0
            assert ma._get_madvise_hugepage() is setting
            load_trace(GPU)
            assert ma._get_madvise_hugepage() is setting
    finally:
        ma._set_madvise_hugepage(before)


def test_small_pages_in_overlapping_threads_put_numpys_setting_back_when_the_last_one_ends():
    """Two blocks open at once in two threads, the first to open ending first: numpy's request stays off
    until the second ends, then is what it was before the first (not the off the second found)."""
    import threading

    from numpy._core import multiarray as ma

    from diagnostics.trace.pages import small_pages

    before = ma._get_madvise_hugepage()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with small_pages():
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second():
        first_in.wait(10)
        with small_pages():
            second_in.set()
            first_out.wait(10)
            seen["inside after the first ended"] = ma._get_madvise_hugepage()

    try:
        ma._set_madvise_hugepage(True)
        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert seen == {"inside after the first ended": False}
        assert ma._get_madvise_hugepage() is True
    finally:
        ma._set_madvise_hugepage(before)
