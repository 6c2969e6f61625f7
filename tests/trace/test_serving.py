"""diagnostics.trace.serving on public inference-server traces (TraceLens' vLLM and SGLang captures,
tests/data/traces/with_stack and public/tracelens): iterations, phases, batch and tokens from the servers'
own annotations, the time split checked against sums of the kernels, graph launches joined to the kernels
they replayed; a training trace is not a server's (issue #42)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from diagnostics.trace import load_trace
from diagnostics.trace.serving import SPLIT, iteration_fields, serving, serving_kernel_class

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
SGLANG = DATA / "with_stack" / "sglang_qwen3_8b_decode.json.gz"
VLLM_MIXED = DATA / "with_stack" / "vllm_prefilldecode_piecewise.json.gz"
VLLM_DECODE = DATA / "public" / "tracelens" / "vllm_decode_hip_graph.json.gz"


@pytest.mark.parametrize("name, fields", [
    ("execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk32785sqsq32sqsk32785)",
     {"phase": "decode", "batch_size": 32, "tokens": 32, "prefill_requests": 0, "decode_requests": 32}),
    ("execute_8192_context_9(sq8155sk8430sqsq7475785sqsk7671310)_generation_37(sq37sk34489sqsq37sqsk34489)",
     {"phase": "mixed", "batch_size": 46, "tokens": 8192, "prefill_requests": 9, "decode_requests": 37}),
    ("execute_15360_context_15(sq15360sk15360sqsq15728640sqsk15728640)_generation_0(sq0sk0sqsq0sqsk0)",
     {"phase": "prefill", "batch_size": 15, "tokens": 15360, "prefill_requests": 15, "decode_requests": 0}),
    ("step[DECODE bs=32]", {"phase": "decode", "batch_size": 32, "tokens": 32}),
    ("step[EXTEND bs=15 toks=15360]", {"phase": "prefill", "batch_size": 15, "tokens": 15360}),
])
def test_the_servers_annotations_say_phase_batch_and_tokens(name, fields):
    got = iteration_fields(name)
    assert {k: got[k] for k in fields} == fields


@pytest.mark.parametrize("name", ["ProfilerStep#3", "execute_model", "step", "vllm/v1/worker/gpu_model_runner.py"
                                  "(3380): execute_model", ""])
def test_other_names_are_not_iterations(name):
    assert iteration_fields(name) is None


@pytest.mark.parametrize("name, cls", [
    ("void paged_attention_ll4mi_QKV_mfma16_kernel<0, __hip_bfloat16>", "attention"),
    ("kernel_unified_attention_2d", "attention"),
    ("_ZN7ck_tile6kentryILi2ENS_38FmhaBatchPrefillWithPagedKVCacheKernel", "attention"),
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT64x32x256_MI16x16x1", "GEMM"),
    ("nvjet_sm90_tst_128x64_64x8_1x2_h_bz_NNT", "GEMM"),
    ("void flashinfer::sampling::TopKTopPSamplingFromProbKernel<1024>", "sampling"),
    ("_topk_forward", "other"),        # MoE routing's top-k, not the sampler
    ("void vllm::rotary_embedding_kernel<c10::BFloat16, true>", "other"),
])
def test_kernel_classes(name, cls):
    assert serving_kernel_class(name) == cls


def _kernels(path):
    ev = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return [e for e in ev if e.get("cat") == "kernel"], ev


def test_sglang_decode_one_iteration_its_graph_and_its_split():
    s = serving(load_trace(SGLANG))
    assert s.available and s.engine == "SGLang" and s.phase_source == "annotations"
    (it,) = s.iterations   # TraceLens' execute_... around SGLang's step[DECODE bs=32]: one iteration
    assert (it.phase, it.batch_size, it.tokens, it.decode_requests) == ("decode", 32, 32, 32)
    kernels, ev = _kernels(SGLANG)
    (launch,) = [e for e in ev if e.get("name") == "hipGraphLaunch"]
    replayed = [k for k in kernels if k["args"]["correlation"] == launch["args"]["correlation"]]
    assert (it.graph_launches, it.graph_kernels) == (1, len(replayed)) == (1, 544)
    g = s.graphs
    assert g.launches == 1 and g.kernels == 544
    assert g.gpu_us == pytest.approx(sum(k["dur"] for k in replayed))
    # the split adds up to the iteration; attention is the attention kernels' union (one stream: their sum)
    assert sum(getattr(it, f"{k}_us") for k in SPLIT) == pytest.approx(it.time_us)
    attn = sum(k["dur"] for k in kernels if serving_kernel_class(k["name"]) == "attention")
    assert it.attention_us == pytest.approx(attn, rel=1e-6)
    assert it.communication_us == 0.0   # world size 1


def test_vllm_prefill_and_decode_in_one_iteration_with_piecewise_graphs():
    s = serving(load_trace(VLLM_MIXED))
    assert s.engine == "vLLM"
    (it,) = s.iterations
    assert (it.phase, it.prefill_requests, it.decode_requests, it.tokens) == ("mixed", 9, 37, 8192)
    kernels, ev = _kernels(VLLM_MIXED)
    graph_corr = {e["args"]["correlation"] for e in ev if e.get("name") == "hipGraphLaunch"}
    assert it.graph_launches == len(graph_corr) == 25
    assert it.graph_kernels == sum(k["args"]["correlation"] in graph_corr for k in kernels) == 361
    assert [p.phase for p in s.phases] == ["mixed"]
    assert sum(r.kernels for r in s.graphs.by_launch) <= 361


def test_vllm_decode_with_one_hip_graph():
    s = serving(load_trace(VLLM_DECODE))
    (it,) = s.iterations
    assert it.phase == "decode" and it.graph_launches == 1 and it.graph_kernels == 421
    assert 0.9 < s.graphs.share_of_gpu <= 1.0


@pytest.mark.parametrize("rel", ["gpu_small.json", "with_stack/h100_bert_small_step_under_python.json.gz",
                                 "public/hta/nccl_allreduce_rank0.json.gz"])
def test_a_training_or_plain_inference_trace_is_not_a_servers(rel):
    s = serving(load_trace(DATA / rel))
    assert s.available is False and "iteration annotations" in s.reason


def test_the_trace_job_the_text_and_the_report_carry_it_and_a_training_trace_is_unchanged(tmp_path, monkeypatch):
    from diagnostics.analyses.trace.job import analyze
    from diagnostics.render.charts.traces import trace_sections
    from diagnostics.render.text import format_analysis
    from diagnostics.results import UNSET, to_plain

    monkeypatch.setenv("TORCHSCOPE_DATA_DIR", str(tmp_path / "data"))

    class Ctx:
        artifact_dir = None

        def progress(self, fraction, message=""):
            pass

    r = analyze(Ctx(), {"path": str(VLLM_MIXED), "keep_columns": False})
    assert r.serving.available and r.serving.iterations[0].phase == "mixed"
    text = format_analysis(r, 5)
    assert "Inference server trace (vLLM): 1 iteration(s)" in text and "25 launch(es) replayed 361 kernels" in text
    titles = [s.title for s in trace_sections(r)]
    assert titles[:2] == ["Trace", "Serving"]
    plain = analyze(Ctx(), {"path": str(DATA / "gpu_small.json"), "keep_columns": False})
    assert plain.serving is UNSET and "serving" not in to_plain(plain)
    assert "Serving" not in [s.title for s in trace_sections(plain)]


def test_the_serving_chart_shows_every_part_of_the_split_in_a_legend_below_the_axis():
    """One iteration left no room for the seven legend entries stacked at the side (three were cut at 1280 px);
    placed at a fraction of the plot's height below it, the legend then sat on the axis title: it is at the
    figure's foot, in the margin kept for it."""
    from diagnostics.render.charts.serving import SPLIT_COLORS, build_serving_figure

    fig = build_serving_figure(serving(load_trace(VLLM_MIXED)))
    assert [t.name for t in fig.data] == [name for _, name, _ in SPLIT_COLORS]
    legend = fig.layout.legend
    assert legend.orientation == "h" and legend.yref == "container" and legend.y == 0 and legend.yanchor == "bottom"
    assert fig.layout.margin.b >= 110  # two rows of entries under the ticks and the axis title
    assert fig.layout.xaxis.title.text == "time (ms)"
    (bar,) = {round(sum(t.x[0] for t in fig.data), 1)}  # the parts add up to the iteration: 307.7 ms
    assert bar == 307.7


