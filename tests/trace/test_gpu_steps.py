"""GPU work on real-trace shapes (issue #18): which step a GPU event belongs to, CUDA-graph launches,
work queued before profiling began, and accelerators other than CUDA (MTIA).

Each trace is written the way Kineto writes one: "ph": "X" events with the categories
kernel / gpu_memcpy / cuda_runtime / cpu_op / user_annotation, args {"correlation", "External id",
"device", "stream"}, and "ac2g" flow arrows ("s" at the launch call, "f" at the kernel) whose id is
the correlation id. Times are µs; the first event is at T0, so the loaded trace's times are the
ones below less T0.
"""

import json

import pytest

from diagnostics.results import to_plain
from diagnostics.trace import launch_stats, load_trace, summary, temporal_breakdown
from diagnostics.trace.classify import host_mask, kernel_mask

T0 = 1_000_000.0
CPU_PID, CPU_TID, DEVICE = 4242, 4242, 0


def step(n, ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": CPU_PID, "tid": CPU_TID,
            "ts": T0 + ts, "dur": dur, "args": {"External id": 1000 + n}}


def runtime(name, ts, dur, corr, cat="cuda_runtime"):
    return {"ph": "X", "cat": cat, "name": name, "pid": CPU_PID, "tid": CPU_TID, "ts": T0 + ts, "dur": dur,
            "args": {"External id": corr, "correlation": corr, "cbid": 211}}


def kernel(name, ts, dur, corr=None, stream=7, cat="kernel"):
    args = {"External id": corr if corr is not None else 0, "device": DEVICE, "stream": stream,
            "grid": [1, 1, 1], "block": [128, 1, 1]}
    if corr is not None:
        args["correlation"] = corr
    return {"ph": "X", "cat": cat, "name": name, "pid": DEVICE, "tid": stream, "ts": T0 + ts, "dur": dur,
            "args": args}


def flow(corr, launch_ts, kernel_ts, stream=7, cat="ac2g"):
    return [{"ph": "s", "id": corr, "pid": CPU_PID, "tid": CPU_TID, "ts": T0 + launch_ts, "cat": cat,
             "name": cat},
            {"ph": "f", "id": corr, "pid": DEVICE, "tid": stream, "ts": T0 + kernel_ts, "cat": cat,
             "name": cat, "bp": "e"}]


def write(tmp_path, events, name="t.json"):
    meta = [{"name": "process_name", "ph": "M", "ts": T0, "pid": DEVICE, "tid": 0, "args": {"name": "python"}},
            {"name": "process_labels", "ph": "M", "ts": T0, "pid": DEVICE, "tid": 0, "args": {"labels": "GPU 0"}}]
    p = tmp_path / name
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": meta + events}))
    return load_trace(p)


