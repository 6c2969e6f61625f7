"""The critical path of a step (issue #18, "Beyond") on small traces written the way Kineto writes them:
cpu_op / user_annotation / cuda_runtime events on a host thread, kernels on streams, "ac2g" flows, a
"cuda_sync" event on the GPU timeline, ProfilerStep#N ranges. Times are µs after T0; every expected
number below is worked out by hand from the event times written here.
"""

import json

import pytest

from diagnostics.results import to_plain
from diagnostics.trace import load_trace
from diagnostics.trace.critical_path import KINDS, critical_path, step_graph, what_if
from diagnostics.trace.errors import TraceError

T0 = 1_000_000.0
PID, TID, DEV = 4242, 4242, 0


def span(name, ts, dur, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": TID, "ts": T0 + ts, "dur": dur,
            "args": {"External id": 1}}


def step(n, ts, dur):
    return span(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")


def runtime(name, ts, dur, corr):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": TID, "ts": T0 + ts, "dur": dur,
            "args": {"correlation": corr, "External id": corr, "cbid": 211}}


def kernel(name, ts, dur, corr, stream=7, cat="kernel"):
    return [{"ph": "X", "cat": cat, "name": name, "pid": DEV, "tid": stream, "ts": T0 + ts, "dur": dur,
             "args": {"correlation": corr, "External id": corr, "device": DEV, "stream": stream}}]


