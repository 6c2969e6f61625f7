"""What a trace event is: every classifier of the engine, each defined once.

Name and category rules (plain ``re`` / frozensets, no pandas, so the worker-side decoder can use
them) and, next to each, its vectorised mask over a loaded trace (a ``diagnostics.trace.model.Trace``;
not imported here, since model.py imports this module).
The profiler page, the trace explorer, the distributed analysis and the checklist all ask these;
a second definition anywhere else is a bug (tests/trace/test_classify.py greps for one). An inference
server's names (its iterations' annotations, its kernels' classes) are serving.py's, their one reader.
"""

from __future__ import annotations

import re

import numpy as np

from diagnostics.trace.records.communication import CommFamily, Communication, SuspectStream

# ---- steps -----------------------------------------------------------------------------------

#: A training / inference step: the range torch.profiler's ``prof.step()`` opens ("ProfilerStep#7"),
#: or one a harness opens with :func:`step_label` (the checklist's profile). The number is the step's.
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")

#: The record_function ranges the profiler job opens inside each step, in the order they run.
STEP_PHASES = ("zero_grad", "forward", "backward", "optimizer")

#: Prefix of the record_function range the profiler job opens around each module's forward:
#: "module::<qualified name>"; the root module's range is "module::(model)".
MODULE_PREFIX = "module::"
ROOT_MODULE = "(model)"

#: Outermost autograd node evaluations: their "Sequence number" names the forward op that made them.
BACKWARD_NODE_PREFIX = "autograd::engine::evaluate_function"


def step_label(n: int) -> str:
    """The name of step ``n``'s range, as torch.profiler writes it (what STEP_RE reads back)."""
    return f"ProfilerStep#{int(n)}"


def step_number(name: str) -> int | None:
    """The step number in a step range's name, or None when the name is not a step's."""
    m = STEP_RE.match(name or "")
    return int(m.group(1)) if m else None


# ---- categories ------------------------------------------------------------------------------
# Kineto's `cat`, compared lower-case (older Kineto wrote "Kernel", "Memcpy", "Runtime").

#: GPU kernels, and MTIA's device work ("mtia_ccp_events": Kineto now names it CONCURRENT_KERNEL too).
KERNEL_CATS = frozenset({"kernel", "mtia_ccp_events"})
#: MTIA's device events (among KERNEL_CATS) and runtime calls (among RUNTIME_CATS).
MTIA_CATS = frozenset({"mtia_ccp_events", "mtia_runtime"})
#: MTIA device events that are DMA transfers (HTA's "MTIA Memory" group): copies, not kernels.
MTIA_DMA_RE = re.compile(r"^dma", re.IGNORECASE)
#: Copies between host and device or device and device, run by the copy engines.
MEMCPY_CATS = frozenset({"gpu_memcpy", "memcpy"})
#: Device memsets.
MEMSET_CATS = frozenset({"gpu_memset", "memset"})
#: A copy's direction in its name, as CUPTI names copies ("Memcpy HtoD (Pageable -> Device)",
#: "Memcpy DtoH (Device -> Pinned)", "Memcpy DtoD (Device -> Device)", "Memcpy PtoP ..."; older
#: Kineto: "Memcpy HtoD"). HtoH, AtoD... are read the same way.
MEMCPY_DIRECTION_RE = re.compile(r"\b([HDAP]to[HDAP])\b")


def memcpy_direction(name: str) -> str | None:
    """"HtoD", "DtoH", "DtoD", "PtoP"... from a copy's name; None when the name does not say."""
    m = MEMCPY_DIRECTION_RE.search(name or "")
    return m.group(1) if m else None
#: A host record_function range mirrored on the GPU timeline: a label, not work.
GPU_ANNOTATION_CATS = frozenset({"gpu_user_annotation"})
#: Work the device does (kernels, copies, sets).
GPU_WORK_CATS = KERNEL_CATS | MEMCPY_CATS | MEMSET_CATS
#: Waits the device timeline records ("Stream Wait Event", "Context Sync"): neither work nor host events.
GPU_SYNC_CATS = frozenset({"cuda_sync"})
#: Everything on a device timeline (its events carry "device" and "stream").
GPU_CATS = GPU_WORK_CATS | GPU_ANNOTATION_CATS | GPU_SYNC_CATS
#: Runtime and driver calls on a host thread (cudaLaunchKernel, cudaMemcpyAsync, syncs; HIP's are
#: written as cuda_runtime too), and those of the other accelerators Kineto profiles.
RUNTIME_CATS = frozenset({"cuda_runtime", "runtime", "cuda_driver", "driver", "mtia_runtime",
                          "xpu_runtime", "xpu_driver", "privateuse1_runtime", "privateuse1_driver"})
