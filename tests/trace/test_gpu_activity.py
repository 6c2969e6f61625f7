"""Holistic Trace Analysis parity (issue #18 "Beyond"): kernel sequences, launch queue length, memcpy /
memset bandwidth, GPU user annotations, launch delay, comm/comp overlap and HTA's definitions.

Each trace is written the way Kineto writes one ("ph": "X" events, categories kernel / gpu_memcpy /
gpu_memset / gpu_user_annotation / cuda_runtime / cpu_op, args {"correlation", "device", "stream",
"bytes"}). Expected numbers are computed here from the event table by plain loops, or by hand in
the comments, never by the engine's code.
"""

import json

import pytest

from diagnostics.results import to_plain
from diagnostics.trace import idle_time, load_trace
from diagnostics.trace import gpu_activity as hp
from diagnostics.trace.breakdowns import HTA_KERNEL_WAIT_US

T0 = 1_000_000.0
CPU_PID, CPU_TID, DEVICE = 4242, 4242, 0
A, B, C = "gemm_A_kernel", "bias_B_kernel", "relu_C_kernel"
HTOD, DTOH, MEMSET = "Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH (Device -> Pinned)", "Memset (Device)"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"

# (name, cat, stream, corr, launch ts, start, dur, bytes or None)
WORK = [
    (A, "kernel", 7, 1, 1, 10, 10, None),
    (B, "kernel", 7, 2, 3, 21, 5, None),
    (A, "kernel", 7, 3, 5, 30, 10, None),
    (B, "kernel", 7, 4, 7, 41, 5, None),
    (HTOD, "gpu_memcpy", 7, 5, 9, 50, 10, 1_000_000),     # a copy between kernels breaks the run
    (A, "kernel", 7, 6, 11, 61, 10, None),
    (B, "kernel", 7, 7, 13, 72, 5, None),
    (C, "kernel", 7, 8, 15, 80, 2, None),
    # Stream 8 runs B then A while stream 7 runs: interleaved in time, never in one sequence with stream 7's.
    (B, "kernel", 8, 9, 17, 22, 2, None),
    (A, "kernel", 8, 10, 19, 25, 2, None),
    (DTOH, "gpu_memcpy", 9, 11, 20, 90, 4, None),        # no "bytes": not counted
    (MEMSET, "gpu_memset", 9, 12, 21, 96, 2, 4096),
    (HTOD, "gpu_memcpy", 9, 13, 22, 100, 20, 3_000_000),
]
# The CPU operators around the launch calls: corr 1-8 in aten::mm [0, 16), 9-10 in aten::add [16, 20),
# the copies' calls (20-22) in none.
OPS = [("aten::mm", 0, 16), ("aten::add", 16, 4)]
# gpu_user_annotation ranges on device 0, stream 7: (name, start, dur)
ANNOTATIONS = [("forward", 10, 36), ("forward", 61, 16), ("optimizer", 80, 10)]


