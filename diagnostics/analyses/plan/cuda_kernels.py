"""What CUDA does to a step's memory that fake tensors do not show, for a plan whose target is a GPU.

Fake tensors give every op's outputs; a GPU also holds, through the same caching allocator (so in
``torch.cuda.max_memory_allocated``):

* library workspaces, allocated at a thread's first use and kept: cuBLAS takes one per handle, and
  each thread that runs matmuls has its handle (the forward's thread and autograd's device thread
  for backward): 32 MiB on Hopper and later, 8 MiB + 128 KiB before (CUBLAS_WORKSPACE_CONFIG's
  default, aten/src/ATen/cuda/CublasHandlePool.cpp); cuBLASLt, which ``addmm`` with a bias vector
  runs on, one more per thread (1 MiB, CUBLASLT_WORKSPACE_SIZE);
* kernels' scratch, allocated and freed inside one op: a reduction that splits its input across
  thread blocks stages partial results in global memory (aten/src/ATen/native/cuda/Reduce.cuh,
  ``setReduceConfig``: ``global_memory_size`` and ``semaphore_size``; a bias gradient's sum over a
  large batch takes tens of MiB); the fused attention kernels' backward accumulates dQ in fp32;
  embedding's backward sorts its indices and sums per segment (EmbeddingBackwardKernel.cu).

And a trace on fake CPU tensors for a CUDA target (no GPU here) runs CPU kernels where CUDA picks
others: ``scaled_dot_product_attention`` on the CPU runs the math path when there is dropout (saving
the attention matrix), where CUDA runs cuDNN, flash or memory-efficient attention (saving the output
and the log-sum-exp). :class:`CudaAttention` makes the CPU trace call the kernel CUDA would pick
(sdp_utils.cpp's order and constraints) on the fake tensors, whose meta kernels give its outputs.

The sizes were checked against allocator snapshots of real steps on an H200 (torch 2.11,
bench/gpu/plan_cuda.py --snapshots; docs/BENCHMARKS.md, "Memory plan on a GPU").
"""

from __future__ import annotations

import math
import re
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from diagnostics.analyses.plan.targets import cublas_workspace_default, cublaslt_workspace_default

aten = torch.ops.aten
WARP = 32


# ----------------------------------------------------------------------------- the device
@dataclass(frozen=True)
class Arch:
    """What the kernels size themselves by: compute capability x 10, SMs, threads per SM; the cuBLAS and
    cuBLASLt workspace per handle; the torch release whose attention backend order applies."""

    sm: int
    sms: int
    threads_per_sm: int
    cublas_workspace: int
    cublaslt_workspace: int
    torch_version: tuple = (2, 11)


def torch_version() -> tuple:
    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(m.group(1)), int(m.group(2))) if m else (2, 11)


def arch_of(target) -> Arch:
    """The Arch of a CUDA target: the local GPU's properties when it is the one planned for, else the
    declared table's entry (targets.ARCH), else a Hopper. The cuBLAS workspace per handle is half the
    target's calibrated figure (which counts the forward's and backward's handles)."""
    from diagnostics.analyses.plan.targets import ARCH, DEFAULT_ARCH

    sm, sms, tpm = ARCH.get(target.name, DEFAULT_ARCH)
    if torch.cuda.is_available() and (target.source.startswith("this machine's GPU")
                                      or target.name == torch.cuda.get_device_name(0)):
        p = torch.cuda.get_device_properties(0)
        sm, sms, tpm = p.major * 10 + p.minor, p.multi_processor_count, p.max_threads_per_multi_processor
    per_handle = int(target.workspace_bytes) // 2 if target.workspace_bytes else cublas_workspace_default(sm)
    return Arch(sm, sms, tpm, per_handle, cublaslt_workspace_default(), torch_version())