#: Host operators: aten / c10d / custom ops dispatched by the profiler ("operator": older Kineto).
HOST_OP_CATS = frozenset({"cpu_op", "operator"})
#: Host record_function ranges (steps, phases, module ranges, gloo:/nccl: annotations).
USER_ANNOTATION_CATS = frozenset({"user_annotation"})
#: Python frames recorded by with_stack: call stacks, not operators.
PYTHON_CATS = frozenset({"python_function"})
#: Spans that frame the whole profile ("PyTorch Profiler (0)") rather than run on a thread.
FRAME_CATS = frozenset({"trace"})

#: Flow arrows from a launch call to the GPU work it started, written at the call's and the work's
#: (pid, tid, ts) with the correlation id as id ("async_cpu_to_gpu": older Kineto).
LAUNCH_FLOW_CATS = frozenset({"ac2g", "async_cpu_to_gpu"})
#: All flow arrows: launches, and forward op -> its backward ("forward_backward": older Kineto).
FLOW_CATS = LAUNCH_FLOW_CATS | frozenset({"fwdbwd", "forward_backward"})
#: Kineto categories read for what they are but not analysed as time: instant events (memory
#: records: their columns are read) and CUPTI's own overhead.
OTHER_KINETO_CATS = frozenset({"cpu_instant_event", "overhead"})
#: Every category some part of the engine reads; a trace's other categories are named in a warning.
KNOWN_CATS = (GPU_CATS | RUNTIME_CATS | HOST_OP_CATS | USER_ANNOTATION_CATS | PYTHON_CATS | FRAME_CATS
              | FLOW_CATS | OTHER_KINETO_CATS)

#: with_stack's Python-frame names, for a torch whose FunctionEvent has no is_python_function
#: (2.11): "nn.Module: Linear_0", "<built-in method ...>", "path/file.py(12): fn".
PYTHON_FRAME_NAME_RE = re.compile(r"^(?:nn\.Module: |<built-in |[^ ]*\(\d+\): )")


def is_python_frame_name(name: str) -> bool:
    return bool(PYTHON_FRAME_NAME_RE.match(name or ""))


# ---- launches ------------------------------------------------------------------------------

#: A CUDA / HIP graph launch: one runtime call whose kernels (all carrying its correlation id) are
#: the graph's nodes ("cudaGraphLaunch", "cudaGraphLaunch_v10000", "cuGraphLaunch", "hipGraphLaunch").
GRAPH_LAUNCH_RE = re.compile(r"^(?:cuda|cu|hip)GraphLaunch(?:_v\d+|_ptsz)?$")


def is_graph_launch(name: str) -> bool:
    return bool(GRAPH_LAUNCH_RE.match(name or ""))


#: A runtime call that launches a kernel (or a graph of them): its GPU work always follows, so one
#: whose work is not in the trace marks a step cut short by the end of profiling ("cudaLaunchKernel",
#: "cudaLaunchKernelExC", "cuLaunchKernel", "cudaLaunchCooperativeKernel", "hipLaunchKernel",
#: "hipExtModuleLaunchKernel", "cudaGraphLaunch").
LAUNCH_CALL_RE = re.compile(r"^(?:cuda|cu|hip)(?:Ext)?(?:Module)?(?:LaunchKernel|LaunchKernelEx|LaunchKernelExC"
                            r"|LaunchCooperativeKernel|GraphLaunch)(?:_v\d+|_ptsz|_ptds)?$")


def is_launch_call(name: str) -> bool:
    return bool(LAUNCH_CALL_RE.match(name or ""))


#: A host call that blocks until device work has finished: the synchronize calls (device, stream,
#: event, context) and the synchronous memcpys, which return only once their copy is done
#: ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cuCtxSynchronize",
#: "hipDeviceSynchronize", "cudaMemcpy"; not "cudaMemcpyAsync", not "cudaStreamWaitEvent", which
#: makes a stream, not the host, wait).
SYNC_CALL_RE = re.compile(r"^(?:(?:cuda|hip|cu)(?:Device|Stream|Event|Ctx|Thread)Synchronize"
                          r"|(?:cuda|hip)Memcpy(?:2D|3D|Peer)?)(?:_v\d+|_ptsz|_ptds)?$")