def _x(cat, name, pid, tid, ts, dur, args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": T0 + ts, "dur": dur, "args": args}


def events(work=WORK, ops=OPS, annotations=ANNOTATIONS, with_bytes=True):
    out = [_x("cpu_op", n, CPU_PID, CPU_TID, s, d, {"External id": 500 + i}) for i, (n, s, d) in enumerate(ops)]
    for name, cat, stream, corr, launch, start, dur, nbytes in work:
        call = "cudaLaunchKernel" if cat == "kernel" else "cudaMemcpyAsync" if "memcpy" in cat else "cudaMemsetAsync"
        out.append(_x("cuda_runtime", call, CPU_PID, CPU_TID, launch, 1, {"correlation": corr, "cbid": 211}))
        args = {"device": DEVICE, "stream": stream, "correlation": corr, "External id": corr}
        if nbytes is not None and with_bytes:
            args["bytes"] = nbytes
            args["memory bandwidth (GB/s)"] = nbytes / (dur * 1e3)
        out.append(_x(cat, name, DEVICE, stream, start, dur, args))
    for name, start, dur in annotations:
        out.append(_x("gpu_user_annotation", name, DEVICE, 7, start, dur, {"device": DEVICE, "stream": 7}))
    return out


def write(tmp_path, evs, name="t.json"):
    meta = [{"name": "process_labels", "ph": "M", "ts": T0, "pid": DEVICE, "tid": 0, "args": {"labels": "GPU 0"}}]
    p = tmp_path / name
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": meta + evs}))
    return p


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return load_trace(write(tmp_path_factory.mktemp("hta"), events()))


# ---- independent computations ---------------------------------------------------------------------

def naive_sequences(work, max_len):
    """{names: (count, gpu time, span)} of runs of consecutive kernels on one stream, seen twice or more."""
    found = {}
    for stream in sorted({w[2] for w in work}):
        evs = sorted((w for w in work if w[2] == stream), key=lambda w: w[5])
        for length in range(2, max_len + 1):
            for i in range(len(evs) - length + 1):
                win = evs[i:i + length]
                if any(w[1] != "kernel" for w in win):
                    continue
                key = tuple(w[0] for w in win)
                c, t, s = found.get(key, (0, 0.0, 0.0))
                found[key] = (c + 1, t + sum(w[6] for w in win), s + (win[-1][5] + win[-1][6] - win[0][5]))
    return {k: v for k, v in found.items() if v[0] >= 2}


def queued_at(work, stream, t, until="kernel_end"):
    """Launched, not yet done GPU events of ``stream`` at time t (after the changes at t)."""
    n = 0
    for w in work:
        if w[2] != stream:
            continue
        done = w[5] + w[6] if until == "kernel_end" else w[5]
        n += (w[4] <= t) - (done <= t)
    return n


def series_value(series, t):
    """The step function of one stream's series at t: the last point at or before t."""
    value = 0
    for tt, q in zip(series["t_us"], series["queued"]):
        if tt <= t:
            value = q
    return value


# ---- 1. kernel sequences ---------------------------------------------------------------------------

def test_kernel_sequences_count_runs_on_one_stream(trace):
    r = to_plain(hp.kernel_sequences(trace, max_len=3))
    # By hand: stream 7 is A B A B [copy] A B C; stream 8 is B A. "A → B" occurs 3 times (stream 8's B at 22 does
    # not join stream 7's run): GPU time 3 x (10 + 5) = 45 µs, spans 16 + 16 + 16 = 48 µs, so 3 µs of gaps.
    # "B → A" occurs twice, once per stream: 15 + 4 = 19 µs over spans 19 + 5 = 24. Every other run occurs once.
    assert [row["kernels"] for row in r["by_time"]] == [[A, B], [B, A]]
    ab, ba = r["by_time"]
    assert (ab["count"], ab["total_us"], ab["span_us"], ab["gap_us"], ab["mean_us"]) == (3, 45.0, 48.0, 3.0, 15.0)
    assert (ba["count"], ba["total_us"], ba["span_us"], ba["gap_us"]) == (2, 19.0, 24.0, 5.0)
    assert ab["sequence"] == f"{A} → {B}" and r["sequences"] == 2 and r["kernels"] == 9
    expected = naive_sequences(WORK, 3)
    assert {tuple(x["kernels"]): (x["count"], x["total_us"], x["span_us"]) for x in r["by_time"]} == expected


def test_kernel_sequences_longer_runs_rank_by_time_and_by_count(tmp_path):
    # One stream: (X Y Z) x 3 with X 1 µs, Y 2 µs, Z 30 µs, back to back from 0.
    names, durs = ["X", "Y", "Z"] * 3, [1, 2, 30] * 3
    work, t = [], 0
    for i, (n, d) in enumerate(zip(names, durs)):
        work.append((n, "kernel", 7, i + 1, 0, t, d, None))
        t += d
    r = to_plain(hp.kernel_sequences(load_trace(write(tmp_path, events(work, [], []))), max_len=3, n=50))
    expected = naive_sequences(work, 3)
    got = {tuple(x["kernels"]): (x["count"], x["total_us"], x["span_us"]) for x in r["by_time"]}
    assert got == expected
    # By hand: X Y Z occurs 3 times (99 µs), Y Z X twice (66), Z X Y twice (66), X Y 3 times (9), Y Z 3 (96),
    # Z X twice (62).
    assert got[("X", "Y", "Z")] == (3, 99.0, 99.0) and got[("Z", "X")] == (2, 62.0, 62.0)
    assert [x["total_us"] for x in r["by_time"]] == sorted((v[1] for v in expected.values()), reverse=True)
    assert r["by_count"][0]["count"] == 3 and r["by_count"][-1]["count"] == 2
    assert to_plain(hp.kernel_sequences(load_trace(write(tmp_path, events(work, [], []), "u.json")), max_len=2))["sequences"] == 3
    with pytest.raises(ValueError, match="max_len must be at least 2"):
        hp.kernel_sequences(load_trace(write(tmp_path, events(work, [], []), "v.json")), max_len=1)


# ---- 2. launch queue length ------------------------------------------------------------------------

@pytest.mark.parametrize("until", ["kernel_end", "kernel_start"])
def test_queue_length_at_given_times(trace, until):
    r = to_plain(hp.queue_length(trace, until=until))
    series = {s["stream"]: s for s in r["series"]}
    for stream in (7, 8, 9):
        for t in (0, 1, 9, 10, 12, 15, 16, 20, 21, 25, 45, 50, 70, 81, 95, 99, 130):
            assert series_value(series[str(stream)], t) == queued_at(WORK, stream, t, until), (stream, t)
    stats = {s["stream"]: s for s in r["streams"]}
    # By hand, until the kernel ends: stream 7 has all 8 launches queued from 15 to 20.
    # Until it starts (HTA): launches at 1..15, starts at 10, 21, ...: 7 queued from 15 to 21.
    assert stats["7"]["max"] == (8 if until == "kernel_end" else 7)
    assert stats["7"]["launches"] == 8 and r["unlinked"] == 0
    # Stream 8: 1 queued on [17, 19), 2 on [19, 24), 1 on [24, 27): mean (2 + 10 + 3) / 10 = 1.5 (until the end).
    if until == "kernel_end":
        assert stats["8"]["mean"] == pytest.approx(1.5) and stats["8"]["span_us"] == 10.0


def test_time_at_a_full_queue_per_stream_and_blocked_time_over_streams(trace):
    # full = 6, until the kernel ends: stream 7 has >= 6 queued from 11 (6th launch) to 40 (3rd end) = 29 µs.
    r = to_plain(hp.queue_length(trace, until="kernel_end", full=6))
    stats = {s["stream"]: s for s in r["streams"]}
    assert stats["7"]["full_us"] == 29.0 and stats["8"]["full_us"] == 0.0 and r["blocked_us"] == 29.0
    # full = 2: stream 7 [3, 77) = 74, stream 8 [19, 24) = 5, stream 9 [21, 98) = 77; their union [3, 98) = 95.
    r = to_plain(hp.queue_length(trace, until="kernel_end", full=2))
    stats = {s["stream"]: s for s in r["streams"]}
    assert (stats["7"]["full_us"], stats["8"]["full_us"], stats["9"]["full_us"]) == (74.0, 5.0, 77.0)
    assert r["blocked_us"] == 95.0
    assert to_plain(hp.queue_length(trace))["blocked_us"] == 0.0   # HTA's 1024: never reached here


def test_queue_leaves_out_work_without_a_launch_call(tmp_path):
    work = [(A, "kernel", 7, 1, 0, 5, 5, None)]
    evs = events(work, [], []) + [_x("kernel", B, DEVICE, 7, 20, 5, {"device": DEVICE, "stream": 7})]
    r = to_plain(hp.queue_length(load_trace(write(tmp_path, evs))))
    assert r["unlinked"] == 1 and r["streams"][0]["launches"] == 1
    assert any("no launch call" in n for n in r["notes"])
    only = [_x("kernel", B, DEVICE, 7, 20, 5, {"device": DEVICE, "stream": 7})]
    r = to_plain(hp.queue_length(load_trace(write(tmp_path, only, "b.json"))))
    assert r["streams"] == [] and r["blocked_us"] is None and "not counted" in r["notes"][0]


# ---- 3. memcpy / memset bandwidth ------------------------------------------------------------------

def test_bandwidth_is_bytes_over_duration_per_direction(trace):
    r = to_plain(hp.memcpy_bandwidth(trace))
    rows = {d["direction"]: d for d in r["directions"]}
    assert set(rows) == {"HtoD", "DtoH", "Memset"}
    h = rows["HtoD"]
    # Two HtoD copies: 1e6 B in 10 µs (100 GB/s) and 3e6 B in 20 µs (150 GB/s): 4e6 B / 30 µs.
    assert h["bytes"] == 4_000_000 and h["time_us"] == 30.0 and h["events"] == 2 == h["counted_events"]
    assert h["bytes_per_s"] == pytest.approx(4e6 / 30e-6)
    assert h["median_bytes_per_s"] == pytest.approx((1e11 + 1.5e11) / 2) and h["max_bytes_per_s"] == pytest.approx(1.5e11)
    assert rows["Memset"]["bytes_per_s"] == pytest.approx(4096 / 2e-6)
    # Kineto's own "memory bandwidth (GB/s)" in the file says the same for each copy with bytes.
    for w in WORK:
        if w[7] is not None and w[0] == HTOD:
            assert w[7] / (w[6] * 1e-6) == pytest.approx(w[7] / (w[6] * 1e3) * 1e9)
    d = rows["DtoH"]   # a copy without "bytes": counted as an event, its bytes and bandwidth not counted
    assert d["events"] == 1 and d["counted_events"] == 0 and d["bytes"] is None and d["bytes_per_s"] is None
    assert r["counted_events"] == 3 and r["events"] == 4
    assert any("not counted" in n and "1 of 4" in n for n in r["notes"])


def test_an_old_trace_without_bytes_or_annotations_says_not_counted(tmp_path):
    t = load_trace(write(tmp_path, events(annotations=[], with_bytes=False)))
    r = to_plain(hp.memcpy_bandwidth(t))
    assert all(d["bytes"] is None and d["bytes_per_s"] is None for d in r["directions"])
    assert r["counted_events"] == 0 and "not counted" in r["notes"][0]
    a = to_plain(hp.annotations(t))
    assert a["annotations"] == [] and "not counted" in a["notes"][0]
    assert to_plain(hp.comm_overlap(t))["overlap_pct"] is None   # no communication kernels
    cpu_only = load_trace(write(tmp_path, events(work=[], annotations=[]), "cpu.json"))
    assert "not counted" in to_plain(hp.memcpy_bandwidth(cpu_only))["notes"][0]
    assert "not counted" in to_plain(hp.launch_delay(cpu_only))["notes"][0]
    assert to_plain(hp.kernel_sequences(cpu_only))["notes"] == ["not counted: no GPU compute kernels in this trace"]


# ---- 4. GPU user annotations -----------------------------------------------------------------------

def test_annotation_time_and_gpu_work_inside(trace):
    rows = {a["name"]: a for a in to_plain(hp.annotations(trace))["annotations"]}
    f, o = rows["forward"], rows["optimizer"]
    assert (f["count"], f["total_us"], f["mean_us"], f["max_us"]) == (2, 52.0, 26.0, 36.0)
    # By hand, GPU work on device 0 inside forward [10, 46): [10, 20) + [21, 27) (stream 7's B and stream 8's B, A
    # as one) + [30, 40) + [41, 46) = 31 µs; inside [61, 77): 10 + 5 = 15 µs.
    assert f["gpu_busy_us"] == 46.0
    assert (o["count"], o["total_us"], o["gpu_busy_us"]) == (1, 10.0, 2.0)   # only C [80, 82); the DtoH starts at 90


# ---- 5. launch delay -------------------------------------------------------------------------------

def test_launch_delay_per_kernel_with_its_operator(trace):
    r = to_plain(hp.launch_delay(trace))
    rows = {x["name"]: x for x in r["by_name"]}
    # A: 10 - 1, 30 - 5, 61 - 11 on stream 7 and 25 - 19 on stream 8 -> [6, 9, 25, 50].
    a = rows[A]
    assert (a["launches"], a["min_us"], a["max_us"], a["mean_us"]) == (4, 6.0, 50.0, 22.5)
    assert a["p50_us"] == 17.0 and a["p90_us"] == pytest.approx(25 + 0.7 * 25)   # linear interpolation
    assert a["op"] == "aten::mm"   # 3 of its 4 launches were made inside aten::mm, one in aten::add
    assert rows[C]["op"] == "aten::mm" and rows[HTOD]["op"] == "aten::mm"   # one of its two calls sits in aten::mm
    assert rows[DTOH]["op"] == rows[MEMSET]["op"] == ""   # their calls sit in no operator
    delays = sorted(w[5] - w[4] for w in WORK)
    assert r["launches"] == len(WORK) and r["max_us"] == max(delays) and r["negative"] == 0
    assert r["mean_us"] == pytest.approx(sum(delays) / len(delays))
    for b in r["histogram"]:
        hi = float("inf") if b["hi_us"] is None else b["hi_us"]
        assert b["count"] == sum(b["lo_us"] <= d < hi for d in delays), b


def test_launch_delay_from_the_call_s_end_as_hta_measures_it(trace, tmp_path):
    r = to_plain(hp.launch_delay(trace, since="call_end"))
    a = {x["name"]: x for x in r["by_name"]}[A]
    # Every call lasts 1 µs: A's delays from the call's end are [5, 8, 24, 49].
    assert (a["min_us"], a["max_us"], a["mean_us"], a["p50_us"]) == (5.0, 49.0, 21.5, 16.0)
    assert r["since"] == "call_end" and r["negative"] == 0 and r["no_call_duration"] == 0
    # A kernel that starts before its call returns: -0.5 µs from the end, clipped to 0 and counted.
    early = load_trace(write(tmp_path, events([(A, "kernel", 7, 1, 0, 0.5, 2, None)], [], []), "early.json"))
    e = to_plain(hp.launch_delay(early, since="call_end"))
    assert (e["negative"], e["max_us"]) == (1, 0.0)
    assert to_plain(hp.launch_delay(early))["max_us"] == 0.5   # from the call's start
    with pytest.raises(ValueError, match="since must be one of call_start, call_end"):
        hp.launch_delay(early, since="kernel")


def test_graph_launch_kernels_are_left_out_of_launch_delay(tmp_path):
    evs = [_x("cuda_runtime", "cudaGraphLaunch", CPU_PID, CPU_TID, 0, 50, {"correlation": 9})]
    evs += [_x("kernel", f"k{i}", DEVICE, 7, 60 + 10 * i, 5, {"device": DEVICE, "stream": 7, "correlation": 9})
            for i in range(3)]
    evs += events([(A, "kernel", 7, 1, 100, 110, 5, None)], [], [])
    r = to_plain(hp.launch_delay(load_trace(write(tmp_path, evs))))
    assert r["graph_kernels"] == 3 and r["launches"] == 1 and r["mean_us"] == 10.0
    assert any("graph" in n for n in r["notes"])


# ---- 6. HTA's definitions ---------------------------------------------------------------------------

def test_comm_overlap_over_all_gpu_work_or_compute_kernels_only(tmp_path):
    work = [(NCCL, "kernel", 20, 1, 0, 0, 100, None), (A, "kernel", 7, 2, 0, 20, 30, None),
            (HTOD, "gpu_memcpy", 9, 3, 0, 60, 20, 1000)]
    t = load_trace(write(tmp_path, events(work, [], [])))
    ours, hta = to_plain(hp.comm_overlap(t, "gpu_work")), to_plain(hp.comm_overlap(t, "kernels"))
    # By hand: communication [0, 100); the kernel overlaps 30 µs, the copy 20 more.
    assert (ours["comm_us"], ours["overlap_us"], ours["overlap_pct"]) == (100.0, 50.0, 50.0)
    assert (hta["compute_us"], hta["overlap_us"], hta["overlap_pct"]) == (30.0, 30.0, 30.0)


def test_idle_kernel_wait_threshold_and_hta_comparisons(tmp_path):
    # Stream 7: A [0, 10), B [11, 15) launched long before (gap 1 µs, queued), C [30, 32) launched at 20 (after B
    # ended: host wait 15 µs), D [32.02, 33) launched early (gap 0.02 µs) and a kernel E with no launch call at 40.
    work = [(A, "kernel", 7, 1, 0, 0, 10, None), (B, "kernel", 7, 2, 0, 11, 4, None),
            (C, "kernel", 7, 3, 20, 30, 2, None), ("D", "kernel", 7, 4, 0, 32.02, 0.98, None)]
    evs = events(work, [], []) + [_x("kernel", "E", DEVICE, 7, 40, 1, {"device": DEVICE, "stream": 7})]
    t = load_trace(write(tmp_path, evs))

    def split(r):
        (s,) = r["streams"]
        return round(s["host_wait_us"], 6), round(s["kernel_wait_us"], 6), round(s["other_wait_us"], 6)

    assert split(to_plain(idle_time(t))) == (15.0, 1.02, 7.0)                      # ours: gaps <= 5 µs with a launch call
    assert split(to_plain(idle_time(t, kernel_wait_max_us=1.0))) == (15.0, 1.02, 7.0)   # 1 µs gap: <= 1 is kernel wait
    assert split(to_plain(idle_time(t, kernel_wait_max_us=1.0, rules="hta"))) == (15.0, 0.02, 8.0)  # HTA: < 1 strictly
    # A 30 ns threshold: only the 0.02 µs gap is kernel wait; E (no launch call) is other wait either way.
    r = to_plain(idle_time(t, kernel_wait_max_us=0.03, rules="hta"))
    assert split(r) == (15.0, 0.02, 8.0) and r["kernel_wait_max_us"] == 0.03 and r["rules"] == "hta"
    # HTA's default (30, in the trace's µs): every gap but the host wait is kernel wait, E's 7 µs included
    # (HTA asks no launch call for a kernel wait); ours asks one, so E's gap stays other wait.
    assert split(to_plain(idle_time(t, kernel_wait_max_us=HTA_KERNEL_WAIT_US, rules="hta"))) == (15.0, 8.02, 0.0)
    assert split(to_plain(idle_time(t, kernel_wait_max_us=HTA_KERNEL_WAIT_US))) == (15.0, 1.02, 7.0)
    with pytest.raises(ValueError, match="rules must be one of torchscope, hta"):
        idle_time(t, rules="perfetto")


# ---- ingest, job, CLI -------------------------------------------------------------------------------

def test_copy_bytes_are_read_by_the_lenient_decoder_too(tmp_path):
    # A "bytes" written as a string and an event with a bad "ts" make msgspec refuse the block: the
    # events are then decoded one by one, and the copy's size must survive that path.
    evs = events([(HTOD, "gpu_memcpy", 7, 1, 0, 10, 10, 2048)], [], [])
    copy = next(e for e in evs if e["cat"] == "gpu_memcpy")
    copy["args"]["bytes"] = "2048"
    evs.append({"ph": "X", "cat": "cpu_op", "name": "bad ts", "ts": {"x": 1}, "dur": 1})
    t = load_trace(write(tmp_path, evs))
    assert t.skipped_events == 1
    (row,) = to_plain(hp.memcpy_bandwidth(t))["directions"]
    assert row["bytes"] == 2048 and row["bytes_per_s"] == pytest.approx(2048 / 10e-6)


def cli(capsys, tmp_path, *argv):
    from diagnostics.cli.main import main

    try:
        code = main(["trace", *map(str, argv), "--no-report", "-q", "--data-dir", str(tmp_path / "data")])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_trace_analyze_json_has_a_top_level_key_per_analysis_and_takes_the_definitions(capsys, tmp_path):
    path = write(tmp_path, events())
    code, out, _ = cli(capsys, tmp_path, "analyze", path, "--json")
    assert code == 0
    data = json.loads(out)
    for key in ("kernel_sequences", "queue_length", "memcpy_bandwidth", "annotations", "launch_delay", "comm_overlap"):
        assert key in data, key
    trace = load_trace(path)
    assert data["kernel_sequences"]["by_time"] == to_plain(hp.kernel_sequences(trace, n=20))["by_time"]
    assert data["queue_length"]["until"] == "kernel_end" and data["launch_delay"]["since"] == "call_start"
    assert data["idle_time"]["kernel_wait_max_us"] == 5.0 and data["comm_overlap"]["compute"] == "gpu_work"
    code, out, _ = cli(capsys, tmp_path, "analyze", path, "--json", "--definitions", "hta", "--sequence-length", "2",
                       "--queue-full", "6", "--kernel-wait-us", "2")
    data = json.loads(out)
    assert data["idle_time"]["kernel_wait_max_us"] == 2.0 and data["idle_time"]["rules"] == "hta"  # the flag wins
    assert data["queue_length"]["until"] == "kernel_start" and data["launch_delay"]["since"] == "call_end"
    assert data["comm_overlap"]["compute"] == "kernels" and data["kernel_sequences"]["max_len"] == 2
    # Until the kernel starts, stream 7 holds 5 after A starts at 10, 6 from the launch at 13, 7 from 15, 6 from
    # 21 (B starts), 5 from 30: >= 6 on [13, 30) = 17 µs; the same by counting µs by µs:
    full = sum(1 for t in range(0, 200) if queued_at(WORK, 7, t + 0.5, "kernel_start") >= 6)
    assert {s["stream"]: s["full_us"] for s in data["queue_length"]["streams"]}["7"] == 17.0 == full
    code, _, err = cli(capsys, tmp_path, "analyze", path, "--sequence-length", "1")
    assert code == 2 and "from 2 to 16" in err


def test_trace_analyze_text_names_each_analysis(capsys, tmp_path):
    code, out, _ = cli(capsys, tmp_path, "analyze", write(tmp_path, events()), "--top", "3")
    assert code == 0
    for heading in ("Frequent kernel sequences (2..3 kernels", "Launch queue: Time with 1,024 or more",
                    "Memcpy / memset bandwidth:", "GPU user annotations:", "Launch delay (launch call start"):
        assert heading in out, heading
    assert f"{A} → {B}" in out and "133.33 GB/s" in out and "not counted" in out


def test_covered_time_matches_pairwise_overlaps_of_disjoint_sets():
    # The vectorised busy-inside / overlap measure against a brute force: for two disjoint sets, the length of
    # their intersection is the sum of pairwise overlaps.
    import random

    from diagnostics.trace import intervals as iv

    rnd = random.Random(3)
    for _ in range(200):
        a = [(s, s + rnd.uniform(0, 10)) for s in (rnd.uniform(0, 100) for _ in range(rnd.randint(0, 25)))]
        b = [(s, s + rnd.uniform(0, 10)) for s in (rnd.uniform(0, 100) for _ in range(rnd.randint(0, 25)))]
        ua, ub = iv.union([x for x, _ in a], [y for _, y in a]), iv.union([x for x, _ in b], [y for _, y in b])
        brute = sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in zip(*ua) for s2, e2 in zip(*ub))
        assert hp._covered_within(ub, *ua) == pytest.approx(brute, abs=1e-9)


