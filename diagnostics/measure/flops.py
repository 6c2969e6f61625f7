"""FLOPs of one call, counted exactly: torch's FlopCounterMode with formulas for the ops it lacks, and
a record of every op it still cannot count.

``FlopCounter`` is a FlopCounterMode that also counts grouped matmuls (``aten._grouped_mm``, which
transformers' mixture-of-experts layers run), the CPU and "overrideable" fused attention kernels, the
fused MultiheadAttention / TransformerEncoderLayer fast paths and the int8 / int4 weight-only matmuls,
and counts a grouped convolution's weight gradient for its groups (torch's formula counts it dense).
An op that has no formula but does arithmetic (a matmul, convolution, attention or linear-algebra name,
or any op outside aten, such as a user's ``torch.library`` op) is recorded as *not counted*, with its
calls and the modules it ran in: FLOP totals then leave it out, and a caller says so instead of
showing 0. Elementwise ops count 0 FLOPs, as in FlopCounterMode.

Backward ops are charged to the modules whose forward created the autograd node running them (see
``_Tracker``), not, as torch's ModuleTracker does, to every module between its outputs' first and its
inputs' last gradient: a layer sharing its input (query, key and value) or returning it (Dropout in
eval) was charged other layers' backward FLOPs, and torch's gradient hooks broke on parameters fed to
a module under no_grad / inference_mode (weight-norm parametrizations, DeBERTa's position projections).

``FlopCounter.result(root)`` gives a ``FlopCount``: the total, FLOPs per module (qualified names, ""
for the model) and per op (``aten::mm``, as torch.profiler names ops), and the ops not counted.
"""

from __future__ import annotations

import re
from collections import defaultdict
import math
import sys
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count, sdpa_backward_flop_count, sdpa_flop_count
from torch.utils.module_tracker import ModuleTracker

#: aten ops whose name has one of these "_"-separated words do arithmetic worth counting: an op of
#: this kind without a formula is reported as not counted.
ARITHMETIC_WORDS = frozenset({
    "mm", "bmm", "addmm", "addbmm", "baddbmm", "matmul", "einsum", "linear", "conv", "convolution",
    "attention", "gemm", "transformer", "linalg", "fft", "cholesky", "solve", "rnn", "lstm", "gru",
})
#: aten ops with such a word that move or reduce data rather than multiply matrices.
NOT_ARITHMETIC = frozenset({"fft_fftshift", "fft_ifftshift", "linalg_vector_norm", "linalg_cross"})
#: namespaces whose ops bookkeep (profiler ranges, collectives, primitive metadata): never "not counted".
QUIET_NAMESPACES = frozenset({"prim", "prims", "profiler", "c10d", "_c10d_functional",
                              "_c10d_functional_autograd", "_dtensor", "debugprims"})


class Uncountable(Exception):
    """A formula met inputs it cannot count (a nested tensor, a meta offsets tensor...)."""


def op_name(func) -> str:
    """'aten::addmm', as torch.profiler names the op."""
    packet = getattr(func, "overloadpacket", func)
    qualified = getattr(packet, "_qualified_op_name", None)  # 'mylib::foo' for a user's op too
    if qualified:
        return qualified
    return f"{getattr(packet, 'namespace', 'aten')}::{getattr(packet, '__name__', str(packet)).split('.')[-1]}"


def does_arithmetic(func) -> bool:
    """Whether an op FlopCounterMode has no formula for should be reported as not counted."""
    ns, _, base = op_name(func).partition("::")
    if ns in QUIET_NAMESPACES:
        return False
    if ns != "aten":
        return True  # a user's or a library's op: FlopCounterMode knows nothing of what it computes
    base = base.lstrip("_")
    if base in NOT_ARITHMETIC or base.startswith("upsample"):
        return False
    words = set(re.split(r"[_\d]+", base))
    return bool(words & ARITHMETIC_WORDS)


# ----------------------------------------------------------------------------- formulas
def _raw(f):
    """Mark a formula to receive the op's real arguments (tensors, not shapes): FlopCounterMode's flag."""
    f._get_raw = True
    return f


def _used(offs, default: int) -> int:
    """How much of the jagged dimension a grouped matmul computes: offs[-1] (rows past it are skipped)."""
    if offs is None:
        return default
    if offs.device.type == "meta" or offs.numel() == 0:
        raise Uncountable("grouped matmul offsets are not readable")
    try:
        return int(offs[-1].item())
    except Exception as e:  # a fake or symbolic tensor (tracing): its values do not exist yet
        raise Uncountable("grouped matmul offsets are not readable") from e