def is_sync_call(name: str) -> bool:
    return bool(SYNC_CALL_RE.match(name or ""))


# ---- communication ---------------------------------------------------------------------------

_COMM_VERBS = r"all_?reduce|all_?gather|reduce_?scatter|all_?to_?all"

#: Communication by family, first match wins; each pattern is searched in a GPU kernel's or a host
#: call's name (case-insensitive). Kernel names as the libraries' own kernels show them in Kineto traces:
#:
#: * expert-parallel all-to-all (DeepEP-style dispatch / combine): DeepEP's
#:   "deep_ep::intranode::dispatch<...>", "deep_ep::internode_ll::combine<...>", "...::notify_dispatch",
#:   "...::cached_notify_combine" and DeepSeek's own build of it ("dpsk::ep::internode::dispatch<false, 8, ...>",
#:   "dpsk::ep::internode::cached_notify<false>", read in deepseek-ai/profile-data's H800 training trace);
#:   pplx-kernels' "pplx::...dispatchKernel" / "combineKernel"; "moe_dispatch" / "ep_combine" style
#:   names. Local layout kernels in the same namespace ("dpsk::ep::cuda::get_dispatch_layout") are compute;
#: * MSCCL++ (kernels whose signature names mscclpp:: types) and MSCCL ("mscclKernel_Sum_float_Simple");
#: * NVSHMEM's own kernels ("nvshmemi_...", "nvshmem_barrier_all_on_stream");
#: * serving engines' custom all-reduce: vLLM's and sglang's "cross_device_reduce_1stage / 2stage",
#:   TensorRT-LLM's "oneShotAllReduceKernel", "twoShotAllReduceKernel", "allreduce_fusion_kernel...",
#:   its Lamport kernels, quick reduce ("quickreduce::allreduce_..."), "custom_all_reduce";
#: * torch's symmetric memory ("one_shot_all_reduce_kernel", "multimem_all_reduce_kernel",
#:   "c10d::symmetric_memory::...");
#: * RCCL: "rccl" anywhere, or an NCCL-named kernel on a ROCm trace (RCCL keeps NCCL's names:
#:   "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)" on an MI300);
#: * NCCL: "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ncclKernel_...", "nccl:all_reduce";
#: * gloo: host annotations ("gloo:all_reduce", which runs on gloo's own thread);
#: * c10d host calls: "c10d::allreduce_", "c10d::barrier", record_param_comms, ProcessGroup* ranges;
#: * any other name with a collective verb (all_reduce / allreduce, all_gather, reduce_scatter,
#:   all_to_all) anywhere, or "broadcast" / "barrier" as a word ("_c10d_functional::all_reduce").
#:   Broadcast and barrier must start a word, and a word does not start after "_": inside one they are
#:   GEMM epilogues, block barriers and ATen's elementwise launchers ("EpilogueWithBroadcast",
#:   "type_specialized_broadcast_kernel_launcher"). This last family names no library, so on the GPU
#:   the name alone is not enough (see GENERIC_FAMILY and comm_mask).
#:
#: aten:: operators never count: they are local tensor operations, and the aten names with these
#: words are shape ops (aten::broadcast_tensors, aten::broadcast_to) that an older host-op rule
#: counted as communication. Categories decide the rest (see comm_mask): memcpys, memsets and GPU
#: annotations are not collectives whatever their name.
COMM_FAMILIES = (
    ("expert-parallel all-to-all",
     r"\b(?:deep_?ep|ep|pplx|uccl_ep|mori)::(?:\w+::)*?(?:intranode|internode(?:_ll)?|low_latency|dispatch|combine"
     r"|notify_dispatch|notify_combine|cached_notify\w*|clean_low_latency_buffer)\b"
     r"|\bpplx::.*(?:dispatch|combine)|(?:^|[\s:_])(?:ep|moe|a2a|all2all)_?(?:dispatch|combine)(?:_ll)?(?:_?kernel)?\b"),
    ("MSCCL++", r"mscclpp"),
    ("MSCCL", r"\bmsccl(?:Kernel|_)"),
    ("NVSHMEM", r"nvshmem"),
    ("custom all-reduce", r"cross_device_reduce|custom_?all_?reduce|oneShotAllReduce|twoShotAllReduce|allreduce_fusion"
     r"|lamport|quick_?reduce"),
    ("torch symmetric memory", r"symmetric_memory|symm_mem|\b(?:one|two)_shot_all_reduce|multimem_"),
    ("RCCL", r"rccl"),
    ("NCCL", r"^(?:void )?nccl"),
    ("gloo", r"^gloo:"),
    ("c10d", r"^(?:c10d::|record_param_comms|ProcessGroup)"),
    ("collective", rf"{_COMM_VERBS}|(?<![a-z_])(?:broadcast|barrier)"),
)
#: The family that names no library, only an operation: a GPU kernel matched by it alone counts as
#: communication only where the trace can be distributed (world size not 1) and its stream is a
#: communication stream (comm_mask); a host call matched by it counts as it is.
GENERIC_FAMILY = "collective"
_FAMILY_RES = tuple((family, re.compile(p, re.IGNORECASE)) for family, p in COMM_FAMILIES)
#: The families that name a communication library or a collective kernel of one (all but GENERIC_FAMILY).
LIBRARY_COMM_RE = re.compile(r"^(?!aten::)(?:" + "|".join(f".*?(?:{p})" if not p.startswith("^") else f"(?:{p[1:]})"
                                                        for f, p in COMM_FAMILIES if f != GENERIC_FAMILY) + ")",
                             re.IGNORECASE)
