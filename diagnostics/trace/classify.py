"""What a trace event is: every classifier of the engine, each defined once.

Name and category rules (plain ``re`` / frozensets, no pandas, so the worker-side decoder can use
them) and, next to each, its vectorised mask over a loaded trace (a ``diagnostics.trace.model.Trace``;
not imported here, since model.py imports this module).
The profiler page, the trace explorer, the distributed analysis and the checklist all ask these;
a second definition anywhere else is a bug (tests/trace/test_classify.py greps for one).
"""

from __future__ import annotations

import re
import numpy as np

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


# ---- communication ---------------------------------------------------------------------------

_COMM_VERBS = r"all_?reduce|all_?gather|reduce_?scatter|all_?to_?all"
#: A collective, on the GPU or the host, by its name:
#:
#: * NCCL's kernels and calls: "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ncclKernel_...",
#:   "nccl:all_reduce" (RCCL keeps these names);
#: * host collective calls: gloo annotations ("gloo:all_reduce", which runs on gloo's own thread),
#:   c10d ops ("c10d::allreduce_", "c10d::barrier"), record_param_comms, ProcessGroup* ranges;
#: * any other name with a collective verb (all_reduce / allreduce, all_gather, reduce_scatter,
#:   all_to_all) anywhere, or "broadcast" / "barrier" as a word ("_c10d_functional::all_reduce",
#:   symmetric-memory "one_shot_all_reduce_kernel"). Broadcast and barrier must start a word:
#:   inside one they are GEMM epilogues and block barriers ("EpilogueWithBroadcast").
#:
#: aten:: operators never count: they are local tensor operations, and the aten names with these
#: words are shape ops (aten::broadcast_tensors, aten::broadcast_to) that an older host-op rule
#: counted as communication. Categories decide the rest (see comm_mask): memcpys, memsets and GPU
#: annotations are not collectives whatever their name.
COMM_RE = re.compile(
    rf"^(?!aten::)(?:nccl|gloo:|c10d::|record_param_comms|ProcessGroup"
    rf"|.*?(?:{_COMM_VERBS}|(?<![a-z])(?:broadcast|barrier)))",
    re.IGNORECASE)


def is_comm(name: str) -> bool:
    """True when ``name`` is a collective's (COMM_RE): an NCCL kernel or a host collective call."""
    return bool(COMM_RE.search(name or ""))


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


def comm_mask(trace) -> np.ndarray:
    """Collectives (COMM_RE): NCCL kernels on the device, collective calls on the host."""
    return (kernel_mask(trace) | host_mask(trace)) & trace.name_mask(COMM_RE)