def union_length(spans):
    """Total length covered by (start, end) spans: an independent sweep, not the engine's intervals."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            total += 0.0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (0.0 if cur_e is None else cur_e - cur_s)


# ---- 1. per-step GPU windows partition the GPU timeline ----------------------------------------

# Three 100 µs steps. Each launches a GEMM on stream 7 (10 µs in) and an NCCL all-reduce on stream 20
# (20 µs in). The GPU lags the CPU by more than a step (step 2's GEMM, launched at 210, runs at 420),
# and the all-reduces overlap the next step's GEMM, as on a data-parallel rank.
GEMM = "ampere_sgemm_128x64_nn"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
LAGGING = {  # step: (gemm start, gemm end), (nccl start, nccl end)
    0: ((150, 270), (160, 330)),
    1: ((280, 400), (410, 450)),
    2: ((420, 540), (550, 600)),
}


def lagging_trace(tmp_path):
    ev = []
    for n, ((gs, ge), (ns, ne)) in LAGGING.items():
        base = 100 * n
        ev += [step(n, base, 100),
               runtime("cudaLaunchKernel", base + 10, 5, 10 * n + 1),
               runtime("cudaLaunchKernel", base + 20, 5, 10 * n + 2),
               kernel(GEMM, gs, ge - gs, 10 * n + 1, stream=7),
               kernel(NCCL, ns, ne - ns, 10 * n + 2, stream=20)]
        ev += flow(10 * n + 1, base + 10, gs, 7) + flow(10 * n + 2, base + 20, ns, 20)
    return write(tmp_path, ev)


def test_per_step_gpu_windows_partition_the_gpu_span_when_the_gpu_lags(tmp_path):
    t = lagging_trace(tmp_path)
    r = to_plain(temporal_breakdown(t))
    rows = {row["step"]: row for row in r["gpu"]}
    spans = [(s - 0.0, e - 0.0) for pair in LAGGING.values() for (s, e) in pair]
    gpu_span = max(e for _, e in spans) - min(s for s, _ in spans)           # 600 - 150
    # The windows follow each other and add up to the GPU's span (before: 180 + 170 + 180 = 530 > 450).
    assert sum(row["window_us"] for row in rows.values()) == pytest.approx(gpu_span)
    assert [rows[n]["window_start_us"] for n in (0, 1, 2)] == [150.0, 280.0, 420.0]
    assert [rows[n]["window_us"] for n in (0, 1, 2)] == [130.0, 140.0, 180.0]
    # Every kernel is in exactly one step: the one whose CPU launched it.
    assert [rows[n]["events"] for n in (0, 1, 2)] == [2, 2, 2]
    assert r["attribution"]["launch_events"] == 6
    # Busy time adds up to the union of all GPU work; idle to the gaps in it (400-410, 540-550).
    kinds = ("compute_us", "communication_us", "memcpy_us", "memset_us")
    busy = [sum(row[k] for k in kinds) for row in rows.values()]
    assert sum(busy) == pytest.approx(union_length(spans))                  # 430
    assert sum(row["idle_us"] for row in rows.values()) == pytest.approx(gpu_span - union_length(spans))
    # Window by window: [150,280) GEMM 120 + all-reduce tail 10; [280,420) GEMM 120, all-reduce 10,
    # idle 10; [420,600) GEMM 120, all-reduce 50 (step 1's under the GEMM counts as compute), idle 10.
    assert [(rows[n]["compute_us"], rows[n]["communication_us"], rows[n]["idle_us"]) for n in (0, 1, 2)] == [
        (120.0, 10.0, 0.0), (120.0, 10.0, 10.0), (120.0, 50.0, 10.0)]
    assert r["notes"] == []


@pytest.mark.parametrize("cat", ["ac2g", "async_cpu_to_gpu"])   # the second: older Kineto
def test_a_kernel_is_put_in_the_step_that_launched_it_by_its_flow_arrow(tmp_path, cat):
    """A kernel whose args lack the correlation id is still tied to its launch by the ac2g flow."""
    ev = [step(0, 0, 100), step(1, 100, 100),
          runtime("cudaLaunchKernel", 10, 5, 1), kernel(GEMM, 150, 40, corr=None)] + flow(1, 10, 150, cat=cat)
    ev += [runtime("cudaLaunchKernel", 110, 5, 2), kernel(GEMM, 190, 20, corr=2)]
    t = write(tmp_path, ev)
    from diagnostics.trace.breakdowns import gpu_step_attribution

    g = gpu_step_attribution(t).sort_values("start_us")
    assert g["launch_by"].tolist() == ["flow", "correlation"]
    assert g["launch_start_us"].tolist() == [10.0, 110.0]
    assert g["launch_name"].tolist() == ["cudaLaunchKernel", "cudaLaunchKernel"]
    rows = {row["step"]: row for row in to_plain(temporal_breakdown(t))["gpu"]}
    # The kernel runs during step 1's host span but step 0 launched it (by its start: step 1).
    assert rows[0]["events"] == 1 and rows[1]["events"] == 1
    assert (rows[0]["window_us"], rows[1]["window_us"]) == (40.0, 20.0)


def test_a_kernel_without_any_launch_link_falls_back_to_time_and_is_counted(tmp_path):
    ev = [step(0, 0, 100), step(1, 100, 100),
          runtime("cudaLaunchKernel", 10, 5, 1), kernel(GEMM, 20, 30, corr=1),
          runtime("cudaLaunchKernel", 110, 5, 2), kernel(GEMM, 120, 30, corr=2),
          kernel("unlinked_kernel", 60, 10)]          # no correlation, no flow
    t = write(tmp_path, ev)
    r = to_plain(temporal_breakdown(t))
    rows = {row["step"]: row for row in r["gpu"]}
    assert r["attribution"]["time_events"] == 1 and r["attribution"]["launch_events"] == 2
    assert (rows[0]["events"], rows[1]["events"]) == (2, 1)   # in step 0's window [20, 120)
    assert r["notes"] == ["1 GPU events have no launch call in the trace (no correlation id or flow to one): "
                          "put in the step whose GPU window holds their start"]


# ---- 2. CUDA graphs: one launch, many kernels --------------------------------------------------

def graph_trace(tmp_path):
    """One step: 4 cudaLaunchKernel (5 µs calls, 2 µs kernels: launch-bound) and 3 cudaGraphLaunch
    (1200 µs calls) of 5 kernels each, every graph kernel carrying its launch's correlation id."""
    ev = [step(0, 0, 10_000)]
    t = 10.0
    for i in range(4):
        ev += [runtime("cudaLaunchKernel", t, 5, 100 + i), kernel("small_kernel", t + 20, 2, 100 + i)]
        t += 50
    for gi in range(3):
        corr = 200 + gi
        ev.append(runtime("cudaGraphLaunch", t, 1200, corr))
        for k in range(5):   # 10 µs kernels back to back from 30 µs after the call starts
            ev.append(kernel(f"graph_node_{k}", t + 30 + 10 * k, 10, corr))
        t += 2000
    return write(tmp_path, ev)