#: Every communication family at once: a collective's name, on the GPU or the host (not aten::).
COMM_RE = re.compile(r"^(?!aten::)(?:" + "|".join(f".*?(?:{p})" if not p.startswith("^") else f"(?:{p[1:]})"
                                                for _, p in COMM_FAMILIES) + ")", re.IGNORECASE)
#: The family of kernels matched by the user's own pattern (--comm-kernels, the page's field).
USER_FAMILY = "your pattern"
#: What a ROCm trace's NCCL-named kernels are.
_ROCM_META_KEYS = ("roctracer_version", "hip_runtime_version", "hip_driver_version")


def is_comm(name: str) -> bool:
    """True when ``name`` is a collective's (COMM_RE): a communication kernel or a host collective call."""
    return bool(COMM_RE.search(name or ""))


#: A collective's operation from its name (NCCL kernels, gloo annotations, c10d ops, record_param_comms'
#: "Collective name"), first match wins: bus bandwidth and matching ranks' collectives by order read it.
COLLECTIVE_OPS = (("all_reduce", re.compile(r"all_?reduce", re.I)), ("all_gather", re.compile(r"all_?gather", re.I)),
                  ("reduce_scatter", re.compile(r"reduce_?scatter", re.I)),
                  ("all_to_all", re.compile(r"all_?to_?all", re.I)), ("broadcast", re.compile(r"broadcast", re.I)),
                  ("barrier", re.compile(r"barrier", re.I)), ("reduce", re.compile(r"reduce", re.I)),
                  ("send_recv", re.compile(r"send|recv", re.I)))


def collective_op(name: str) -> str:
    """"all_reduce", "all_gather", ... for a collective's name (the name itself when none fits)."""
    for label, pattern in COLLECTIVE_OPS:
        if pattern.search(name or ""):
            return label
    return name


def comm_family(name: str, rocm: bool = False) -> str | None:
    """The COMM_FAMILIES family of a collective's name ("NCCL", "expert-parallel all-to-all", ...;
    NCCL-named kernels are "RCCL" on a ROCm trace), or None when the name is not a collective's."""
    name = name or ""
    if name.startswith("aten::"):
        return None
    for family, pattern in _FAMILY_RES:
        if pattern.search(name):
            return "RCCL" if (family == "NCCL" and rocm) else family
    return None


def comm_kernels_pattern(text: str | None) -> re.Pattern | None:
    """The user's pattern for in-house communication kernels, compiled (None for none); a pattern that
    does not compile raises ValueError naming it."""
    if not text:
        return None
    try:
        return re.compile(text)
    except re.error as e:
        raise ValueError(f"comm_kernels: {text!r} is not a regular expression ({e})") from None


def use_comm_kernels(trace, pattern: str | None) -> None:
    """Count GPU kernels whose name matches ``pattern`` (re.search) as communication, family
    USER_FAMILY, in every view of ``trace``; the views computed so far are dropped."""
    comm_kernels_pattern(pattern)
    if trace.comm_kernels == (pattern or ""):
        return  # the views computed so far already read communication this way
    trace.comm_kernels = pattern or ""
    trace.drop_views()