def _grid_split(path):
    """From the file alone, on a 0.01 µs grid: the iteration's span (its outermost annotation, to its last GPU
    event's end), the GPU busy instants, and the idle instants when a launched GPU event had not yet started
    (from its launch call's end, the graph launch's for a replayed kernel, to its start)."""
    ev = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ph") == "X"]
    calls = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime" and e.get("ph") == "X"
             and "correlation" in e.get("args", {})}
    ann = [e for e in ev if e.get("ph") == "X" and iteration_fields(e.get("name", "")) is not None]
    lo = min(e["ts"] for e in ann)
    hi = max(max(e["ts"] + e["dur"] for e in ann), max(k["ts"] + k["dur"] for k in gpu))
    step = 0.01
    n = int(round((hi - lo) / step)) + 1
    busy, pending = np.zeros(n, bool), np.zeros(n, bool)

    def mark(arr, a, b):
        arr[max(int(round((a - lo) / step)), 0):max(int(round((b - lo) / step)), 0)] = True

    for k in gpu:
        mark(busy, k["ts"], k["ts"] + k["dur"])
        call = calls.get(k["args"].get("correlation"))
        if call is not None:
            mark(pending, call["ts"] + call["dur"], k["ts"])
    idle = ~busy
    return (hi - lo), busy.sum() * step, (idle & pending).sum() * step, (idle & ~pending).sum() * step


