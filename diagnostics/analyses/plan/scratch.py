"""Kernel scratch: memory an op's kernel allocates inside itself, which no dispatch mode sees.

Some kernels allocate and free buffers of their own while they run: oneDNN reorders a convolution's
input, weights and output into blocked layouts and keeps an LSTM's workspace; batch norm's backward
and CPU flash attention keep per-call or per-thread buffers; cuDNN asks for a convolution workspace.
Fake tensors cannot know these sizes, so for the ops in ``SCRATCH_OPS`` the plan measures them: the
op runs once on real tensors of the traced shapes (random values: these kernels' memory does not
depend on them), its peak above what was allocated before is taken by ``measure.memory``
(the profiler's allocation events on the CPU, ``max_memory_allocated`` on CUDA), and the scratch is
that peak less the op's outputs. One probe per op signature (op, shapes, dtypes, strides, other
arguments), cached for the job. An op whose tensors exceed ``PROBE_LIMIT_BYTES`` (a large batch) is
probed at two smaller batches that fit the limit (its batched arguments cut along their first
dimension, ``BATCHED_ARGS``) and its scratch taken on the line through them: these kernels' buffers are
reorders and per-row staging, a fixed part (the weights') plus a part per row. One that cannot be cut
so is not probed, and ``skipped`` names it. The ops were found by a survey of the accuracy corpus (every op run with such a probe).
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_leaves, tree_map

aten = torch.ops.aten

#: ops whose CPU kernels allocate scratch of their own (found on torch 2.13's CPU build)
CPU_SCRATCH_OPS = {
    aten.convolution.default, aten.convolution_backward.default,
    aten.native_batch_norm.default, aten.native_batch_norm_backward.default,
    aten.mkldnn_rnn_layer.default, aten.mkldnn_rnn_layer_backward.default,
    aten.embedding_dense_backward.default, aten._safe_softmax.default, aten.native_layer_norm_backward.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    aten._grouped_mm.default,
}
#: matmuls whose CPU kernels pack their operands in bf16 / fp16 (oneDNN), in a buffer of their own; in fp32
#: they allocate nothing beyond their output (the corpus' fp32 cases agree to the byte)
CPU_LOW_PRECISION_MATMULS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
#: ops whose CUDA kernels take a workspace from the caching allocator (cuDNN convolutions)
CUDA_SCRATCH_OPS = {aten.convolution.default, aten.convolution_backward.default}
#: the most tensor bytes one probe may allocate
PROBE_LIMIT_BYTES = 256 * 2**20
#: the tensor bytes of each of the two smaller probes an op over the limit is cut to (the line through them is
#: as good from small probes as from large ones, and much cheaper: a sweep probes batch 4096)
LINE_PROBE_BYTES = 32 * 2**20
#: per op, the arguments whose first dimension is the batch (rows): an op over the limit is probed with
#: them cut to fewer rows, and its scratch extended on a line (see the module doc)
BATCHED_ARGS = {
    aten.convolution.default: (0,), aten.convolution_backward.default: (0, 1),
    aten.native_batch_norm.default: (0,), aten.native_batch_norm_backward.default: (0, 1),
    aten.embedding_dense_backward.default: (0, 1), aten.native_layer_norm_backward.default: (0, 1, 3, 4),
    aten._scaled_dot_product_flash_attention_for_cpu.default: (0, 1, 2),
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: (0, 1, 2, 3, 4, 5),
    aten.mm.default: (0,), aten.addmm.default: (1,),
}


def _real(t: torch.Tensor, device: str, rows: int | None = None) -> torch.Tensor:
    """A real tensor with ``t``'s shape, strides (broadcast ones too) and dtype, random floats or zeros;
    ``rows``: its first dimension cut to that many."""
    shape = tuple(t.shape) if rows is None else (int(rows),) + tuple(t.shape[1:])
    size = 1 + sum((n - 1) * abs(st) for n, st in zip(shape, t.stride())) if all(shape) else 0
    base = torch.empty(size, dtype=t.dtype, device=device)
    if base.is_floating_point():
        base.normal_()
    else:
        base.zero_()
    return base.as_strided(shape, tuple(t.stride()))


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _key(func, args, kwargs):
    def one(x):
        if isinstance(x, torch.Tensor):
            return ("T", tuple(x.shape), tuple(x.stride()), str(x.dtype))
        if isinstance(x, (list, tuple)):
            return tuple(one(v) for v in x)
        return repr(x)

    return (str(func), one(list(args)), tuple(sorted((k, one(v)) for k, v in (kwargs or {}).items())))


def _rnn_backward_args(a: list) -> list:
    """mkldnn_rnn_layer_backward's arguments with output, hy, cy and the workspace made by its forward (oneDNN
    reads the workspace's layout: random bytes there crash it)."""
    (inp, w1, w2, w3, w4, hx, cx, _out, _hy, _cy, g_out, g_hy, g_cy, reverse, mode, hidden, layers, biases, train,
     bidir, batch_sizes, batch_first, _ws) = [x.contiguous() if isinstance(x, torch.Tensor) else x for x in a]
    with torch.enable_grad():  # inside backward grad mode is off, and the forward then keeps no workspace
        out, hy, cy, ws = aten.mkldnn_rnn_layer.default(inp, w1, w2, w3, w4, hx, cx, reverse, batch_sizes, mode,
                                                        hidden, layers, biases, bidir, batch_first, train)
    return [inp, w1, w2, w3, w4, hx, cx, out, hy, cy, g_out, g_hy, g_cy, reverse, mode, hidden, layers, biases, train,
            bidir, batch_sizes, batch_first, ws]