# ---- host operator families ------------------------------------------------------------------

#: Host operator families for the time breakdown, first match wins (aten / c10d / record_function
#: names). "communication" is COMM_RE, so the breakdown and the distributed view agree.
OP_FAMILIES = (
    ("communication", COMM_RE),
    ("optimizer", re.compile(r"Optimizer\.|_foreach_|aten::(sgd|adam|adamw)", re.I)),
    ("autograd", re.compile(r"Backward|autograd::", re.I)),
    ("matmul", re.compile(r"aten::(mm|addmm|bmm|baddbmm|matmul|linear|_?scaled_dot_product\w*|"
                          r"einsum|addmv|mv|dot|_addmm_activation)$")),
    ("convolution", re.compile(r"conv|convolution", re.I)),
    ("normalization", re.compile(r"norm", re.I)),
    ("view", re.compile(r"aten::(view|reshape|_reshape_alias|transpose|t|permute|expand|"
                        r"as_strided|squeeze|unsqueeze|slice|select|split|chunk|narrow|"
                        r"flatten|unflatten|detach|alias|_unsafe_view|unbind|view_as)$")),
    ("memory", re.compile(r"aten::(copy_|to|_to_copy|empty|empty_like|empty_strided|zeros|"
                          r"zeros_like|ones|ones_like|full|fill_|zero_|clone|contiguous|cat|"
                          r"stack|index|index_select|gather|scatter|resize_|new_empty\w*|"
                          r"new_zeros|lift_fresh)$")),
    ("reduction", re.compile(r"aten::(sum|mean|max|min|amax|amin|argmax|argmin|prod|var|std|"
                             r"_?softmax|_?log_softmax|cross_entropy\w*|nll_loss\w*)$")),
    ("elementwise", re.compile(r"aten::\w+")),  # the remaining aten ops are mostly pointwise
)


def op_family(name: str) -> str:
    """The OP_FAMILIES label of a host operator name ("other" when none matches)."""
    for label, pattern in OP_FAMILIES:
        if pattern.search(name):
            return label
    return "other"


# ---- Tensor Cores ----------------------------------------------------------------------------

#: Kernel-name fragments that mean the kernel ran on Tensor Cores (cuBLAS / cuDNN / CUTLASS naming:
#: HMMA/IMMA/WGMMA instructions, xmma and tensorop GEMMs, the h884/s1688/h16816/i8816 tile names,
#: half and bfloat16 GEMMs, flash attention, and Hopper cuBLAS's nvjet GEMMs, e.g.
#: nvjet_sm90_hsh_128x64_64x8_1x2_h_bz_NNT for float16 and nvjet_sm90_tst_... for bfloat16, as read on
#: an H100 with CUDA 13). Architecture prefixes alone (ampere_, sm80_, cutlass_80) say nothing:
#: ampere_sgemm and cutlass_80_simt_sgemm run on the ordinary CUDA cores.
TENSOR_CORE_PATTERNS = (
    r"xmma", r"hmma", r"imma", r"wgmma", r"[hsi](?:884|1688|16816|8816)", r"tensor_?op",
    r"b?f16.*gemm", r"gemm.*b?f16", r"flash_(?:fwd|bwd)", r"fmha", r"nvjet_",
)
_TC_RE = re.compile("|".join(TENSOR_CORE_PATTERNS), re.IGNORECASE)

#: Names the patterns above match that still run on CUDA cores (all read on an H100): xmma kernels
#: doing fp32 (or complex fp32) math with FFMA instructions, e.g.
#: sm80_xmma_gemm_cf32cf32_f32f32_cf32_nt_n_..._ffma_..., cuDNN's xmma workspace initialisation, and
#: an nvjet GEMM whose operand and output types are all fp32 or fp64 (sss / ddd).
_CUDA_CORE_RE = re.compile(r"_[fd]fma_|init_device_workspace|nvjet_(?:sm\d+_)?(?:sss|ddd)_", re.IGNORECASE)

#: xmma kernels whose operands and math are all plain fp32 (no tf32 in the name) run without Tensor Cores.
_FP32_XMMA_RE = re.compile(r"f32f32_f32f32_f32", re.IGNORECASE)


def uses_tensor_cores(kernel_name: str) -> bool:
    """Name heuristic, as the TensorBoard plugin did: true when the name marks a Tensor Core kernel."""
    name = kernel_name or ""
    if (_FP32_XMMA_RE.search(name) and "tf32" not in name.lower()) or _CUDA_CORE_RE.search(name):
        return False
    return bool(_TC_RE.search(name))


