"""Inference-server traces (vLLM, SGLang): their iterations rather than training steps.

serving(trace) -> Serving (records/serving.py): ``available`` False with the reason for a trace that is not a
server's, else per iteration
(one annotation the server opens around each forward: ITERATION_RE) its phase (prefill / decode /
mixed, from the annotation, else from its attention kernels' names), batch size and tokens where the
annotation records them, its time (host span; GPU span from its first kernel to its last) and the GPU time
split by what the kernels do (attention, GEMM, communication, sampling, other compute, copies) plus the
time the GPU waited on the host, adding up to the iteration's time; per phase the medians; and the CUDA /
HIP graph launches joined to the kernels they replayed (the kernels carry the launch's correlation id:
a graph's kernels are attributed to its launch, and through it to the iteration that launched it).

GPU work belongs to the iteration whose annotation holds its launch call (breakdowns._gpu_frame's
launch), as a training step's does; nested annotations of one iteration (TraceLens' execute_... around
SGLang's step[DECODE bs=32]) are one iteration, the outer span, their fields merged.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from diagnostics.trace import intervals as iv
from diagnostics.trace.breakdowns import _gpu_frame
from diagnostics.trace.classify import PYTHON_CATS, host_mask, is_graph_launch
from diagnostics.trace.model import Trace
from diagnostics.trace.records.serving import GraphReplay, GraphReplays, Serving, ServingIteration, ServingPhase

# ---- an inference server's names -----------------------------------------------------------------------

#: An inference server's iteration, as its own annotation names it (record_function ranges on the host):
#: vLLM's (as TraceLens' captures record it) "execute_<tokens>_context_<prefill requests>(...)_generation_
#: <decode requests>(...)", SGLang's "step[DECODE bs=32]" / "step[EXTEND bs=15 toks=15360]".
VLLM_ITERATION_RE = re.compile(r"^execute_(\d+)_context_(\d+)\(.*?\)_generation_(\d+)\(.*?\)$")
SGLANG_ITERATION_RE = re.compile(r"^step\[(DECODE|EXTEND|PREFILL|MIXED|IDLE|TARGET_VERIFY|DRAFT_EXTEND)"
                                 r"(?:\s+bs=(\d+))?(?:\s+toks=(\d+))?[^\]]*\]$", re.IGNORECASE)
#: Either of them.
ITERATION_RE = re.compile(f"{VLLM_ITERATION_RE.pattern}|{SGLANG_ITERATION_RE.pattern}", re.IGNORECASE)
#: Serving engines by the names of their frames and kernels (with_stack frames "vllm/v1/worker/...",
#: "sglang/srt/...", kernels "vllm::...", "sgl_hip::...").
SERVING_ENGINES = (("vLLM", re.compile(r"(?:^|[/:\s])vllm(?:/|::)", re.IGNORECASE)),
                   ("SGLang", re.compile(r"(?:^|[/:\s_])(?:sglang|sgl_\w*)(?:/|::)", re.IGNORECASE)))
#: A serving iteration's GPU time by what its kernels do, first match wins (communication is comm_mask's).
#: Attention: flash / paged / unified attention, FMHA, MLA; GEMM: cuBLAS / hipBLASLt (Cijk_), CUTLASS,
#: nvjet, CK and Triton matmuls, fused MoE GEMMs; sampling: the samplers' own kernels (top-k / top-p
#: sampling, argmax, multinomial, penalties, logprobs). MoE routing's top-k ("_topk_forward") is not sampling.
SERVING_KERNEL_CLASSES = (
    ("attention", re.compile(r"attention|attn|fmha|flash_?(?:fwd|bwd|decod|attn)|mha_|_mla_|mla_decode|paged_?attn"
                             r"|FmhaBatchPrefill|unified_attention|sdpa", re.IGNORECASE)),
    ("GEMM", re.compile(r"gemm|Cijk_|nvjet|matmul|_mm_|\bmm_|cutlass|wgmma|xmma|fused_moe|moe_?gemm|_bmm"
                        r"|splitk|ck_tile\S*Gemm", re.IGNORECASE)),
    ("sampling", re.compile(r"sampl|argmax|multinomial|top_?k_?top_?p|top_?p|penalt|logprob|gumbel", re.IGNORECASE)),
)
#: The attention kernels' phase by their names, where no annotation says it.
PREFILL_KERNEL_RE = re.compile(r"prefill|varlen|extend|flash_fwd|fmha_fwd|context_attention", re.IGNORECASE)
DECODE_KERNEL_RE = re.compile(r"decode|paged_attention|flash_decoding|splitkv|mla_decode", re.IGNORECASE)


def iteration_fields(name: str) -> dict | None:
    """What a serving iteration's annotation says: {"engine", "phase" (prefill / decode / mixed / idle),
    "batch_size", "tokens", "prefill_requests", "decode_requests"} (None where it does not say), or None
    when ``name`` is not an iteration's annotation."""
    m = VLLM_ITERATION_RE.match(name or "")
    if m:
        tokens, ctx, gen = (int(x) for x in m.groups())
        phase = "mixed" if ctx and gen else "prefill" if ctx else "decode" if gen else "idle"
        return {"engine": "vLLM", "phase": phase, "batch_size": ctx + gen, "tokens": tokens,
                "prefill_requests": ctx, "decode_requests": gen}
    m = SGLANG_ITERATION_RE.match(name or "")
    if m:
        mode, bs, toks = m.group(1).upper(), m.group(2), m.group(3)
        phase = {"DECODE": "decode", "EXTEND": "prefill", "PREFILL": "prefill", "DRAFT_EXTEND": "prefill",
                 "MIXED": "mixed", "IDLE": "idle", "TARGET_VERIFY": "decode"}[mode]
        bs = int(bs) if bs is not None else None
        return {"engine": "SGLang", "phase": phase, "batch_size": bs,
                "tokens": int(toks) if toks is not None else (bs if phase == "decode" else None),
                "prefill_requests": bs if phase == "prefill" else None,
                "decode_requests": bs if phase == "decode" else None}
    return None