# ----------------------------------------------------------------------------- reductions (Reduce.cuh)
def _last_pow2(n: int) -> int:
    return max(1, 1 << (int(n).bit_length() - 1)) if n > 0 else 1


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _iterator(shape, strides, dims, elem: int):
    """TensorIterator's view of a reduction of a tensor (shape, element strides) over ``dims``: its dims
    fastest first, reduced ones in front, coalesced. Returns (shape, input byte strides, output byte
    strides) in iterator order."""
    n = len(shape)
    out_shape = [1 if d in dims else s for d, s in enumerate(shape)]
    out_strides, acc = [0] * n, elem
    for d in reversed(range(n)):
        if d not in dims:
            out_strides[d] = acc
            acc *= out_shape[d]
    ops = ([0 if d in dims else out_strides[d] for d in range(n)], [st * elem for st in strides])

    def should_swap(d0, d1):
        for k, st in enumerate(ops):
            s0, s1 = st[d0], st[d1]
            if k == 0 and (s0 == 0) != (s1 == 0):  # the output: reduced dims to the front
                return 1 if s1 == 0 else -1
            if s0 == 0 or s1 == 0:
                continue
            if s0 != s1:
                return -1 if s0 < s1 else 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    perm = list(reversed(range(n)))
    for i in range(1, n):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            c = should_swap(perm[d0], perm[d1])
            if c > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif c < 0:
                break
    shp = [shape[p] for p in perm]
    sts = [[st[p] for p in perm] for st in ops]
    if not shp:
        return [], [], []
    prev = 0
    for d in range(1, len(shp)):  # coalesce_dimensions
        if shp[prev] == 1 or shp[d] == 1 or all(shp[prev] * st[prev] == st[d] for st in sts):
            if shp[prev] == 1:
                for st in sts:
                    st[prev] = st[d]
            shp[prev] *= shp[d]
        else:
            prev += 1
            if prev != d:
                for st in sts:
                    st[prev] = st[d]
                shp[prev] = shp[d]
    k = prev + 1
    return shp[:k], sts[1][:k], sts[0][:k]