# ---- masks over a Trace ----------------------------------------------------------------------
# Name rules are tested once per distinct name (Trace.name_mask), category rules once per
# distinct category (Trace.cat_mask); each mask is a boolean array over Trace.events.

def host_mask(trace) -> np.ndarray:
    """Duration events on a host thread: not device activity, not a frame span."""
    return trace.complete_mask() & ~trace.cat_mask(GPU_CATS | FRAME_CATS)


def gpu_work_mask(trace) -> np.ndarray:
    """Kernels, memcpys and memsets (annotations are labels, not work)."""
    return trace.complete_mask() & trace.cat_mask(GPU_WORK_CATS)


def kernel_mask(trace) -> np.ndarray:
    return trace.complete_mask() & trace.cat_mask(KERNEL_CATS)


def host_op_mask(trace) -> np.ndarray:
    """Host operators (cpu_op): what the operator tables count."""
    return trace.complete_mask() & trace.cat_mask(HOST_OP_CATS)


def step_mask(trace) -> np.ndarray:
    """The host step ranges (STEP_RE); the GPU mirror of a step is an annotation and left out."""
    return host_mask(trace) & trace.name_mask(STEP_RE)


_HIP_CALL_RE = re.compile(r"^hip")


def is_rocm(trace) -> bool:
    """The trace was recorded on ROCm: roctracer / HIP versions in its metadata, or HIP runtime calls."""
    if "rocm" not in trace._cache:
        trace._cache["rocm"] = any(k in trace.meta for k in _ROCM_META_KEYS) or bool(
            (trace.cat_mask(RUNTIME_CATS) & trace.name_mask(_HIP_CALL_RE)).any())
    return trace._cache["rocm"]


def user_comm_mask(trace) -> np.ndarray:
    """GPU kernels the user's pattern (Trace.comm_kernels, use_comm_kernels) names communication."""
    pattern = comm_kernels_pattern(trace.comm_kernels)
    if pattern is None:
        return np.zeros(len(trace), dtype=bool)
    return kernel_mask(trace) & trace.name_mask(pattern)


#: A GPU stream is a communication stream when at least this share of its kernel time is in kernels
#: whose names match a communication family (COMM_RE): NCCL's own streams read ~100 %, a compute stream
#: with a few "broadcast" kernels a few %.
COMM_STREAM_SHARE = 0.5


def world_size(trace) -> int | None:
    """The job's world size as the trace records it (Kineto's distributedInfo), None when it does not."""
    info = trace.meta.get("distributedInfo")
    ws = info.get("world_size") if isinstance(info, dict) else None
    return ws if isinstance(ws, int) and not isinstance(ws, bool) and ws > 0 else None


def comm_mask(trace) -> np.ndarray:
    """Collectives: communication kernels on the device, collective calls on the host (not with_stack's
    Python frames: "vllm/distributed/...(516): all_gather" is the frame around a call, not one more call),
    and the kernels the user's pattern names.

    A kernel whose name names a library or a library's collective kernel (LIBRARY_COMM_RE: NCCL, RCCL,
    custom all-reduce, ...) counts by its name. One matched only by an operation's name (GENERIC_FAMILY:
    "all_gather", "broadcast") counts only where communication can happen and runs where it runs: the
    trace's world size is not 1 (unknown counts as possible) and its stream is a communication stream
    (COMM_STREAM_SHARE of the stream's kernel time in communication-named kernels). An elementwise kernel
    launched among the model's compute kernels is not a collective, whatever its name."""
    if "comm" not in trace._cache:
        trace._cache["comm"] = _comm_mask(trace)
    return trace._cache["comm"]


def _comm_mask(trace) -> np.ndarray:
    kern = kernel_mask(trace)
    host = host_mask(trace) & ~trace.cat_mask(PYTHON_CATS)
    named = trace.name_mask(COMM_RE)
    library = trace.name_mask(LIBRARY_COMM_RE)
    generic = kern & named & ~library
    out = (kern & library) | (host & named) | user_comm_mask(trace)
    if generic.any() and world_size(trace) != 1:
        out |= generic & _on_comm_streams(trace, kern, kern & named)
    return out