def serving_kernel_class(name: str) -> str:
    """"attention", "GEMM", "sampling" (SERVING_KERNEL_CLASSES) or "other" for a compute kernel's name."""
    for label, pattern in SERVING_KERNEL_CLASSES:
        if pattern.search(name or ""):
            return label
    return "other"


# ---- iterations ------------------------------------------------------------------------------------------

#: The split of an iteration's time, in this order (GPU time counted once, the first class that runs wins),
#: then the GPU idle in two: "queued" while work the iteration had launched waited to start (launch latency,
#: a graph's set-up, or the GPU busy with work the trace does not hold), "host" the rest: nothing launched
#: yet, the GPU waiting for the host.
SPLIT = ("attention", "GEMM", "communication", "sampling", "other", "copies", "queued", "host")
#: The parts of SPLIT that are GPU work.
GPU_SPLIT = SPLIT[:-2]
#: Graph launches listed, at most (the largest GPU time first).
MAX_GRAPH_ROWS = 20


def engine(trace: Trace) -> str | None:
    """"vLLM" or "SGLang" from the trace's frame and kernel names, None when neither shows."""
    names = trace.labels("name")
    for label, pattern in SERVING_ENGINES:
        if any(pattern.search(n) for n in names):
            return label
    return None


def _iterations(trace: Trace) -> pd.DataFrame:
    """The iteration annotations on the host, nested ones merged into the outermost (start order)."""
    ev = trace.events
    rows = np.flatnonzero(host_mask(trace) & ~trace.cat_mask(PYTHON_CATS) & trace.name_mask(ITERATION_RE))
    ts, dur = ev["ts"].to_numpy()[rows], ev["dur"].to_numpy()[rows]
    lane = trace.lane_keys()[rows]
    order = np.lexsort((-dur, ts))
    out: list[dict] = []
    for r, t, d, ln, name in zip(rows[order], ts[order], dur[order], lane[order], trace.strings("name", rows[order])):
        fields = iteration_fields(str(name)) or {}
        last = out[-1] if out else None
        if last is not None and last["lane"] == ln and t < last["start_us"] + last["host_us"]:
            for k, v in fields.items():   # the inner annotation says more (SGLang's bs / toks)
                if v is not None and (last.get(k) is None or k in ("phase",)):
                    last[k] = v
            last["annotations"].append(str(name))
            continue
        out.append({"row": int(r), "lane": ln, "start_us": float(t), "host_us": float(d),
                    "annotations": [str(name)], **fields})
    return pd.DataFrame(out)