def reduce_staging(shape, strides, dims, elem: int, acc: int, arch: Arch, offset: int = 0, vt0: int = 4,
                   max_threads: int = 512) -> list[int]:
    """Bytes a CUDA reduction kernel allocates for itself: [staging buffer, semaphores] when it reduces
    across thread blocks (ReduceConfig.should_global_reduce), else []. ``acc``: the accumulator's size."""
    numel = math.prod(shape)
    if numel == 0 or not shape:
        return []
    dims = {d % len(shape) for d in dims} if dims else set(range(len(shape)))
    shp, in_st, out_st = _iterator(list(shape), list(strides), dims, elem)
    ndim = len(shp)
    num_reduce = sum(1 for s in out_st if s == 0)
    num_outputs = max(1, math.prod(s for s, o in zip(shp, out_st) if o != 0))
    inputs_per_output = numel // num_outputs
    on_fastest = num_reduce == ndim or in_st[0] < in_st[num_reduce]
    if on_fastest:
        dim0, dim1, fastest = inputs_per_output, num_outputs, in_st[0]
    else:
        dim0, dim1, fastest = num_outputs, inputs_per_output, in_st[num_reduce]
    vec = 1
    if fastest == elem:
        if on_fastest and dim0 > 128 and num_reduce == 1:
            dim0 //= vt0  # vectorize along the input
        elif not on_fastest:
            vec = 4  # vectorize along the output (get_output_vec_size)
            for n in [offset, shp[num_reduce]] + [s // elem for j, s in enumerate(in_st) if j != num_reduce]:
                while n % vec:
                    vec //= 2
            dim0 //= vec
    mt = max_threads // vec
    d0 = _last_pow2(dim0) if dim0 < mt else mt
    d1 = _last_pow2(dim1) if dim1 < mt else mt
    bw = min(d0, WARP)
    bh = min(d1, mt // bw)
    bw = min(d0, mt // bh)
    threads = bw * bh
    step_in = step_out = 1
    block_x_reduce = False
    if ndim == 0 or on_fastest:
        step_in *= bw
        block_x_reduce = True
    else:
        step_out *= bw
    values_per_thread = _div_up(inputs_per_output, step_in)
    split_warps = values_per_thread >= min(bh * 16, 256)
    if split_warps:
        step_in *= bh
    else:
        step_out *= bh
    target_grid = arch.sms * (arch.threads_per_sm // threads)
    grid_x = _div_up(num_outputs // vec, step_out)
    values_per_thread = _div_up(inputs_per_output, step_in)
    if not (split_warps and values_per_thread >= 256 and grid_x <= target_grid):
        return []
    ctas = max(min(_div_up(target_grid, grid_x), _div_up(values_per_thread, 16)), _div_up(values_per_thread, 256))
    if ctas <= 1:
        return []
    size = acc * num_outputs * ctas
    if not block_x_reduce:
        size *= bw * vec
    return [size, 4 * grid_x]


#: reductions run by Reduce.cuh: op -> (accumulator bytes for float inputs, or None: the input's own size)
REDUCTIONS = {
    aten.sum.dim_IntList: 4, aten.sum.default: 4, aten.mean.dim: 4, aten.mean.default: 4,
    aten.nansum.default: 4, aten.prod.dim_int: 4, aten.linalg_vector_norm.default: 4,
    aten.amax.default: None, aten.amin.default: None, aten.var_mean.correction: 16, aten.var.correction: 16,
    aten.std.correction: 16, aten.std_mean.correction: 16, aten.argmax.default: 16, aten.argmin.default: 16,
}


def _reduce_dims(func, args, kwargs):
    if func in (aten.sum.default, aten.mean.default, aten.nansum.default):
        return None
    if func is aten.linalg_vector_norm.default:
        dims = args[2] if len(args) > 2 else kwargs.get("dim")
    elif func in (aten.argmax.default, aten.argmin.default):
        d = args[1] if len(args) > 1 else kwargs.get("dim")
        dims = None if d is None else [d]
    elif func is aten.prod.dim_int:
        dims = [args[1]]
    else:
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
    if dims is None:
        return None
    return [dims] if isinstance(dims, int) else list(dims)


def reduction_scratch(func, args, kwargs, arch: Arch) -> list[int]:
    acc = REDUCTIONS.get(func, 0)
    if acc == 0 or not args or not isinstance(args[0], torch.Tensor):
        return []
    x = args[0]
    if not x.is_floating_point():
        return []
    if acc is None:
        acc = x.element_size()
    elif x.dtype == torch.float64:
        acc *= 2
    dims = _reduce_dims(func, args, kwargs or {})
    try:
        return reduce_staging(tuple(x.shape), tuple(x.stride()), dims or [], x.element_size(), acc, arch,
                              offset=x.storage_offset())
    except (ValueError, ZeroDivisionError, IndexError):
        return []


# ----------------------------------------------------------------------------- other kernels' scratch
#: EmbeddingBackwardKernel.cu: NROWS_PER_THREAD, the rows one thread sums before a partial segment ends
EMBEDDING_ROWS_PER_THREAD = 10


def embedding_backward_scratch(args) -> list[int]:
    """embedding_dense_backward on CUDA sorts the indices and sums the gradient per partial segment:
    index buffers and a (numel // 10 + min(numel, num_weights)) x dim buffer in the accumulation type."""
    grad, indices, num_weights = args[0], args[1], int(args[2])
    n = indices.numel()
    if n == 0:
        return []
    dim = grad.shape[-1]
    partial = n // EMBEDDING_ROWS_PER_THREAD + min(n, num_weights)
    acc = 8 if grad.dtype == torch.float64 else 4
    return [8 * n] * 4 + [8 * partial, partial * dim * acc]


def _heads(q, k):
    """(batch, query heads, key heads, query length, key length, head dim) of [B, H, S, D] inputs."""
    return q.shape[0], q.shape[-3], k.shape[-3], q.shape[-2], k.shape[-2], q.shape[-1]


def attention_backward_scratch(func, args) -> list[int]:
    """What the fused attention kernels' backward allocate inside: cuDNN a workspace with dQ accumulated
    in fp32 and the softmax sums (plus dK and dV per query head under grouped-query attention); the
    memory-efficient kernel a contiguous gradient, its delta and fp32 accumulators; flash attention (FA2)
    dQ in fp32 and the softmax sums, rounded to its tiles. Sizes from snapshots on an H200 (cuDNN,
    efficient) and FA2's mha_bwd (flash)."""
    q, k = args[1], args[2]
    if not (isinstance(q, torch.Tensor) and q.dim() >= 3):
        return []
    b, hq, hk, sq, sk, d = _heads(q, k)
    e = q.element_size()
    if func is aten._scaled_dot_product_cudnn_attention_backward.default:
        extra = 2 * b * hq * sk * d * e if hk != hq else 0
        return [b * hq * sq * d * 4 + b * hq * sq * 4 + 256 + extra]
    if func is aten._scaled_dot_product_efficient_attention_backward.default:
        return [b * hq * sq * d * e, b * hq * sq * 4, b * hq * (2 * sk * d * 4 + 64)]
    if func is aten._scaled_dot_product_flash_attention_backward.default:
        sq_r = _div_up(sq, 128) * 128
        d_r = _div_up(d, 32 if d <= 128 else 64) * (32 if d <= 128 else 64)
        extra = [b * sk * hq * d * e] * 2 if hk != hq else []
        return [b * hq * sq_r * 4, b * sq_r * hq * d_r * 4] + extra
    return []


ATTENTION_BACKWARD = {aten._scaled_dot_product_cudnn_attention_backward.default,
                      aten._scaled_dot_product_efficient_attention_backward.default,
                      aten._scaled_dot_product_flash_attention_backward.default}
#: outputs a kernel keeps on the host, not on the device: the memory-efficient kernel's philox seed and
#: offset (CPU scalars unless a CUDA graph is being captured)
HOST_OUTPUTS = {aten._scaled_dot_product_efficient_attention.default: (2, 3)}
#: cuDNN attention's forward takes a small workspace per call
CUDNN_FORWARD_SCRATCH = 256


# ----------------------------------------------------------------------------- cuBLAS handles
BLAS_OPS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten.addbmm.default,
            aten.mv.default, aten.addmv.default, aten.dot.default, aten.vdot.default,
            aten._addmm_activation.default}
LT_OPS = {aten._addmm_activation.default}
if hasattr(aten, "_scaled_mm"):
    BLAS_OPS.add(aten._scaled_mm.default)
    LT_OPS.add(aten._scaled_mm.default)


def uses_lt(func, args) -> bool:
    """addmm runs on cuBLASLt (gemm_and_bias) when its ``self`` is a bias vector matching the output's
    columns and both matrices have more than one row and column (Blas.cpp, ``useLtInterface``)."""
    if func in LT_OPS:
        return True
    if func is not aten.addmm.default or len(args) < 3:
        return False
    bias, m1, m2 = args[0], args[1], args[2]
    return (isinstance(bias, torch.Tensor) and bias.dim() == 1 and m2.dim() == 2 and m1.dim() == 2
            and bias.shape[0] == m2.shape[1] and bias.is_contiguous()
            and bias.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64)
            and min(m1.shape) > 1 and min(m2.shape) > 1)


# ----------------------------------------------------------------------------- the ledger's hook
class CudaKernels:
    """The ledger's view of a CUDA device: ``scratch(func, args, kwargs, out)`` -> the sizes an op's kernel
    allocates and frees inside; ``workspaces(func, args, phase)`` -> the library workspaces the op makes its
    thread allocate first (name, bytes); ``host_outputs(func)``: outputs kept on the host. ``cpu_trace``:
    the fake tensors are CPU ones (then trace.py runs the step under ``cuda_choices``)."""

    def __init__(self, arch: Arch, cpu_trace: bool = False):
        self.arch = arch
        self.cpu_trace = cpu_trace
        self.persistent: dict[str, int] = {}
        self.attention: dict[str, int] = {}  # backend -> calls (CPU traces)

    def scratch(self, func, args, kwargs, out) -> list[int]:
        if func in REDUCTIONS:
            return reduction_scratch(func, args, kwargs, self.arch)
        if func in ATTENTION_BACKWARD:
            return attention_backward_scratch(func, args)
        if func is aten.embedding_dense_backward.default:
            return embedding_backward_scratch(args)
        if func is aten._scaled_dot_product_cudnn_attention.default:
            return [CUDNN_FORWARD_SCRATCH]
        return []

    def workspaces(self, func, args, phase: str) -> list[tuple[str, int]]:
        if func not in BLAS_OPS:
            return []
        thread = "backward" if phase == "backward" else "forward"
        new = []
        for lib, size, used in (("cuBLAS", self.arch.cublas_workspace, True),
                                ("cuBLASLt", self.arch.cublaslt_workspace, uses_lt(func, args))):
            name = f"{lib} ({thread} thread)"
            if used and name not in self.persistent:
                self.persistent[name] = size
                new.append((name, size))
        return new

    @staticmethod
    def host_outputs(func) -> tuple:
        return HOST_OUTPUTS.get(func, ())


# ----------------------------------------------------------------------------- attention on a CPU trace
HALF = (torch.float16, torch.bfloat16)


def attention_backend(q, k, v, attn_mask, dropout_p: float, enable_gqa: bool, arch: Arch) -> str:
    """The kernel CUDA's SDPA picks (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp): cuDNN first on
    sm90 / sm100 for fp16 / bf16 from torch 2.10 (check_prefer_cudnn_attention; seen on an H200 with
    torch 2.11, grouped-query attention included), then flash attention (fp16 / bf16, no mask, sm80+),
    memory-efficient attention (fp32 too, masks; bf16 on sm80+; no grouped-query attention), else the
    math path."""
    dq, dv = q.shape[-1], v.shape[-1]
    dt = q.dtype
    sm = arch.sm
    gqa = enable_gqa and k.dim() >= 3 and k.shape[-3] != q.shape[-3]
    if (dt in HALF and sm in (90, 100) and arch.torch_version >= (2, 10) and dq == dv and dq <= 256
            and dq % 8 == 0):
        return "cudnn"
    if dt in HALF and attn_mask is None and 80 <= sm <= 121 and dq == dv and dq <= 256 and dq % 8 == 0:
        return "flash"
    if dt in (torch.float32,) + HALF and sm >= 50 and (dt != torch.bfloat16 or sm >= 80) and not gqa:
        align = 8 if dt in HALF else 4
        if dq % align == 0 and dv % align == 0:
            return "efficient"
    return "math"


# ----------------------------------------------------------------------------- autocast's op lists
def _fns(*names):
    """The torch, torch.Tensor and torch.nn.functional callables of these names that exist."""
    import torch.nn.functional as F

    out = set()
    for name in names:
        for owner in (torch, torch.Tensor, F):
            fn = getattr(owner, name, None)
            if callable(fn):
                out.add(fn)
    return out


#: ops CUDA's autocast runs in fp32, casting fp16 / bf16 inputs up (autocast_mode.cpp's fp32 list; the AMP
#: docs' "CUDA ops that can autocast to float32") and the CPU's autocast runs in the input's dtype
CUDA_FP32_CAST = _fns("pow", "__pow__", "__rpow__", "__rdiv__", "__rtruediv__", "exp", "expm1", "log", "log10",
                      "log2", "log1p", "reciprocal", "rsqrt", "acos", "asin", "cosh", "sinh", "tan", "erfinv",
                      "softplus", "layer_norm", "group_norm", "cosine_similarity", "dist", "pdist", "renorm",
                      "logsumexp", "normalize")
#: ops CUDA's autocast runs with an fp32 output when no dtype is given (fp32_set_opt_dtype)
CUDA_FP32_OUTPUT = _fns("softmax", "log_softmax", "softmin", "sum", "prod", "cumsum", "cumprod")


class CudaAutocast(torch.overrides.TorchFunctionMode):
    """While the CPU's autocast is on in a CPU trace for a CUDA target: the ops CUDA's autocast runs in fp32
    get fp32 (their fp16 / bf16 inputs cast up, or an fp32 output asked for), as on the GPU. Ops called
    from inside another Python function torch dispatches (nn.MultiheadAttention's internals) are not
    seen: those keep the CPU's policy."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if torch.is_autocast_enabled("cpu"):
            if func in CUDA_FP32_CAST:
                up = lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype in HALF else t  # noqa: E731
                args = tuple(up(a) for a in args)
                kwargs = {k: up(v) for k, v in kwargs.items()}
            elif func in CUDA_FP32_OUTPUT and kwargs.get("dtype") is None and args and \
                    isinstance(args[0], torch.Tensor) and args[0].dtype in HALF:
                kwargs["dtype"] = torch.float32
        return func(*args, **kwargs)


@contextmanager
def cuda_choices(kernels: "CudaKernels"):
    """Inside, two functions run the kernels CUDA runs for these inputs on the fake CPU tensors, where the
    CPU's would save other tensors for backward:

    * ``scaled_dot_product_attention`` (what nn.MultiheadAttention and transformers' SDPA attention call):
      the backend CUDA picks (attention_backend), counted in ``kernels.attention``; SDPA's composite
      kernel picks its backend in C++ (a DispatchStub no dispatch mode sees), hence the swap;
    * ``dropout``: CUDA's fused kernel (aten.native_dropout) keeps a one-byte mask for backward where the
      CPU's keeps a noise tensor of the input's dtype (at::dropout's is_fused_kernel_acceptable). Dropout
      inside SDPA's math path (called from C++) keeps the CPU's.

    and autocast's ops follow CUDA's lists (CudaAutocast). Both functions are put back on the way out."""
    import torch.nn.functional as F

    originals = F.scaled_dot_product_attention, F.dropout

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        q, k, v, mask = query, key, value, attn_mask
        if torch.is_autocast_enabled("cpu"):  # CUDA's autocast runs SDPA in its compute dtype, as the CPU's does
            dt = torch.get_autocast_dtype("cpu")
            q, k, v = (t.to(dt) if t.is_floating_point() and t.dtype != dt else t for t in (q, k, v))
        backend = attention_backend(q, k, v, mask, float(dropout_p), bool(enable_gqa), kernels.arch)
        if q.dim() != 4:
            backend = "math"
        kernels.attention[backend] = kernels.attention.get(backend, 0) + 1
        with torch.autocast("cpu", enabled=False):
            return _run_attention(backend, q, k, v, mask, float(dropout_p), bool(is_causal), scale, bool(enable_gqa))

    def dropout(input, p=0.5, training=True, inplace=False):
        if not (training and 0 < p < 1 and input.numel() > 0 and input.is_floating_point()):
            return originals[1](input, p, training, inplace)
        out = aten.native_dropout(input, p, True)[0]
        return input.copy_(out) if inplace else out

    F.scaled_dot_product_attention, F.dropout = sdpa, dropout
    try:
        with CudaAutocast():
            yield
    finally:
        F.scaled_dot_product_attention, F.dropout = originals


def _run_attention(backend, q, k, v, mask, p, causal, scale, gqa):
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:  # sdp::convert_boolean_attn_mask
        mask = torch.where(mask.logical_not(), float("-inf"), 0.0).to(q.dtype)
    if backend == "math":
        return aten._scaled_dot_product_attention_math(q, k, v, mask, p, causal, None, scale=scale,
                                                       enable_gqa=gqa)[0]
    if backend == "cudnn":
        return aten._scaled_dot_product_cudnn_attention(q, k, v, mask, grad, p, causal, False, scale=scale)[0]
    if backend == "flash":
        return aten._scaled_dot_product_flash_attention(q, k, v, p, causal, False, scale=scale)[0]
    if isinstance(mask, torch.Tensor):
        mask = mask.expand(q.shape[0], q.shape[-3], q.shape[-2], k.shape[-2])
    return aten._scaled_dot_product_efficient_attention(q, k, v, mask, grad, p, causal, scale=scale)[0]