@pytest.mark.parametrize("which", ["gpu", "cpu_only"])
def test_figures_and_report_sections_draw_every_result(which, tmp_path):
    import plotly.graph_objects as go

    from diagnostics.render.charts import trace_hta as charts
    from diagnostics.runner import Job, execute

    evs = events() if which == "gpu" else events(work=[], annotations=[])
    result = execute(Job("trace", None, {"path": str(write(tmp_path, evs)), "keep_columns": False}), tmp_path / "run")
    figs = [charts.build_kernel_sequences_figure(result.kernel_sequences),
            charts.build_queue_length_figure(result.queue_length),
            charts.build_bandwidth_figure(result.memcpy_bandwidth),
            charts.build_annotations_figure(result.annotations),
            charts.build_launch_delay_figure(result.launch_delay)]
    for fig in figs:
        assert isinstance(fig, go.Figure)
        fig.to_json()
    titles = [s.title for s in charts.hta_sections(result)]
    assert titles == ["Kernel sequences", "Launch queue", "Memcpy bandwidth", "GPU annotations", "Launch delay",
                      "Definitions"]
    if which == "cpu_only":   # nothing drawn as 0: each empty figure says why
        texts = [f.layout.annotations[0].text for f in figs]
        assert all("not counted" in x for x in texts), texts
    else:
        (bar,) = figs[0].data
        assert list(bar.x) == [19.0, 45.0] and figs[0].layout.xaxis.title.text == "GPU time, all occurrences (µs)"