def grouped_mm_flops(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None) -> int:
    """2 x the multiply-adds of ``torch._grouped_mm(a, b, offs=offs)``, over the rows ``offs`` selects.

    2d x 3d (MoE forward): a (M, K) sliced by offs into groups, b (G, K, N) -> 2 x offs[-1] x K x N.
    3d x 2d: a (G, M, K), b (K, N) sliced along N -> 2 x M x K x offs[-1].
    2d x 2d (MoE weight gradient): a (M, K), b (K, N), the shared K sliced -> 2 x M x N x offs[-1].
    3d x 3d: a batched matmul (G, M, K) x (G, K, N) -> 2 x G x M x K x N."""
    if a.dim() == 3 and b.dim() == 3:
        g, m, k = a.shape
        return 2 * g * m * k * b.shape[-1]
    if a.dim() == 2 and b.dim() == 3:
        return 2 * _used(offs, a.shape[0]) * a.shape[1] * b.shape[-1]
    if a.dim() == 3 and b.dim() == 2:
        return 2 * a.shape[1] * a.shape[2] * _used(offs, b.shape[1])
    if a.dim() == 2 and b.dim() == 2:
        return 2 * a.shape[0] * b.shape[1] * _used(offs, a.shape[1])
    raise Uncountable(f"grouped matmul of {a.dim()}d x {b.dim()}d operands")


def _grouped(offs_at: int):
    @_raw
    def formula(*args, out_val=None, **kwargs):
        offs = kwargs["offs"] if "offs" in kwargs else (args[offs_at] if len(args) > offs_at else None)
        return grouped_mm_flops(args[0], args[1], offs)
    return formula


@_raw
def _linear_like(x, *args, out_val=None, **kwargs) -> int:
    """x (..., K) times a (packed, quantized) weight -> out (..., N): 2 x out elements x K."""
    out = out_val[0] if isinstance(out_val, (tuple, list)) else out_val
    return 2 * out.numel() * x.shape[-1]


@_raw
def _addmm_activation(bias, mat1, mat2, *args, out_val=None, **kwargs) -> int:
    return 2 * mat1.shape[0] * mat1.shape[1] * mat2.shape[1]


@_raw
def _addbmm(bias, batch1, batch2, *args, out_val=None, **kwargs) -> int:
    b, n, m = batch1.shape
    return 2 * b * n * m * batch2.shape[-1]


def _dims(t: torch.Tensor) -> tuple[int, int]:
    """(batch, length) of a batch-first (B, L, E) or unbatched (L, E) sequence."""
    if t.is_nested:
        raise Uncountable("nested-tensor input")
    return (t.shape[0], t.shape[1]) if t.dim() == 3 else (1, t.shape[0])


@_raw
def _native_mha(query, key, value, embed_dim, num_head, *args, out_val=None, **kwargs) -> int:
    """The fused MultiheadAttention fast path: q, k, v and output projections and the attention."""
    (b, lq), (_, lk) = _dims(query), _dims(key)
    e = int(embed_dim)
    return 2 * b * e * e * (2 * lq + 2 * lk) + 4 * b * lq * lk * e


@_raw
def _encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu,
                   norm_first, eps, nw1, nb1, nw2, nb2, ffn_weight_1, *args, out_val=None, **kwargs) -> int:
    """The fused TransformerEncoderLayer fast path: self-attention as above plus the two FFN matmuls."""
    b, seq = _dims(src)
    e, ff = int(embed_dim), ffn_weight_1.shape[0]
    return 2 * b * seq * e * 4 * e + 4 * b * seq * seq * e + 4 * b * seq * e * ff


def _sdpa(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def _conv_backward(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                   _output_padding, _groups, output_mask, out_shape=None, **kwargs) -> int:
    """A convolution's input and weight gradients. Each has the forward's multiply-adds: the weight's
    shape carries the groups (in channels / groups), which torch's formula drops for the weight
    gradient (a grouped convolution counted x groups, a depthwise one x channels)."""
    total = 0
    if output_mask[0]:
        total += conv_flop_count(list(grad_out_shape), list(w_shape), list(x_shape), not transposed)
    if output_mask[1]:
        total += conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed)
    return total


def _rnn_layer(input, w_ih, w_hh, *args, out_val=None, **kwargs) -> int:
    """One recurrent layer (mkldnn_rnn_layer: LSTM / GRU / RNN, one direction): at every time step and
    batch row, the input and the hidden state times their gate weights, 2 x (w_ih + w_hh) FLOPs; the
    gates' elementwise work is not counted, as for every other op (matmul FLOPs only)."""
    size = lambda shape: math.prod(shape)  # noqa: E731  (formulas get shapes, not tensors)
    steps_x_batch = size(input) // max(1, input[-1])
    return 2 * steps_x_batch * (size(w_ih) + size(w_hh))