def test_graph_launches_count_once_and_keep_their_kernels_out_of_per_kernel_figures(tmp_path):
    r = to_plain(launch_stats(graph_trace(tmp_path), n=20))
    # Before: 19 "launches" and 19 kernels "shorter than their launch" (each of 15 graph kernels
    # compared with its 1200 µs graph launch).
    assert r["launches"] == 7 and r["kernel_launches"] == 4
    assert r["short_kernels"] == 4                        # the four 2 µs kernels under 5 µs calls
    assert r["mean_delay_us"] == pytest.approx(20.0)     # ordinary launches only
    assert {row["name"] for row in r["by_name"]} == {"small_kernel"}
    assert len(r["sample"]) == 4
    gr = r["graphs"]
    assert (gr["launches"], gr["kernels"], gr["mean_kernels_per_launch"]) == (3, 15, 5.0)
    assert gr["mean_runtime_us"] == 1200.0 and gr["mean_delay_us"] == 30.0
    assert gr["gpu_us"] == 150.0
    assert gr["shorter_than_launch"] == 3                 # 50 µs of kernels per 1200 µs call
    assert [(row["kernels"], row["span_us"]) for row in gr["by_launch"]] == [(5, 50.0)] * 3


def test_graph_kernels_still_belong_to_the_step_that_launched_the_graph(tmp_path):
    r = to_plain(temporal_breakdown(graph_trace(tmp_path)))
    assert [row["events"] for row in r["gpu"]] == [19]
    assert r["gpu"][0]["compute_us"] == 4 * 2 + 15 * 10


@pytest.mark.parametrize("name, graph", [("cudaGraphLaunch", True), ("cudaGraphLaunch_v10000", True),
                                         ("hipGraphLaunch", True), ("cuGraphLaunch", True),
                                         ("cudaLaunchKernel", False), ("cudaGraphInstantiate", False)])
def test_graph_launch_names(name, graph):
    from diagnostics.trace.classify import is_graph_launch

    assert is_graph_launch(name) is graph


# ---- 3. GPU work queued before profiling began -------------------------------------------------