def serving(trace: Trace) -> Serving:
    """The serving view of a trace (see the module docstring). Computed once per trace."""
    if "serving" not in trace._cache:
        trace._cache["serving"] = _serving(trace)
    return trace._cache["serving"]


def _serving(trace: Trace) -> Serving:
    eng = engine(trace)
    it = _iterations(trace)
    g = _gpu_frame(trace)
    graph = np.array([is_graph_launch(str(x)) for x in g["launch_name"]], dtype=bool) if len(g) else \
        np.zeros(0, dtype=bool)
    if not len(it) and not (eng and graph.any()):
        return Serving(available=False, reason="no inference server's iteration annotations (vLLM's execute_..., "
                                               "SGLang's step[...]) nor a server's graph replays in this trace")
    notes: list[str] = []
    if not len(it):
        # A server's trace without iteration annotations: the whole trace as one iteration.
        lo = float(min(g["launch_start_us"].min(skipna=True), g["start_us"].min()))
        it = pd.DataFrame([{"row": -1, "lane": -1, "start_us": lo, "host_us": float(g["end_us"].max()) - lo,
                            "annotations": [], "engine": eng, "phase": None, "batch_size": None, "tokens": None,
                            "prefill_requests": None, "decode_requests": None}])
        notes.append("no iteration annotations: the whole trace is read as one iteration")
    starts = it["start_us"].to_numpy()
    ends = starts + it["host_us"].to_numpy()
    launch = g["launch_start_us"].to_numpy() if len(g) else np.zeros(0)
    t = np.where(np.isfinite(launch), launch, g["start_us"].to_numpy() if len(g) else launch)
    k = np.searchsorted(starts, t, side="right") - 1
    ok = (k >= 0) & (t < ends[np.maximum(k, 0)])
    owner = np.where(ok, k, -1)
    cls = _classes(trace, g)
    rows_out = []
    for i, rec in enumerate(it.to_dict("records")):
        mine = owner == i
        rows_out.append(_iteration_row(i, rec, g[mine], cls[mine], graph[mine], trace))
    unowned = int((owner < 0).sum())
    if unowned and len(it) > 1:
        notes.append(f"{unowned:,} GPU events launched outside every iteration: left out of the iterations")
    phases = []
    for ph in ("prefill", "decode", "mixed", "idle", None):
        sub = [r for r in rows_out if r["phase"] == ph]
        if not sub:
            continue
        sizes = [r["batch_size"] for r in sub if r["batch_size"] is not None]
        phases.append(ServingPhase(phase=ph or "unknown", iterations=len(sub),
                                   median_us=float(np.median([r["time_us"] for r in sub])),
                                   median_gpu_busy_us=float(np.median([r["gpu_busy_us"] for r in sub])),
                                   tokens=int(sum(r["tokens"] or 0 for r in sub)),
                                   batch_size_median=float(np.median(sizes)) if sizes else None))
    return Serving(available=True, engine=eng,
                   phase_source="annotations" if any(r["phase_from"] == "annotation" for r in rows_out) else "kernels",
                   iterations=tuple(ServingIteration(**r) for r in rows_out), phases=tuple(phases),
                   graphs=_graphs(g, graph, owner), split=SPLIT, notes=tuple(notes))


def _classes(trace: Trace, g: pd.DataFrame) -> np.ndarray:
    """Each GPU event's class in SPLIT (decided once per distinct name)."""
    out = np.empty(len(g), dtype=object)
    memo: dict = {}
    for j, (name, kind) in enumerate(zip(g["name"].tolist(), g["kind"].tolist())):
        if kind == "communication":
            out[j] = "communication"
        elif kind != "compute":   # _gpu_frame's other kinds: copies and sets
            out[j] = "copies"
        else:
            if name not in memo:
                memo[name] = serving_kernel_class(name)
            out[j] = memo[name]
    return out