def launched(name, launch_ts, kts, kdur, corr, stream=7, call="cudaLaunchKernel", cat="kernel"):
    """A launch call (5 µs) and the GPU event it started, joined by an ac2g flow as Kineto writes it."""
    return [runtime(call, launch_ts, 5, corr)] + kernel(name, kts, kdur, corr, stream, cat) + [
        {"ph": "s", "id": corr, "pid": PID, "tid": TID, "ts": T0 + launch_ts, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": corr, "pid": DEV, "tid": stream, "ts": T0 + kts, "cat": "ac2g", "name": "ac2g", "bp": "e"}]


def write(tmp_path, events, name="t.json"):
    p = tmp_path / name
    meta = [{"name": "process_name", "ph": "M", "ts": T0, "pid": DEV, "tid": 0, "args": {"name": "GPU 0"}}]
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": meta + events}))
    return p


# Step 0 (CPU-bound, 300 µs): two ops each launch a short kernel that is done long before the host
# moves on; a third op launches nothing and allocates (a 10 µs cudaMalloc).
CPU_STEP = ([step(0, 0, 300), span("aten::linear", 10, 100)] + launched("k_linear", 20, 32, 10, 11)
            + [span("aten::relu", 120, 100)] + launched("k_relu", 130, 142, 8, 12) + [span("aten::sum", 230, 60),
                                                                                     runtime("cudaMalloc", 240, 10, 13)])
# Step 1 (GPU-bound, 300 -> 730): three ops launch 100 + 100 + 200 µs of kernels back to back on
# stream 7; the host waits in cudaDeviceSynchronize until the last one ends (415 after the step
# began) and returns 5 µs later, then runs aten::zero_.
G = 300
GPU_STEP = ([step(1, G, 430), span("aten::mm", G + 8, 10)] + launched("gemm_a", G + 10, G + 15, 100, 1)
            + [span("aten::relu", G + 18, 10)] + launched("relu_b", G + 20, G + 115, 100, 2)
            + [span("aten::add", G + 28, 10)] + launched("add_c", G + 30, G + 215, 200, 3)
            + [runtime("cudaDeviceSynchronize", G + 40, 380, 4), span("aten::zero_", G + 422, 6)])


def by_kind(cp):
    return {r["kind"]: r["us"] for r in cp["by_kind"]}


def test_gpu_bound_step_runs_through_the_kernels(tmp_path):
    trace = load_trace(write(tmp_path, CPU_STEP + GPU_STEP))
    cp = to_plain(critical_path(trace))              # default: the longest step, step 1 (430 µs against 300)
    assert cp["step"] == 1
    assert cp["step_us"] == pytest.approx(730 - 300)
    assert cp["length_us"] == pytest.approx(430)
    names = [r["name"] for r in cp["path"]]
    assert [n for n in names if n in ("gemm_a", "relu_b", "add_c")] == ["gemm_a", "relu_b", "add_c"]
    assert "cudaDeviceSynchronize" in names and names[-1] == "aten::zero_"
    # By hand: host 8 (step self) + 2 (aten::mm until its launch) + 5 launch latency (10 -> 15)
    # + 400 of kernels + 5 sync return (415 -> 420) + 2 + 6 (aten::zero_) + 2 host = 430.
    k = by_kind(cp)
    assert k["kernel"] == pytest.approx(400)
    assert k["launch"] == pytest.approx(5)
    assert k["sync"] == pytest.approx(5)
    assert k["cpu"] == pytest.approx(8 + 2 + 2 + 6 + 2)
    assert k["idle-wait"] == pytest.approx(0) and k["copy"] == pytest.approx(0)
    assert sum(k.values()) == pytest.approx(cp["step_us"])
    assert list(k) == list(KINDS)
    sync = next(r for r in cp["path"] if r["name"] == "cudaDeviceSynchronize")
    assert "add_c" in sync["waited_on"]
    # Path rows account for the whole step: own time plus the waits charged to them.
    assert sum(r["on_path_us"] + r["wait_before_us"] for r in cp["path"]) == pytest.approx(430)


def test_what_if_halving_the_longest_kernel_saves_what_the_hand_computation_says(tmp_path):
    trace = load_trace(write(tmp_path, CPU_STEP + GPU_STEP))
    cp = to_plain(critical_path(trace, step=1))
    w = {r["name"]: r for r in cp["what_if"]}
    # add_c 200 -> 100 µs: it ends at 315 instead of 415, the sync returns at 320, aten::zero_ and the
    # step's end move up by the same 100 µs: 430 -> 330.
    assert w["add_c"]["saving_us"] == pytest.approx(100)
    assert w["add_c"]["step_us_after"] == pytest.approx(330)
    # gemm_a 100 -> 50: relu_b (launched at 20, long queued) can start at 65; everything after moves 50.
    assert w["gemm_a"]["saving_us"] == pytest.approx(50)
    # Halving the host op that waits in no sync saves only its own 6 µs / 2.
    assert w["aten::zero_"]["saving_us"] == pytest.approx(3)
    # Two kernels at once: 100 + 50.
    m = step_graph(trace, 1)
    idx = [i for i, n in enumerate(m["names"]) if n in ("gemm_a", "add_c")]
    assert what_if(m, idx)["saving_us"] == pytest.approx(150)
    # Not half of what is on the path for everything: aten::mm's 10 µs host op is mostly off the path.
    assert w.get("aten::mm", {"saving_us": 1.0})["saving_us"] <= 1.0 + 1e-6


def test_cpu_bound_step_runs_through_the_host_ops(tmp_path):
    trace = load_trace(write(tmp_path, CPU_STEP + GPU_STEP))
    cp = to_plain(critical_path(trace, step=0))
    assert cp["step_us"] == pytest.approx(300) and cp["length_us"] == pytest.approx(300)
    names = [r["name"] for r in cp["path"]]
    assert {"aten::linear", "aten::relu", "aten::sum"} <= set(names)
    assert "k_linear" not in names and "k_relu" not in names
    k = by_kind(cp)
    assert k["kernel"] == pytest.approx(0)
    assert k["launch"] == pytest.approx(10)          # the two 5 µs launch calls
    assert k["runtime"] == pytest.approx(10)         # cudaMalloc: a runtime call that launched nothing
    assert k["cpu"] == pytest.approx(280)
    assert next(r for r in cp["path"] if r["name"] == "cudaMalloc")["kind"] == "runtime"
    # Halving the longest kernel (k_linear, 10 µs) saves nothing: the GPU was never waited for.
    m = step_graph(trace, 0)
    longest = max((i for i, kd in enumerate(m["kind"]) if kd == "kernel"), key=lambda i: m["end"][i] - m["start"][i])
    assert m["names"][longest] == "k_linear"
    assert what_if(m, [longest])["saving_us"] == pytest.approx(0, abs=1e-6)
    # aten::linear (100 µs with its launch call) twice as fast: 50 µs off the step.
    w = {r["name"]: r for r in cp["what_if"]}
    assert w["aten::linear"]["saving_us"] == pytest.approx(50)


def sync_trace(tmp_path, sync_name="cudaStreamSynchronize", sync_event="Stream Sync"):
    # K_long on stream 7 (20 -> 320) and K_other on stream 9 (30 -> 322); the host waits on stream 7
    # only (a cudaStreamSynchronize 30 -> 325 with its "Stream Sync" event), then runs aten::add.
    ev = [step(2, 0, 500), span("aten::mm", 5, 20)] + launched("k_long", 10, 20, 300, 21) \
        + launched("k_other", 19, 30, 292, 22, stream=9) \
        + [runtime(sync_name, 30, 295, 23), span("aten::add", 330, 10)]
    if sync_event:
        ev.append({"ph": "X", "cat": "cuda_sync", "name": sync_event, "pid": DEV, "tid": 7, "ts": T0 + 320,
                   "dur": 1, "args": {"correlation": 23, "device": DEV, "stream": 7}})
    return load_trace(write(tmp_path, ev))


def test_a_sync_wait_puts_the_kernel_it_waited_on_on_the_path(tmp_path):
    cp = to_plain(critical_path(sync_trace(tmp_path)))
    names = [r["name"] for r in cp["path"]]
    assert "k_long" in names and "k_other" not in names
    assert names.index("k_long") < names.index("cudaStreamSynchronize") < names.index("aten::add")
    sync = cp["path"][names.index("cudaStreamSynchronize")]
    assert "k_long" in sync["waited_on"] and sync["on_path_us"] == pytest.approx(5)
    assert cp["length_us"] == pytest.approx(500)
    k = by_kind(cp)
    # host 5 + 5 (aten::mm until the launch), launch latency 10 (10 -> 20), k_long 300, sync return 5,
    # then host 5 + aten::add 10 + 160 to the step's end.
    assert k["kernel"] == pytest.approx(300) and k["launch"] == pytest.approx(10) and k["sync"] == pytest.approx(5)
    w = {r["name"]: r for r in cp["what_if"]}
    # k_long 300 -> 150: the sync returns at 175 (k_other, not waited for, ends at 322 < the new end 350).
    assert w["k_long"]["saving_us"] == pytest.approx(150)


def test_a_device_sync_waits_on_the_last_kernel_of_any_stream(tmp_path):
    cp = to_plain(critical_path(sync_trace(tmp_path, "cudaDeviceSynchronize", None)))
    sync = next(r for r in cp["path"] if r["name"] == "cudaDeviceSynchronize")
    assert "k_other" in sync["waited_on"]
    assert cp["length_us"] == pytest.approx(500)


def test_bad_step_and_no_steps_are_clear_errors(tmp_path):
    trace = load_trace(write(tmp_path, CPU_STEP + GPU_STEP))
    with pytest.raises(TraceError, match=r"no ProfilerStep#9 in this trace \(steps: 0, 1\)"):
        critical_path(trace, step=9)
    bare = load_trace(write(tmp_path, [span("aten::mm", 0, 10)], "bare.json"))
    with pytest.raises(TraceError, match="no profiler step ranges"):
        critical_path(bare)
    with pytest.raises(TraceError, match="factor must be above 1"):
        critical_path(trace, factor=1.0)


def test_exported_trace_marks_the_path_and_reads_back(tmp_path):
    from diagnostics.trace.critical_path import FLOW_CAT, chrome_trace

    trace = load_trace(write(tmp_path, CPU_STEP + GPU_STEP))
    m = step_graph(trace, 1)
    doc = chrome_trace(trace, m)
    p = tmp_path / "cp.json"
    p.write_text(json.dumps(doc))          # valid JSON (no NaN: json.dumps would write it, loads refuses)
    json.loads(p.read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    marked = {e["name"] for e in doc["traceEvents"] if e.get("ph") == "X" and e["args"].get("critical")}
    assert {"gemm_a", "relu_b", "add_c", "cudaDeviceSynchronize", "aten::zero_"} <= marked
    assert "k_linear" not in marked        # step 0's events are not exported at all
    assert not any(e.get("name") == "k_linear" for e in doc["traceEvents"])
    arrows = [e for e in doc["traceEvents"] if e.get("cat") == FLOW_CAT]
    assert len(arrows) == 2 * (len(marked) - 1)
    # Our own loader reads it back: the step's events, at their original times, launches linked.
    back = load_trace(p)
    names = set(back.strings("name"))
    assert {"ProfilerStep#1", "gemm_a", "add_c"} <= names
    again = to_plain(critical_path(back, step=1))
    assert again["length_us"] == pytest.approx(430)
    assert [r["name"] for r in again["path"]] == [r["name"] for r in to_plain(critical_path(trace, step=1))["path"]]


# ---- through the trace analysis: the CLI's --json, its text, the report ------------------------

def _cli(capsys, tmp_path, *argv):
    from diagnostics.cli.main import main

    try:
        code = main(["trace", "analyze", *map(str, argv), "-q", "--data-dir", str(tmp_path / "data")])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_trace_analyze_json_has_the_critical_path_and_step_option(tmp_path, capsys):
    p = write(tmp_path, CPU_STEP + GPU_STEP)
    code, out, err = _cli(capsys, tmp_path, p, "--json", "--no-report")
    assert code == 0, err
    cp = json.loads(out)["critical_path"]          # a top-level key
    assert cp["available"] and cp["step"] == 1 and cp["length_us"] == pytest.approx(430)
    exported = json.loads(open(cp["trace_file"]).read())
    assert any(e.get("args", {}).get("critical") for e in exported["traceEvents"])
    code, out, err = _cli(capsys, tmp_path, p, "--json", "--no-report", "--step", "0")
    assert code == 0 and json.loads(out)["critical_path"]["length_us"] == pytest.approx(300)
    code, out, err = _cli(capsys, tmp_path, p, "--json", "--no-report", "--step", "9")
    assert code == 2 and "option critical_path_step: critical path: no ProfilerStep#9 in this trace" in err


def test_trace_analyze_text_and_report_show_the_critical_path(tmp_path, capsys):
    p = write(tmp_path, CPU_STEP + GPU_STEP)
    code, out, err = _cli(capsys, tmp_path, p, "--out", tmp_path / "rep")
    assert code == 0, err
    assert "Critical path of step 1 (the longest complete step): 0.430 ms" in out
    assert "kernel 0.400 ms" in out
    assert "critical path marked (Perfetto, chrome://tracing): " in out and "critical_path.pt.trace.json" in out
    # the what-if line of add_c: 0.200 ms on the path, saves 0.100 ms, step after 0.330 ms
    assert any(line.split()[:1] == ["add_c"] and "0.100 ms" in line and "0.330 ms" in line
               for line in out.splitlines())
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "Critical path" in html and "time on the critical path by kind" in html


def test_a_trace_without_steps_still_analyses_and_says_why(tmp_path, capsys):
    p = write(tmp_path, [span("aten::mm", 0, 10)])
    code, out, err = _cli(capsys, tmp_path, p, "--json", "--no-report")
    assert code == 0, err
    cp = json.loads(out)["critical_path"]
    assert cp == {"available": False, "reason": cp["reason"]} and "no profiler step ranges" in cp["reason"]


def test_breakdown_figure_is_labelled_in_ms(tmp_path):
    from diagnostics.render.charts.critical_path import (
        build_critical_path_breakdown_figure, build_critical_path_timeline_figure, build_what_if_figure,
    )

    cp = critical_path(load_trace(write(tmp_path, CPU_STEP + GPU_STEP)), step=1)
    (bar,) = build_critical_path_breakdown_figure(cp).data
    assert dict(zip(bar.x, bar.y))["kernel"] == pytest.approx(0.4)
    assert "0.400 ms" in list(bar.text)
    assert build_critical_path_breakdown_figure(cp).layout.yaxis.title.text.endswith("(ms)")
    wi = build_what_if_figure(cp)
    assert dict(zip(wi.data[0].y, wi.data[0].x))["add_c"] == pytest.approx(0.1)
    tl = build_critical_path_timeline_figure(cp)
    assert {"GPU 0 stream 7", "thread 4242"} <= {y for d in tl.data for y in d.y}   # threads as the timeline names them


def test_a_step_too_large_is_named_not_computed(tmp_path, monkeypatch):
    from diagnostics.trace import critical_path as mod

    trace = load_trace(write(tmp_path, CPU_STEP + GPU_STEP))
    monkeypatch.setattr(mod, "MAX_EVENTS_AUTO", 5)   # step 1: 9 host events (the span, 4 ops, 3 launches, the sync) + 3 kernels
    with pytest.raises(TraceError, match=r"step 1 has 12 events, more than 5 \(name a step to go up to"):
        critical_path(trace)
    assert critical_path(trace, step=1).length_us == pytest.approx(430)   # named: the larger limit


def test_the_path_is_marked_on_the_trace_timeline(tmp_path):
    from diagnostics.render.charts.critical_path import mark_critical_path
    from diagnostics.render.charts.traces import build_timeline_figure
    from diagnostics.trace import timeline_data

    trace = load_trace(write(tmp_path, CPU_STEP + GPU_STEP))
    cp = critical_path(trace, step=1)
    tl = timeline_data(trace)
    fig = mark_critical_path(build_timeline_figure(tl), cp, tl)
    line = fig.data[-1]
    assert line.name == "critical path (step 1)"
    drawn = dict(zip([c[0] for c in line.customdata], zip(line.x, line.y)))
    # at the events' own rows (the lane's label where the timeline gives lanes one, else "pid/tid · depth")
    # and times (ms from the trace's start: step 1 starts 300 µs in)
    label = {lane.lane: lane.label for lane in tl.lanes}
    gpu_row = label.get("GPU 0 stream 7") or "GPU 0 stream 7"
    host_row = label.get("4242/4242") or "4242/4242 · 1"
    assert drawn["add_c"] == (pytest.approx((300 + 215) / 1e3), gpu_row)
    assert drawn["aten::zero_"] == (pytest.approx((300 + 422) / 1e3), host_row)
    assert drawn["cudaDeviceSynchronize"][1] == host_row
    rows = set(fig.layout.yaxis.categoryarray)
    assert set(line.y) <= rows          # only rows the timeline draws: no new ones


def test_a_fault_in_the_critical_path_leaves_the_trace_analysis_standing(tmp_path, monkeypatch):
    from diagnostics.analyses.trace import TRACE
    from diagnostics.analyses.trace import critical_part as job_part

    def broken(*a, **k):
        raise ValueError("boom")

    monkeypatch.setattr(job_part, "critical_path", broken)
    trace = load_trace(write(tmp_path, CPU_STEP + GPU_STEP))
    out = job_part.critical_path_result(trace, TRACE.validate({"path": "x.json"}), tmp_path)
    assert to_plain(out) == {"available": False, "reason": "the critical path could not be computed (ValueError: boom)"}


def _simulate(launch_at, kdur, sync_at, latency, ret):
    """An independent schedule of one stream: a kernel starts when its launch (plus ``latency``) and the
    kernel before it allow; the sync returns ``ret`` after the later of its own start and the last
    kernel's end. Returns (kernel starts, sync end)."""
    starts, end = [], None
    for a, d in zip(launch_at, kdur):
        s = a + latency if end is None else max(a + latency, end)
        starts.append(s)
        end = s + d
    return starts, max(sync_at, end) + ret


def test_what_ifs_match_an_independent_schedule_on_a_random_step(tmp_path):
    import random

    rng = random.Random(18)
    latency, ret, n = 6.0, 4.0, 30
    t, ev, launch_at, kdur = 10.0, [], [], []
    for i in range(n):                      # host ops of 8-40 µs, each launching one kernel (5 µs) 1 µs in
        op = rng.choice([8.0, 12.0, 25.0, 40.0])
        ev.append(span(f"aten::op{i}", t, op))
        launch_at.append(t + 1)
        kdur.append(rng.choice([2.0, 10.0, 30.0, 80.0]))
        t += op + 1
    sync_at = t
    starts, sync_end = _simulate(launch_at, kdur, sync_at, latency, ret)
    for i in range(n):
        ev += launched(f"k{i}", launch_at[i], starts[i], kdur[i], 100 + i)
    ev += [runtime("cudaDeviceSynchronize", sync_at, sync_end - sync_at, 99), span("aten::zero_", sync_end + 1, 3)]
    step_end = sync_end + 5
    trace = load_trace(write(tmp_path, [step(3, 0, step_end)] + ev))
    m = step_graph(trace, 3)
    assert m["length_us"] == pytest.approx(step_end)
    bound = [i for i in range(1, n) if launch_at[i] + latency > starts[i - 1] + kdur[i - 1]]
    assert 0 < len(bound) < n - 1          # a mix: some kernels waited for their launch, some queued
    for j in range(n):
        shorter = [d / 2 if i == j else d for i, d in enumerate(kdur)]
        _, sync_after = _simulate(launch_at, shorter, sync_at, latency, ret)
        expected = sync_end - sync_after    # everything after the sync moves with it
        idx = next(i for i, name in enumerate(m["names"]) if name == f"k{j}")
        assert what_if(m, [idx])["saving_us"] == pytest.approx(expected, abs=1e-6), f"k{j}"


def test_blocking_calls_are_the_syncs_and_synchronous_copies():
    from diagnostics.trace.classify import is_sync_call

    for name in ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cuCtxSynchronize",
                 "hipDeviceSynchronize", "cudaMemcpy", "cudaStreamSynchronize_v3020"):
        assert is_sync_call(name), name
    for name in ("cudaMemcpyAsync", "cudaStreamWaitEvent", "cudaLaunchKernel", "cudaEventRecord", "aten::copy_",
                 "cudaMemsetAsync", ""):
        assert not is_sync_call(name), name


def test_a_synchronous_memcpy_waits_for_its_own_copy(tmp_path):
    # A 100 µs kernel (12 -> 112), then a D2H cudaMemcpy (22 -> 125) whose copy queues behind it on
    # stream 7 (112 -> 122); the call returns 3 µs after its copy ends.
    ev = [step(5, 0, 200), span("aten::mm", 5, 10)] + launched("gemm", 6, 12, 100, 31) \
        + [span("aten::to", 20, 110)] + launched("Memcpy DtoH (Device -> Pageable)", 22, 112, 10, 32,
                                                 call="cudaMemcpy", cat="gpu_memcpy")
    ev[-4]["dur"] = 103                      # the cudaMemcpy call: 22 -> 125
    cp = to_plain(critical_path(load_trace(write(tmp_path, ev))))
    names = [r["name"] for r in cp["path"]]
    assert names.index("gemm") < names.index("Memcpy DtoH (Device -> Pageable)") < names.index("cudaMemcpy")
    k = by_kind(cp)
    # host 5 + 1, launch latency 6 (6 -> 12), gemm 100, copy 10, the call's return 3, aten::to's 5 after it
    # and the step's last 70.
    assert (k["kernel"], k["copy"], k["sync"], k["launch"], k["cpu"]) == pytest.approx((100, 10, 3, 6, 81))
    assert {r["name"]: r["saving_us"] for r in cp["what_if"]}["gemm"] == pytest.approx(50)


def test_the_default_step_is_the_longest_complete_one(tmp_path):
    # Step 2 takes longest (600 µs) but profiling ended before its second kernel ran: the launch
    # (correlation 42) has no kernel in the trace. The default is then step 1 (430 µs), and step 2
    # can still be asked for.
    cut = [step(2, 800, 600), span("aten::mm", 810, 10)] + launched("late_a", 812, 820, 50, 41) \
        + [runtime("cudaLaunchKernel", 830, 5, 42)]
    trace = load_trace(write(tmp_path, CPU_STEP + GPU_STEP + cut))
    cp = to_plain(critical_path(trace))
    assert cp["step"] == 1 and cp["chosen_as"] == "the longest complete step"
    assert cp["incomplete_steps"] == [2]
    asked = to_plain(critical_path(trace, step=2))
    assert asked["step"] == 2 and asked["length_us"] == pytest.approx(600) and asked["chosen_as"] == "step 2, as asked"


@pytest.mark.slow
def test_the_export_of_a_long_path_is_not_quadratic(tmp_path):
    """Issue #42: xDiT SD3.5's critical-path step (66k events) took 2-3 minutes: writing the path's flow
    arrows looked each event up in a list of those already written (9 s for 17,571 path events, here).
    A step of 30,000 back-to-back host calls, every one on the path: the export takes about as long per
    event as a step of 3,000's (quadratic: ten times as long)."""
    import time

    from diagnostics.trace.critical_path import chrome_trace

    def export_seconds(n):
        events = [step(0, 0, 10.0 * n + 10)] + [span(f"aten::op{i % 7}", 5 + 10.0 * i, 8.0) for i in range(n)]
        trace = load_trace(write(tmp_path, events, f"long{n}.json"))
        model = step_graph(trace, None)
        cp = to_plain(critical_path(trace, model=model))
        assert cp["path_events"] == n + 1      # the step's own range and each call
        t = time.perf_counter()
        out = chrome_trace(trace, model)
        seconds = time.perf_counter() - t
        assert sum(1 for e in out["traceEvents"] if e.get("cat") == "critical_path") == 2 * n
        return seconds

    # each the best of two (a shared machine's pause in one 0.5 s export read as 4x per event once)
    small, large = min(export_seconds(3000) for _ in range(2)), min(export_seconds(30000) for _ in range(2))
    assert large / 30000 < 4 * small / 3000, (small, large)


def test_the_job_writes_the_marked_trace_as_json_an_integer_past_64_bits_too(tmp_path, monkeypatch):
    """critical_path_result writes chrome_trace's document with orjson (issue #42: json.dumps took 0.5 s of
    xDiT SD3.5's 66k-event step), read back equal; a document orjson refuses (a pid past 64 bits, which a
    trace may write) is written by json instead, never lost."""
    from diagnostics.analyses.trace import TRACE
    from diagnostics.analyses.trace import critical_part as job_part
    from diagnostics.trace.critical_path import chrome_trace

    trace = load_trace(write(tmp_path, CPU_STEP + GPU_STEP))
    out = job_part.critical_path_result(trace, TRACE.validate({"path": "x.json"}), tmp_path)
    assert json.loads(open(out.trace_file).read()) == chrome_trace(trace, step_graph(trace, None))
    monkeypatch.setattr(job_part, "chrome_trace", lambda *a: {"traceEvents": [{"pid": 2 ** 64, "ts": 1.5}]})
    out = job_part.critical_path_result(trace, TRACE.validate({"path": "x.json"}), tmp_path)
    assert json.loads(open(out.trace_file).read()) == {"traceEvents": [{"pid": 2 ** 64, "ts": 1.5}]}


def test_what_if_bars_of_names_alike_stay_apart(tmp_path):
    from msgspec.structs import replace

    from diagnostics.render.charts.critical_path import build_what_if_figure

    cp = critical_path(load_trace(write(tmp_path, CPU_STEP + GPU_STEP)), step=1)
    assert len(cp.what_if) >= 2
    rows = tuple(replace(r, name="ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_64x3_" + x)
                 for r, x in zip(cp.what_if, ("tn", "nn", "nt", "tt")))
    (bar,) = build_what_if_figure(replace(cp, what_if=rows)).data
    labels = list(bar.y)[::-1]  # the largest saving first, as the table
    assert len(set(labels)) == len(rows) and labels[1] == labels[0] + " (2)"
    assert [c[0] for c in bar.customdata][::-1] == [r.name for r in rows]


PUBLIC_WITH_STEPS = [
    ("with_stack", "h100_bert_small_step_under_python.json.gz"),  # python frames around the ops
    ("public/hta", "ns_resolution_rank0.json.gz"),
    ("public/hta", "amd_mi250_rocm6_2.json.gz"),
    ("public/kineto", "tb_plugin_gpu_metrics_input.json.gz"),
    ("public/tracelens", "mi300_resnet_rccl_no_pyfn.json.gz"),
]


@pytest.mark.parametrize("folder,name", PUBLIC_WITH_STEPS)
def test_a_what_if_never_saves_more_than_it_cuts_from_the_path(folder, name):
    """The H100 BERT trace read 'aten::linear: on the path 0.178 ms, saves 0.578 ms': the what-if speeds up the
    calls nested in each linear (its addmm, its launches) too, while the table showed only linear's own time.
    Each what-if now says what it cuts on the path (``sped_up_us``): the old path, its cut edges divided by the
    factor, is still a path of the new graph, so the saving is at most (1 - 1/factor) of that."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "traces" / folder / name
    try:
        cp = critical_path(load_trace(path))
    except TraceError as e:
        pytest.fail(f"{name}: {e}")
    assert cp.what_if, name
    for w in cp.what_if:
        assert w.on_path_us <= w.sped_up_us + 1e-6, w
        assert w.saving_us <= (1 - 1 / cp.factor) * w.sped_up_us + 1e-3, w
        assert w.step_us_after == pytest.approx(cp.length_us - w.saving_us, abs=1e-3)
    if name.startswith("h100_bert"):
        linear = next(w for w in cp.what_if if w.name == "aten::linear")
        assert linear.saving_us > linear.on_path_us  # its nested addmm and launches: why sped_up_us is needed
        assert linear.sped_up_us > linear.on_path_us * 3