def test_gpu_work_queued_before_profiling_is_left_out_of_step_figures(tmp_path):
    # The profile opens with the GPU still running two kernels launched before it (their launch
    # calls are not in the trace: correlation ids below every runtime call's) and a memcpy with
    # no correlation at all that ends before step 0's first launch.
    ev = [step(0, 0, 100), step(1, 100, 100),
          kernel("queued_a", 0, 30, corr=3), kernel("queued_b", 30, 50, corr=4),
          kernel("old_copy", 2, 6, cat="gpu_memcpy", stream=9),
          runtime("cudaLaunchKernel", 10, 5, 50), kernel(GEMM, 80, 20, corr=50),
          runtime("cudaLaunchKernel", 110, 5, 51), kernel(GEMM, 120, 20, corr=51)]
    t = write(tmp_path, ev)
    r = to_plain(temporal_breakdown(t))
    rows = {row["step"]: row for row in r["gpu"]}
    # Before, they counted in step 0 by their start: window [0, 100) with 100 µs of "its" work.
    assert rows[0]["window_us"] == 40.0 and rows[0]["compute_us"] == 20.0
    assert rows[0]["window_start_us"] == 80.0 and rows[0]["events"] == 1
    a = r["attribution"]
    assert a["before_profiling_events"] == 3 and a["before_profiling_us"] == 86.0
    assert "3 GPU events (0.086 ms) launched before profiling began: left out of step figures" in r["notes"]
    from diagnostics.trace.breakdowns import gpu_step_attribution

    g = gpu_step_attribution(t)
    assert set(g.loc[g["attributed"] == "before_profiling", "name"]) == {"queued_a", "queued_b", "old_copy"}


def test_a_late_kernel_with_an_unknown_early_correlation_is_also_before_profiling(tmp_path):
    """Ids are handed out in order: one below every runtime call's was launched before the trace."""
    ev = [step(0, 0, 100), runtime("cudaLaunchKernel", 10, 5, 50), kernel(GEMM, 20, 20, corr=50),
          kernel("queued", 45, 10, corr=7)]
    r = to_plain(temporal_breakdown(write(tmp_path, ev)))
    assert r["gpu"][0]["window_us"] == 20.0           # before: [20, 55), the queued kernel's end
    assert r["attribution"]["before_profiling_events"] == 1 and r["gpu"][0]["events"] == 1


# ---- 4. other accelerators and unknown categories ---------------------------------------------

MTIA_LAUNCH = "runFunction - job_prep_and_submit_for_execution"


def mtia_trace(tmp_path):
    ev = [step(0, 0, 100),
          runtime(MTIA_LAUNCH, 10, 8, 1, cat="mtia_runtime"),
          kernel("mtia_gemm_fwd", 30, 25, corr=1, stream=3, cat="mtia_ccp_events"),
          runtime(MTIA_LAUNCH, 20, 8, 2, cat="mtia_runtime"),
          kernel("dma_copy_h2d", 60, 5, corr=2, stream=3, cat="mtia_ccp_events")]
    return write(tmp_path, ev)


def test_an_mtia_trace_has_device_work(tmp_path):
    t = mtia_trace(tmp_path)
    s = to_plain(summary(t))
    assert s["has_gpu"] is True                          # before: "CPU only"
    assert s["streams"] == [{"device": "0", "stream": "3", "kernels": 1, "memcpy": 1, "memset": 0,
                             "busy_us": 30.0}]
    assert any("MTIA" in n for n in s["notes"])
    assert kernel_mask(t).sum() == 2
    assert not (host_mask(t) & t.cat_mask(frozenset({"mtia_ccp_events"}))).any()   # not host events
    r = to_plain(launch_stats(t, n=10))
    assert r["launches"] == 2 and r["mean_delay_us"] == pytest.approx((20 + 40) / 2)
    (row,) = to_plain(temporal_breakdown(t))["gpu"]
    assert (row["events"], row["compute_us"], row["memcpy_us"], row["idle_us"]) == (2, 25.0, 5.0, 5.0)
    assert s["warnings"] == []