def _rnn_layer_backward(input, w_ih, w_hh, *args, out_val=None, **kwargs) -> int:
    """Gradients of the input / hidden state and of both weights: twice the forward's matmuls."""
    return 2 * _rnn_layer(input, w_ih, w_hh)


def formulas() -> dict:
    """FLOP formulas for the ops torch's registry lacks, for FlopCounterMode's custom_mapping."""
    aten = torch.ops.aten
    table = {
        "_grouped_mm": _grouped(2),
        "_scaled_grouped_mm": _grouped(4),
        "_int_mm": _linear_like,
        "_weight_int8pack_mm": _linear_like,
        "_weight_int4pack_mm": _linear_like,
        "_weight_int4pack_mm_for_cpu": _linear_like,
        "_weight_int4pack_mm_with_scales_and_zeros": _linear_like,
        "_dyn_quant_matmul_4bit": _linear_like,
        "_addmm_activation": _addmm_activation,
        "addbmm": _addbmm,
        "_native_multi_head_attention": _native_mha,
        "_transformer_encoder_layer_fwd": _encoder_layer,
        "_scaled_dot_product_flash_attention_for_cpu": _sdpa,
        "_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_backward,
        "_scaled_dot_product_fused_attention_overrideable": _sdpa,
        "_scaled_dot_product_fused_attention_overrideable_backward": _sdpa_backward,
        "_scaled_dot_product_attention_math_for_mps": _sdpa,
        "convolution_backward": _conv_backward,
        "mkldnn_rnn_layer": _rnn_layer,  # nn.LSTM / GRU / RNN on CPU: one call per layer and direction
        "mkldnn_rnn_layer_backward": _rnn_layer_backward,
    }
    mapping = {getattr(aten, name): f for name, f in table.items() if hasattr(aten, name)}
    # transformers' MoE fallback (an opaque custom op over per-expert torch.mm), once transformers made it
    fallback = getattr(getattr(torch.ops, "transformers", None), "grouped_mm_fallback", None)
    if fallback is not None:
        mapping[fallback] = _grouped(2)
    return mapping


# ----------------------------------------------------------------------------- the counter
@dataclass
class FlopCount:
    """What one counted call did. ``not_counted``: op -> {"calls", "modules"} (the innermost modules it
    ran in, qualified names, "" for the model); ``not_counted_by_module``: module -> {op: calls}, for
    every module on the way down (a module's FLOPs leave out the ops listed under it)."""

    total: int
    by_module: dict[str, int] = field(default_factory=dict)
    by_op: dict[str, int] = field(default_factory=dict)
    not_counted: dict[str, dict] = field(default_factory=dict)
    not_counted_by_module: dict[str, dict[str, int]] = field(default_factory=dict)

    def note(self, what: str = "FLOP totals") -> str | None:
        """One sentence naming the ops not counted, or None when every op with arithmetic was counted."""
        if not self.not_counted:
            return None
        parts = []
        for op, d in sorted(self.not_counted.items(), key=lambda kv: -kv[1]["calls"]):
            where = ", ".join(m or "(model)" for m in d["modules"][:4]) + (" ..." if len(d["modules"]) > 4 else "")
            parts.append(f"{op} ({d['calls']} call{'s' if d['calls'] != 1 else ''}; in {where})")
        return (f"FLOPs not counted for {'; '.join(parts)}: torch's FlopCounterMode has no formula for "
                f"{'this op' if len(parts) == 1 else 'these ops'}, so the {what} leave them out (lower bounds)")


def _module_name(key: str, root: str) -> str | None:
    """The counter's module key ('Root.layer.0') as a qualified name ('layer.0'; '' for the root)."""
    if key == root:
        return ""
    return key[len(root) + 1:] if key.startswith(root + ".") else None


#: AccumulateGrad nodes (a leaf's gradient) have no sequence number of their own: this.
_NO_SEQUENCE = 2 ** 64 - 1