def generic_kernels_left_out(trace) -> np.ndarray:
    """Kernels named like a collective (GENERIC_FAMILY) that comm_mask does not count (world size 1, or a
    compute stream): what communication()'s note names."""
    kern = kernel_mask(trace)
    return kern & trace.name_mask(COMM_RE) & ~trace.name_mask(LIBRARY_COMM_RE) & ~comm_mask(trace)


def _on_comm_streams(trace, kern: np.ndarray, named: np.ndarray) -> np.ndarray:
    """Per event: it runs on a GPU stream where at least COMM_STREAM_SHARE of the kernel time (of the
    kernel count, where no kernel has a duration) is in ``named`` kernels."""
    rows = np.flatnonzero(kern)
    out = np.zeros(len(trace), dtype=bool)
    if not rows.size:
        return out
    key = np.stack([trace.column("device")[rows], trace.column("stream")[rows],
                    trace.codes("pid")[rows].astype(np.int64), trace.codes("tid")[rows].astype(np.int64)], axis=1)
    _, inv = np.unique(key, axis=0, return_inverse=True)
    inv = inv.ravel()
    dur = np.nan_to_num(trace.column("dur")[rows].astype(float))
    hit = named[rows]
    total = np.bincount(inv, weights=dur)
    mine = np.bincount(inv, weights=np.where(hit, dur, 0.0))
    count, mine_count = np.bincount(inv), np.bincount(inv, weights=hit)
    share = np.where(total > 0, mine / np.where(total > 0, total, 1.0), mine_count / count)
    out[rows] = share[inv] >= COMM_STREAM_SHARE
    return out


def comm_families(trace, rows: np.ndarray) -> np.ndarray:
    """The communication family of each of ``rows`` (USER_FAMILY for the user's pattern; None for
    what is not communication), decided once per distinct name."""
    rocm = is_rocm(trace)
    names = trace.strings("name", rows)
    user = user_comm_mask(trace)[rows]
    comm = comm_mask(trace)[rows]
    memo: dict = {}
    out = np.empty(rows.size, dtype=object)
    for i, (name, u, c) in enumerate(zip(names, user, comm)):
        if u:
            out[i] = USER_FAMILY
        elif c:
            if name not in memo:
                memo[name] = comm_family(name, rocm)
            out[i] = memo[name]
        else:
            out[i] = None
    return out


#: A GPU stream with no communication kernel matched, where at least this share of the kernel time is
#: in kernels whose names hint at communication (COMM_HINT_RE), gets a note: they count as compute.
COMM_HINT_SHARE = 0.5
#: Words in a kernel's name that hint at communication without naming a known family.
COMM_HINT_RE = re.compile(r"send|recv|peer|p2p|ipc|nvlink|multimem|rdma|ibgda|\bcomm|collective|all2all|alltoall"
                          r"|a2a|dispatch|combine|exchange|shuffle|signal|wait_?flag|barrier|notify|proxy"
                          r"|transfer|allgather|allreduce|reduce_?scatter", re.IGNORECASE)
#: Example kernel names given in a note, at most.
HINT_EXAMPLES = 2


def communication(trace) -> Communication:
    """The trace's communication by family, and notes where it may be missing.

    Returns its record: ``families`` (family, where: "GPU" or "host", events, names, time_us, example),
    largest time first; ``comm_kernels``: the user's pattern or None; ``rocm``; ``suspect_streams`` (device,
    stream, kernel_us, hinted_us, share, examples): GPU streams with no communication matched whose kernel
    time is mostly (COMM_HINT_SHARE) in kernels whose names hint at it; ``notes``: what a reader must know
    (those streams, a distributed job with no communication kernel matched, a user pattern matching
    nothing) rather than a silent 0. Computed once per trace (and pattern).
    """
    if "communication" not in trace._cache:
        trace._cache["communication"] = _communication(trace)
    return trace._cache["communication"]