class Scratch:
    """Probes and remembers kernel scratch per op signature, on ``device`` ("cpu" or "cuda")."""

    def __init__(self, device: str):
        self.device = device
        self.ops = CUDA_SCRATCH_OPS if device == "cuda" else CPU_SCRATCH_OPS
        self.cache: dict = {}
        self.skipped: set[str] = set()
        self.probes = 0

    def _probed(self, func, args) -> bool:
        if func in self.ops:
            return True
        return self.device == "cpu" and func in CPU_LOW_PRECISION_MATMULS and any(
            isinstance(a, torch.Tensor) and a.dtype in (torch.bfloat16, torch.float16) for a in args)

    def measure(self, func, args, kwargs, out) -> tuple[int, list | None]:
        """(scratch bytes, the real storage size of each output tensor in tree_leaves order, or None): a fake
        kernel may size an output its real kernel sizes otherwise (oneDNN's RNN workspace)."""
        if not self._probed(func, args):
            return 0, None
        key = _key(func, args, kwargs)
        if key not in self.cache:
            try:
                self.cache[key] = self._probe(func, args, kwargs, out)
            except Exception as e:  # a probe must never cost the plan: that op's scratch is then not counted
                self.skipped.add(f"{func} ({type(e).__name__})")
                self.cache[key] = (0, None)
        return self.cache[key]

    def bytes(self, func, args, kwargs, out) -> int:
        return self.measure(func, args, kwargs, out)[0]

    def _probe(self, func, args, kwargs, out) -> tuple[int, list | None]:
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if sum(_nbytes(t) for t in tensors) > PROBE_LIMIT_BYTES:
            return self._probe_on_a_line(func, args, kwargs)
        return self._run_probe(func, args, kwargs)

    def _probe_on_a_line(self, func, args, kwargs) -> tuple[int, None]:
        """An op too large to probe: probed at two batches under the limit, its scratch on their line."""
        batched = BATCHED_ARGS.get(func, ())
        cut = [i for i in batched if i < len(args) and isinstance(args[i], torch.Tensor) and args[i].dim() >= 1]
        rows = {args[i].shape[0] for i in cut}
        if not cut or len(rows) != 1 or any(isinstance(t, torch.Tensor) for t in tree_leaves(kwargs or {})):
            self.skipped.add(f"{func} (over {PROBE_LIMIT_BYTES >> 20} MiB, not cut into rows)")
            return 0, None
        n = rows.pop()
        others = [t for i, a in enumerate(args) if i not in cut for t in tree_leaves(a) if isinstance(t, torch.Tensor)]
        fixed = sum(_nbytes(t) for t in others)
        per_row = sum(_nbytes(args[i]) for i in cut) / n
        cap = min(PROBE_LIMIT_BYTES, LINE_PROBE_BYTES)
        hi = int((cap - fixed) // per_row) if per_row else 0
        hi = min(hi, n - 1)
        lo = hi // 2
        if lo < 1:
            self.skipped.add(f"{func} (over {cap >> 20} MiB even at 2 rows)")
            return 0, None
        s_lo, s_hi = (self._run_probe(func, args, kwargs, rows=(cut, r))[0] for r in (lo, hi))
        return max(0, int(round(s_hi + (s_hi - s_lo) * (n - hi) / (hi - lo)))), None

    def _run_probe(self, func, args, kwargs, rows=None) -> tuple[int, list | None]:
        """The op run once for real: (scratch bytes, its outputs' storage sizes). ``rows``: (argument
        indices, rows) - those arguments cut to that many rows."""
        from torch.utils._python_dispatch import _disable_current_modes

        from diagnostics.measure.memory import added_peak_bytes

        with _disable_current_modes():
            real_args = [_real(x, self.device, rows[1] if rows and i in rows[0] else None)
                         if isinstance(x, torch.Tensor) else tree_map(
                             lambda y: _real(y, self.device) if isinstance(y, torch.Tensor) else y, x)
                         for i, x in enumerate(args)]
            real_kwargs = tree_map(lambda x: _real(x, self.device) if isinstance(x, torch.Tensor) else x,
                                   dict(kwargs or {}))
            inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((real_args, real_kwargs))
                      if isinstance(t, torch.Tensor)}
            if func is aten.mkldnn_rnn_layer_backward.default:
                real_args = _rnn_backward_args(real_args)  # its workspace must be the forward's, not noise
                inputs = {t.untyped_storage().data_ptr() for t in tree_leaves(real_args) if isinstance(t, torch.Tensor)}
            box = {}

            def run():
                box["out"] = func(*real_args, **real_kwargs)

            peak = added_peak_bytes(run, self.device)
            outs, sizes = {}, []
            for t in tree_leaves(box["out"]):
                if isinstance(t, torch.Tensor):
                    st = t.untyped_storage()
                    sizes.append(int(st.nbytes()))
                    if st.data_ptr() and st.data_ptr() not in inputs:
                        outs[st.data_ptr()] = st.nbytes()
                else:
                    sizes.append(None)
        self.probes += 1
        return max(0, int(peak) - sum(outs.values())), sizes