class _Tracker(ModuleTracker):
    """Which modules an op runs in: in forward, the modules whose forward is running (torch's
    ModuleTracker); in backward, the modules whose forward *created the autograd node* now running.

    torch's tracker marks a module's backward from the first gradient of its outputs to the gradient of
    its inputs: an input shared with other modules (the hidden state fed to query, key and value) gets
    its gradient only after all of them ran, so each was charged the others' backward; an output that
    is an input (Dropout in eval, Identity) never closed, charging it every later backward FLOP; and
    its gradient hooks broke on parameters fed to a module under no_grad / inference_mode. Here each
    module's forward post-hook walks the autograd nodes its call created (sequence numbers from its
    pre-hook on) and records itself as their owner; backward ops are charged to the owners of
    ``torch._C._current_autograd_node()``."""

    def __init__(self):
        super().__init__()
        self._starts: list[int] = []
        self._owners: dict[int, set[str]] = defaultdict(set)
        self._probe = torch.zeros((), requires_grad=True)

    def _next_sequence(self) -> int | None:
        """The sequence number the next autograd node of this thread gets (a probe node, unseen by modes)."""
        if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
            return None
        with _disable_current_modes():
            return self._probe.view_as(self._probe).grad_fn._sequence_nr() + 1

    def _fw_pre_hook(self, mod, input) -> None:
        self._get_append_fn(self._get_mod_name(mod), False)()
        self._starts.append(self._next_sequence())

    def _fw_post_hook(self, mod, input, output) -> None:
        name = self._get_mod_name(mod)
        self._get_pop_fn(name, False)()
        start = self._starts.pop() if self._starts else None
        if start is None:
            return
        stack = [t.grad_fn for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        seen: set[int] = set()
        while stack:
            node = stack.pop()
            seq = node._sequence_nr()
            if seq < start or seq == _NO_SEQUENCE or seq in seen:
                continue  # made before this call (an input's history), or a leaf's gradient
            seen.add(seq)
            self._owners[seq].add(name)
            stack.extend(n for n, _ in node.next_functions if n is not None)

    def current(self) -> set[str]:
        """The module names an op running now belongs to ("Global" always)."""
        if torch._C._current_graph_task_id() == -1:
            return set(self.parents)
        node = torch._C._current_autograd_node()
        return {"Global"} | (self._owners.get(node._sequence_nr(), set()) if node is not None else set())

    def __exit__(self, *args):
        super().__exit__(*args)
        self._owners.clear()
        self._starts.clear()


def _mode_without_dynamo():
    """torch's inner counting mode, its ``__torch_dispatch__`` not wrapped in ``torch._disable_dynamo``:
    that wrapper imports torch._dynamo at the first op counted (about a second, and the most of a Model
    page's first job beyond torch itself) only to keep torch.compile from tracing the counter. Used while
    dynamo is not imported (nothing compiled can be running then); None where torch lays it out otherwise."""
    try:
        from torch.utils.flop_counter import _FlopCounterMode
        raw = _FlopCounterMode.__dict__["__torch_dispatch__"].__wrapped__
    except (ImportError, KeyError, AttributeError):
        return None

    class _Mode(_FlopCounterMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False  # keeps __init_subclass__ from wrapping it again

        __torch_dispatch__ = raw

    return _Mode


_NO_DYNAMO_MODE = _mode_without_dynamo()


class FlopCounter(FlopCounterMode):
    """FlopCounterMode with ``formulas()`` that records the ops it cannot count (see the module doc)."""

    def __init__(self):
        super().__init__(display=False, custom_mapping=formulas())
        self.mod_tracker = _Tracker()
        self._not_counted: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def __enter__(self):
        self._not_counted.clear()
        if _NO_DYNAMO_MODE is None or "torch._dynamo" in sys.modules:
            return super().__enter__()
        self.flop_counts.clear()  # FlopCounterMode.__enter__, with the mode that leaves dynamo unimported
        self.mod_tracker.__enter__()
        self.mode = _NO_DYNAMO_MODE(self)
        self.mode.__enter__()
        return self

    def _count_flops(self, func_packet, out, args, kwargs):
        formula = self.flop_registry.get(func_packet)
        n = None
        if formula is not None:
            try:
                n = formula(*args, **kwargs, out_val=out)
            except Uncountable:
                n = None
        if n is None:
            if formula is not None or does_arithmetic(func_packet):
                for par in self.mod_tracker.current():
                    self._not_counted[par][op_name(func_packet)] += 1
            return out
        for par in self.mod_tracker.current():
            self.flop_counts[par][func_packet] += n
        return out

    def result(self, root: str | None = None) -> FlopCount:
        """The counts; per module only when ``root`` names the model's class (the counter's keys)."""
        counts = self.get_flop_counts()
        by_op: dict[str, int] = defaultdict(int)
        for packet, n in counts.get("Global", {}).items():
            by_op[op_name(packet)] += int(n)
        by_module, nc_by_module = {}, {}
        if root:
            for key, per_op in counts.items():
                name = _module_name(key, root)
                if name is not None:
                    by_module[name] = int(sum(per_op.values()))
            for key, per_op in self._not_counted.items():
                name = _module_name(key, root)
                if name is not None:
                    nc_by_module[name] = dict(per_op)
        not_counted = {}
        for op, calls in self._not_counted.get("Global", {}).items():
            where = [m for m, ops in nc_by_module.items() if op in ops]
            inner = sorted(m for m in where if not any(o != m and (m == "" or o.startswith(m + ".")) for o in where))
            not_counted[op] = {"calls": int(calls), "modules": inner}
        return FlopCount(int(self.get_total_flops()), by_module, dict(by_op), not_counted, nc_by_module)