def _communication(trace) -> Communication:
    kern = kernel_mask(trace)
    comm = comm_mask(trace)
    rows = np.flatnonzero(comm)
    fams = comm_families(trace, rows)
    names = trace.strings("name", rows)
    dur = trace.column("dur")
    groups: dict = {}
    for r, fam, name in zip(rows.tolist(), fams, names):
        key = (fam, "GPU" if kern[r] else "host")
        g = groups.setdefault(key, {"family": fam, "where": key[1], "events": 0, "names": set(), "time_us": 0.0,
                                    "_top": {}})
        g["events"] += 1
        g["names"].add(name)
        g["time_us"] += float(dur[r])
        g["_top"][name] = g["_top"].get(name, 0.0) + float(dur[r])
    families = []
    for g in sorted(groups.values(), key=lambda g: (g["where"] != "GPU", -g["time_us"])):
        top = g.pop("_top")
        families.append(CommFamily(**{**g, "names": len(g["names"]), "example": max(top, key=top.get)}))
    suspects = _suspect_streams(trace, kern, comm)
    notes = []
    for s in suspects:
        notes.append(f"GPU {s.device} stream {s.stream}: {s.share:.0%} of its kernel time "
                     f"({s.kernel_us / 1e3:,.3f} ms) is in kernels whose names suggest communication but match no "
                     f"known family (e.g. {', '.join(repr(x[:80]) for x in s.examples)}): counted as compute. If "
                     "they are collectives, name them with --comm-kernels REGEX (the page's 'Communication "
                     "kernels' field).")
    gpu_comm = any(f.where == "GPU" for f in families)
    info = trace.meta.get("distributedInfo") if isinstance(trace.meta.get("distributedInfo"), dict) else {}
    world = info.get("world_size")
    if kern.any() and not gpu_comm and isinstance(world, int) and world > 1:
        notes.append(f"This trace is rank {info.get('rank', '?')} of a distributed job (world size {world}, backend "
                     f"{info.get('backend', '?')}), yet none of its GPU kernels matches a communication family "
                     "(NCCL, RCCL, MSCCL++, NVSHMEM, expert-parallel dispatch / combine, custom all-reduce): "
                     "communication reads 0 because nothing matched, which need not mean none ran. In-house "
                     "collective kernels: --comm-kernels REGEX.")
    left = np.flatnonzero(generic_kernels_left_out(trace))
    if left.size:
        ws = world_size(trace)
        why = ("the trace's world size is 1: nothing to communicate with" if ws == 1 else
               "they run on compute streams, among the model's kernels, not on a communication stream")
        top = top_name(trace.strings("name", left), np.nan_to_num(trace.column("dur")[left]))
        notes.append(f"{left.size:,} kernels ({float(np.nan_to_num(trace.column('dur')[left]).sum()) / 1e3:,.3f} ms) "
                     f"are named like a collective but not counted as communication: {why} "
                     f"(e.g. {top[:80]!r}). If they are collectives, name them with --comm-kernels REGEX.")
    if trace.comm_kernels and not user_comm_mask(trace).any():
        notes.append(f"The communication-kernel pattern {trace.comm_kernels!r} matches no GPU kernel of this trace.")
    return Communication(families=tuple(families), comm_kernels=trace.comm_kernels or None, rocm=is_rocm(trace),
                         suspect_streams=tuple(suspects), notes=tuple(notes))


def top_name(names: np.ndarray, dur: np.ndarray) -> str:
    """The name with the most time among ``names`` (their durations ``dur``)."""
    by: dict = {}
    for n, t in zip(names.tolist(), dur.tolist()):
        by[n] = by.get(n, 0.0) + t
    return max(by, key=by.get)


def _suspect_streams(trace, kern: np.ndarray, comm: np.ndarray) -> list[SuspectStream]:
    """GPU streams with no communication matched, mostly running kernels whose names hint at it."""
    rows = np.flatnonzero(kern)
    if not rows.size:
        return []
    dev, stream = trace.column("device")[rows], trace.column("stream")[rows]
    dur = np.nan_to_num(trace.column("dur")[rows])
    hinted = trace.name_mask(COMM_HINT_RE)[rows]
    is_comm = comm[rows]
    names = trace.strings("name", rows)
    out = []
    for d, s in sorted(set(zip(dev.tolist(), stream.tolist()))):
        on = (dev == d) & (stream == s)
        total = float(dur[on].sum())
        if is_comm[on].any() or total <= 0:
            continue
        hint = on & hinted
        share = float(dur[hint].sum()) / total
        if share >= COMM_HINT_SHARE:
            by_name: dict = {}
            for n, t in zip(names[hint], dur[hint]):
                by_name[n] = by_name.get(n, 0.0) + float(t)
            examples = sorted(by_name, key=by_name.get, reverse=True)[:HINT_EXAMPLES]
            out.append(SuspectStream(device=int(d), stream=int(s), kernel_us=total, hinted_us=float(dur[hint].sum()),
                                     share=share, examples=tuple(examples)))
    return out