def test_categories_no_view_reads_are_named(tmp_path):
    ev = [step(0, 0, 100), runtime("cudaLaunchKernel", 10, 5, 1), kernel(GEMM, 20, 10, corr=1)]
    ev += [{"ph": "X", "cat": "hpu_mystery_events", "name": f"op{i}", "pid": 7, "tid": 1, "ts": T0 + i,
            "dur": 1} for i in range(40)]
    ev += [{"ph": "X", "cat": "Other_Thing", "name": "x", "pid": 7, "tid": 2, "ts": T0 + 5, "dur": 1}] * 3
    t = write(tmp_path, ev)
    w = [x for x in t.warnings if "categor" in x]
    assert w == ["skipped 40 events of category 'hpu_mystery_events', 3 events of category 'Other_Thing': "
                 "no device, launch or GPU step figure reads these categories (their timed events count "
                 "only as host events on their own thread)"]
    assert to_plain(summary(t))["warnings"] == t.warnings


def test_kinetos_own_categories_are_not_named(tmp_path):
    ev = [step(0, 0, 100), runtime("cudaLaunchKernel", 10, 5, 1), kernel(GEMM, 20, 10, corr=1),
          {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": DEVICE, "tid": 7, "ts": T0 + 30,
           "dur": 4, "args": {"device": DEVICE, "stream": 7, "correlation": 9}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": CPU_PID, "tid": CPU_TID, "ts": T0 + 5, "dur": 20},
          {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": CPU_PID, "tid": CPU_TID,
           "ts": T0 + 6, "s": "t", "args": {"Bytes": 4, "Total Allocated": 4, "Device Type": 0}},
          {"ph": "X", "cat": "python_function", "name": "f.py(1): g", "pid": CPU_PID, "tid": CPU_TID,
           "ts": T0 + 1, "dur": 90},
          {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#0", "pid": DEVICE, "tid": 7,
           "ts": T0 + 20, "dur": 10}] + flow(1, 10, 20)
    t = write(tmp_path, ev)
    assert t.warnings == []
    # the sync is on the device's timeline, not a host thread
    sync = t.strings("cat") == "cuda_sync"
    assert not (host_mask(t) & sync).any()
    assert to_plain(summary(t))["threads"] and all(th["pid"] != str(DEVICE) for th in to_plain(summary(t))["threads"])
    # ... and drawn on its stream's row
    from diagnostics.trace import timeline_data

    tl = timeline_data(t)
    kinds = {lane.lane: lane.kind for lane in tl.lanes}
    (sync_bar,) = [e for e in tl.events if e.name == "Stream Sync"]
    (gemm_bar,) = [e for e in tl.events if e.name == GEMM]
    assert sync_bar.lane == gemm_bar.lane and kinds[sync_bar.lane] == "gpu"


# ---- what the user reads ----------------------------------------------------------------------

def queued_graph_trace(tmp_path):
    """graph_trace plus a kernel queued before profiling began (correlation id below every call's)."""
    t = graph_trace(tmp_path)
    doc = json.loads((tmp_path / "t.json").read_text())
    doc["traceEvents"].append(kernel("queued", 0, 8, corr=1))
    p = tmp_path / "queued_graphs.json"
    p.write_text(json.dumps(doc))
    assert len(load_trace(p)) == len(t) + 1
    return p


def test_the_text_and_the_report_say_what_was_left_out_and_what_graphs_did(tmp_path):
    from diagnostics.render.charts.traces import trace_sections
    from diagnostics.render.text import format_analysis
    from diagnostics.runner import Job, execute

    result = execute(Job("trace", None, {"path": str(queued_graph_trace(tmp_path)), "keep_columns": False}),
                     tmp_path / "run")
    left_out = "1 GPU events (0.008 ms) launched before profiling began: left out of step figures"
    assert result.temporal_breakdown.notes == (left_out,)
    text = format_analysis(result, 5)
    assert f"note (per step): {left_out}" in text
    assert "note: 3 CUDA graph launches started 15 kernels" in text
    sections = {s.title: s for s in trace_sections(result)}
    assert left_out in sections["Per step"].text
    assert any(x.startswith("3 graph launches started 15 kernels (5.0 per launch, 0.150 ms")
               for x in sections["Kernel launches"].text)