def _iteration_row(i: int, rec: dict, g: pd.DataFrame, cls: np.ndarray, graph: np.ndarray, trace: Trace) -> dict:
    s, e = g["start_us"].to_numpy(), g["end_us"].to_numpy()
    start = float(rec["start_us"])
    end = max(start + float(rec["host_us"]), float(e.max()) if e.size else start)
    split, covered = {}, iv.EMPTY
    for label in GPU_SPLIT:
        m = cls == label
        u = iv.union(s[m], e[m])
        new = iv.subtract(u, covered)
        split[f"{label}_us"] = iv.length(new)
        covered = iv.union(np.r_[covered[0], new[0]], np.r_[covered[1], new[1]])
    busy = iv.length(covered)
    idle = iv.subtract((np.array([start]), np.array([end])), covered)
    split["queued_us"] = iv.length(iv.intersect(idle, _pending(g)))
    split["host_us"] = max((end - start) - busy - split["queued_us"], 0.0)
    phase, phase_from = rec.get("phase"), "annotation" if rec.get("phase") else None
    if phase is None:
        names = g["name"].to_numpy()[cls == "attention"]
        pre = any(PREFILL_KERNEL_RE.search(str(n)) for n in names)
        dec = any(DECODE_KERNEL_RE.search(str(n)) for n in names)
        phase = "mixed" if pre and dec else "prefill" if pre else "decode" if dec else None
        phase_from = "kernels" if phase else None
    corr = g["corr"].to_numpy()[graph]
    return {"iteration": i, "annotation": (rec.get("annotations") or [""])[-1], "phase": phase,
            "phase_from": phase_from, "batch_size": _int(rec.get("batch_size")), "tokens": _int(rec.get("tokens")),
            "prefill_requests": _int(rec.get("prefill_requests")), "decode_requests": _int(rec.get("decode_requests")),
            "start_us": start, "host_span_us": float(rec["host_us"]), "time_us": end - start,
            "gpu_span_us": float(e.max() - s.min()) if e.size else 0.0, "gpu_busy_us": busy, "kernels": int(len(g)),
            "graph_launches": int(np.unique(corr[corr >= 0]).size), "graph_kernels": int(graph.sum()), **split}


def _pending(g: pd.DataFrame) -> iv.Intervals:
    """When the GPU events of ``g`` had been launched and had not started: from the end of each one's launch
    call (its start where the call's duration is unknown) to the event's start. An event without a known
    launch adds nothing (its wait counts as the host's)."""
    if not len(g):
        return iv.EMPTY
    launched = g["launch_start_us"].to_numpy(dtype=float) + np.nan_to_num(g["launch_dur_us"].to_numpy(dtype=float))
    started = g["start_us"].to_numpy(dtype=float)
    m = np.isfinite(launched) & (launched < started)
    return iv.union(launched[m], started[m])


def _int(v):
    return None if v is None or (isinstance(v, float) and not np.isfinite(v)) else int(v)


def _graphs(g: pd.DataFrame, graph: np.ndarray, owner: np.ndarray) -> GraphReplays:
    """The graph launches and the kernels each replayed (by the launch's correlation id)."""
    if not graph.any():
        return GraphReplays(launches=0, kernels=0, gpu_us=0.0, share_of_gpu=None, by_launch=())
    sub = g[graph].assign(iteration=owner[graph])
    key = sub["corr"].astype(float).where(sub["corr"] >= 0, -1.0 - sub["launch_start_us"])
    per = sub.groupby(key).agg(launch_name=("launch_name", "first"), launch_start_us=("launch_start_us", "first"),
                               iteration=("iteration", "first"), kernels=("dur_us", "size"),
                               first_start_us=("start_us", "min"), last_end_us=("end_us", "max"),
                               gpu_us=("dur_us", "sum")).reset_index(drop=True)
    per["span_us"] = per["last_end_us"] - per["first_start_us"]
    total = float(g["dur_us"].sum())
    top = per.sort_values("gpu_us", ascending=False).head(MAX_GRAPH_ROWS)
    return GraphReplays(launches=int(len(per)), kernels=int(per["kernels"].sum()), gpu_us=float(per["gpu_us"].sum()),
                        share_of_gpu=float(per["gpu_us"].sum()) / total if total > 0 else None,
                        by_launch=tuple(GraphReplay(launch_name=str(r.launch_name), launch_start_us=float(r.launch_start_us),
                                                    iteration=int(r.iteration), kernels=int(r.kernels),
                                                    span_us=float(r.span_us), gpu_us=float(r.gpu_us))
                                        for r in top.itertuples()))