@pytest.mark.parametrize("path", [VLLM_DECODE, VLLM_MIXED, SGLANG])
def test_the_gpus_idle_is_split_into_queued_work_and_waiting_on_the_host(path):
    """TraceLens' vLLM decode: the graph is launched 1.5 ms into the iteration and its kernels start at 8.4 ms;
    the 6.9 ms between read as 'host (GPU idle)', though the host had launched the work and was done. Queued
    (launched, not started) and host (nothing launched yet) are told apart, each checked on a grid from the
    file's own events."""
    (it,) = serving(load_trace(path)).iterations
    time_us, busy_us, queued_us, host_us = _grid_split(path)
    assert it.time_us == pytest.approx(time_us, abs=0.05)
    assert it.gpu_busy_us == pytest.approx(busy_us, abs=1.0)
    assert it.queued_us == pytest.approx(queued_us, abs=1.0) and it.host_us == pytest.approx(host_us, abs=1.0)
    assert it.gpu_busy_us + it.queued_us + it.host_us == pytest.approx(it.time_us)
    assert sum(getattr(it, f"{k}_us") for k in SPLIT) == pytest.approx(it.time_us)
    if path == VLLM_DECODE:
        assert it.queued_us > 6_000 and it.host_us < 2_000  # the graph waited ~6.9 ms after its launch


def test_a_result_from_before_queued_was_told_apart_still_draws_and_says_its_split():
    """A stored result without queued_us (its host_us still holds the queued time): no 'queued' part, no error."""
    from msgspec.structs import replace

    from diagnostics.render.charts.serving import build_serving_figure
    from diagnostics.render.trace_text import serving_lines
    from diagnostics.results import UNSET

    s = serving(load_trace(SGLANG))
    old = replace(s, iterations=tuple(replace(it, queued_us=UNSET, host_us=it.host_us + it.queued_us)
                                      for it in s.iterations))
    names = [t.name for t in build_serving_figure(old).data]
    assert "host (GPU idle)" in names and not any(n.startswith("queued") for n in names)
    line = next(x for x in serving_lines(old) if x.strip().startswith("iteration #0"))
    assert "host (GPU idle) 464.058" in line and "queued" not in line
    new = next(x for x in serving_lines(s) if x.strip().startswith("iteration #0"))
    assert "queued (launched, GPU idle) 463.285" in new
