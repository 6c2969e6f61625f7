"""What a model is made of, read from its module tree and from one forward pass with hooks.

``static_facts(model)`` counts module types, parameters (by dtype), Conv -> BatchNorm pairs,
activations, layer widths, modes, memory format, compile / DataParallel wrappers and the weight-init
scale; ``forward_facts(model, inputs)`` follows one forward (tensor identity links a module's output
to the next module's input) for the executed order, Conv -> BN pairs that actually feed each other,
redundant pairs, in-place-capable activations and dead ReLU units. The checklist's rules, the fix
catalog and the trials read the same facts. Typed records out (records.py: StaticFacts, ForwardFacts; no
tensors, no modules).
"""

from __future__ import annotations

import math
import weakref
from contextlib import contextmanager

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from diagnostics.inputs import call as call_model
from diagnostics.measure.gradflow import relu_units_alive
from diagnostics.measure.records import (
    ForwardFacts, InitScale, LayerWidth, OffWidth, RedundantPair, StaticFacts,
)
from diagnostics.tensors import tensor_key

CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
BATCHNORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
ACTIVATIONS = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.GELU, nn.SiLU, nn.Mish, nn.ELU, nn.SELU, nn.CELU,
               nn.Hardswish, nn.Hardsigmoid, nn.Softplus, nn.Sigmoid, nn.Tanh, nn.Hardtanh)
SATURATING = (nn.Sigmoid, nn.Tanh)
INPLACE_CAPABLE = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.SiLU, nn.Hardswish, nn.Hardtanh)
WEIGHTED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
#: A layer whose module path has one of these in its name is a pooler: BERT-style heads put a Tanh
#: there by design (the pretrained recipe), so it is not reported as a hidden activation.
POOLER_NAMES = ("pooler",)
#: Embedding widths below this are counts, not hidden sizes (T5's relative-attention bias has one
#: column per head): the width rule leaves them alone.
EMBEDDING_WIDTH_MIN = 64


def is_hf_conv1d(m: nn.Module) -> bool:
    """transformers' Conv1D (GPT-2 and relatives): a Linear with its weight stored (in, out)."""
    return type(m).__name__ == "Conv1D" and getattr(getattr(m, "weight", None), "dim", lambda: 0)() == 2 \
        and hasattr(m, "nf")


def is_norm(m: nn.Module) -> bool:
    """A normalisation layer, torch's or a model's own (T5LayerNorm, LlamaRMSNorm, ...)."""
    return isinstance(m, (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm) + BATCHNORM) or type(m).__name__.endswith(
        ("LayerNorm", "RMSNorm", "GroupNorm"))


#: layers that take a hidden activation as their input (a Sigmoid/Tanh feeding one is a hidden activation)
CONSUMERS = WEIGHTED + (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d, nn.Bilinear, nn.LSTM, nn.GRU,
                        nn.RNN, nn.MultiheadAttention)
#: layers between an activation and the next weighted layer that keep it that layer's nonlinearity
PASS_THROUGH = DROPOUT + BATCHNORM + (
    nn.Identity, nn.Flatten, nn.Unflatten, nn.LayerNorm, nn.GroupNorm, nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d,
    nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d)


# ----------------------------------------------------------------------------- static facts
def script_types(model: nn.Module) -> dict[str, int]:
    """Class name -> count of the TorchScript modules in ``model``, by the class each was scripted or
    traced from (``original_name``: 'Linear'), the model itself included."""
    out: dict[str, int] = {}
    for _, m in model.named_modules():
        if isinstance(m, torch.jit.ScriptModule):
            name = getattr(m, "original_name", None) or type(m).__name__
            out[name] = out.get(name, 0) + 1
    return out


#: Roles of a weight whose init scale is a convention of the architecture, not a mistake.
ROLE_ZERO = "zero-initialised"
ROLE_VOCAB_HEAD = "vocabulary head"


def init_role(weight, shape, vocabularies: set) -> str | None:
    """ROLE_ZERO for an all-zero weight (a residual branch's last projection started at zero, as ReZero,
    adaLN-Zero or zero-init-residual ResNets do, leaving the block the identity), ROLE_VOCAB_HEAD for a
    projection from the token embedding's width onto its vocabulary (``shape``: (out, in) = (vocabulary,
    width)), tied to the embedding or not, else None."""
    if weight.is_meta:
        return None
    if not bool(weight.detach().any()):
        return ROLE_ZERO
    if shape in vocabularies:
        return ROLE_VOCAB_HEAD
    return None


def _unwrapped(model: nn.Module) -> nn.Module:
    """The model inside a DataParallel / DDP wrapper or torch.compile's OptimizedModule (else the model)."""
    if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        return model.module
    if isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch.compile's OptimizedModule
        return model._orig_mod
    return model


def _init_scales(mods: list) -> list[InitScale]:
    """Each weighted layer's init: its fan-in, the weights' std, the gain std * sqrt(fan_in), and its role."""
    init = []
    # the token embedding (the one with the most rows; position and relative-position tables have fewer): a
    # Linear from its width onto its vocabulary is a vocabulary (LM) head, tied to it or not, whose init scale
    # is the architecture's convention (T5: N(0, 1))
    embeddings = [m for _, m in mods if isinstance(m, nn.Embedding) and m.num_embeddings > 1]
    rows = max((e.num_embeddings for e in embeddings), default=0)
    vocabularies = {(e.num_embeddings, e.embedding_dim) for e in embeddings if e.num_embeddings == rows}
    for n, m in mods:
        if is_hf_conv1d(m) and m.weight.numel() > 1:
            fan_in = m.weight.shape[0]  # stored (in, out)
            std = float(m.weight.detach().float().std())
            init.append(InitScale(name=n, type="Conv1D", fan_in=fan_in, std=std, gain=std * math.sqrt(fan_in),
                                  role=init_role(m.weight, (m.weight.shape[1], fan_in), vocabularies)))
        elif isinstance(m, WEIGHTED) and m.weight is not None and m.weight.numel() > 1:
            fan_in = m.weight[0].numel()
            std = float(m.weight.detach().float().std())
            out = tuple(m.weight.shape) if isinstance(m, nn.Linear) else None  # (out, in)
            init.append(InitScale(name=n, type=type(m).__name__, fan_in=fan_in, std=std,
                                  gain=std * math.sqrt(fan_in), role=init_role(m.weight, out, vocabularies)))
    return init


def _channels_last(conv2d: list) -> bool:
    """Every 2-D convolution with a spatial kernel keeps its weight channels-last (and there is one)."""
    return bool(conv2d) and all(
        m.weight.is_contiguous(memory_format=torch.channels_last) and not m.weight.is_contiguous()
        for m in conv2d if m.weight.dim() == 4 and m.weight.shape[2:] != (1, 1))


def static_facts(model: nn.Module) -> StaticFacts:
    """Facts from the module tree alone."""
    types: dict[str, int] = {}
    for _, m in model.named_modules():
        types[type(m).__name__] = types.get(type(m).__name__, 0) + 1
    mods = list(_unwrapped(model).named_modules())
    convs = [(n, m) for n, m in mods if isinstance(m, CONV)]
    bns = [(n, m) for n, m in mods if isinstance(m, BATCHNORM)]
    drops = [(n, m) for n, m in mods if isinstance(m, DROPOUT)]
    acts = [(n, m) for n, m in mods if isinstance(m, ACTIVATIONS)]
    act_counts: dict[str, int] = {}
    for _, m in acts:
        act_counts[type(m).__name__] = act_counts.get(type(m).__name__, 0) + 1
    inplace = [n for n, m in acts if isinstance(m, INPLACE_CAPABLE) and getattr(m, "inplace", False)]
    not_inplace = [n for n, m in acts if isinstance(m, INPLACE_CAPABLE) and not getattr(m, "inplace", False)]
    params = list({id(p): p for p in model.parameters()}.values())
    dtypes: dict[str, int] = {}
    for p in params:
        key = str(p.dtype).replace("torch.", "")
        dtypes[key] = dtypes.get(key, 0) + p.numel()
    conv2d = [m for _, m in convs if isinstance(m, nn.Conv2d)]
    dp = isinstance(model, nn.DataParallel)
    ddp = isinstance(model, nn.parallel.DistributedDataParallel)
    dist_backend = None
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        dist_backend = str(torch.distributed.get_backend())
    return StaticFacts(
        model_type=type(model).__name__,
        module_types=types,
        n_modules=len(mods),
        n_conv=len(convs), n_conv2d=len(conv2d), n_batchnorm=len(bns), n_dropout=len(drops),
        n_linear=sum(1 for _, m in mods if isinstance(m, nn.Linear) or is_hf_conv1d(m)),
        n_hf_conv1d=sum(1 for _, m in mods if is_hf_conv1d(m)),
        n_norm=sum(1 for _, m in mods if is_norm(m)),
        n_rnn=sum(1 for _, m in mods if isinstance(m, (nn.LSTM, nn.GRU, nn.RNN))),
        n_attention=sum(1 for _, m in mods if isinstance(m, nn.MultiheadAttention)),
        activations=act_counts,
        inplace_activations=len(inplace), not_inplace_activations=tuple(not_inplace),
        training=bool(model.training),
        dropout_p0=tuple(n for n, m in drops if getattr(m, "p", None) == 0),
        dropout_bn_train=tuple(n for n, m in drops + bns if m.training),
        dropout_bn_eval=tuple(n for n, m in drops + bns if not m.training),
        param_dtypes=dtypes,
        params_total=sum(p.numel() for p in params),
        param_bytes=sum(p.numel() * p.element_size() for p in params),
        params_trainable=sum(p.numel() for p in params if p.requires_grad),
        channels_last=_channels_last(conv2d),
        compiled=hasattr(model, "_orig_mod") or type(model).__name__ == "OptimizedModule",
        torchscript=isinstance(model, torch.jit.ScriptModule),
        # a TorchScript program's modules are compiled (RecursiveScriptModule): the classes they were made from
        script_types=script_types(model),
        data_parallel=dp,
        data_parallel_devices=len(model.device_ids or []) if dp else 0,
        ddp=ddp,
        dist_backend=dist_backend,
        init=tuple(_init_scales(mods)),
        quantized=any("quantized" in type(m).__module__ for _, m in mods),
    )


class _TensorMap:
    """Values keyed by tensor identity, valid only while that tensor lives: ``id()`` alone can be
    reused by a later tensor at the same address once the first is freed, which would link layers
    that never fed each other. A weak reference tells the two apart."""

    def __init__(self):
        self._d: dict[int, tuple] = {}

    def put(self, t, value) -> None:
        if isinstance(t, torch.Tensor):
            self._d[id(t)] = (weakref.ref(t), value)

    def get(self, t):
        entry = self._d.get(id(t)) if isinstance(t, torch.Tensor) else None
        return entry[1] if entry is not None and entry[0]() is t else None


class _Uses(TorchFunctionMode):
    """How many torch calls that return tensors read each tensor, during one forward (an output that
    also feeds a residual add is read twice). ``size()`` / ``shape`` reads return no tensor: not counted."""

    def __init__(self):
        super().__init__()
        self._d: dict[int, list] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(o, torch.Tensor) for o in tree_flatten(out)[0]):
            for t in {id(a): a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)}.values():
                entry = self._d.get(id(t))
                if entry is None or entry[0]() is not t:
                    self._d[id(t)] = [weakref.ref(t), 1]
                else:
                    entry[1] += 1
        return out

    def count(self, t) -> int:
        entry = self._d.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else 0


def _shares_weights(first: nn.Module, second: nn.Module) -> bool:
    """The same module applied twice, or two modules holding one weight (tied, or over one storage)."""
    return first is second or bool({tensor_key(p) for p in first.parameters()}
                                   & {tensor_key(p) for p in second.parameters()})


def _first_tensor(args):
    return args[0] if args and isinstance(args[0], torch.Tensor) else None


def _redundant_pair(first: nn.Module, second: nn.Module) -> str | None:
    """Why ``second``, reading ``first``'s output tensor as it is, adds nothing; None if it does.

    * Linear -> Linear with nothing between: W2 (W1 x + b1) + b2 is one Linear. Only said when the
      one Linear is no bigger than the two (in x out <= mid x (in + out)); a narrower middle is a
      low-rank factorisation, on purpose.
    * the same activation twice (ReLU(ReLU(x)) = ReLU(x); the others only distort);
    * BatchNorm straight after BatchNorm: the second re-normalises each channel, undoing the first's
      scale and shift (in eval mode the two are one affine map). Not said of LayerNorm / GroupNorm,
      whose per-feature affine the next norm does not undo (a post-norm encoder's last norm2
      followed by a final LayerNorm is common and not a no-op).
    """
    if isinstance(first, nn.Linear) and isinstance(second, nn.Linear):
        if _shares_weights(first, second):
            return None  # one weight applied twice (ALBERT-style sharing): merging would undo the sharing
        a, mid, b = first.in_features, first.out_features, second.out_features
        if a * b <= mid * (a + b):
            return f"Linear {a}->{mid} then Linear {mid}->{b} with no nonlinearity between: one Linear {a}->{b}"
        return None
    if isinstance(second, ACTIVATIONS) and type(first) is type(second):
        return f"{type(first).__name__} applied twice in a row"
    if isinstance(second, BATCHNORM) and type(first) is type(second) and not _shares_weights(first, second):
        return f"{type(first).__name__} straight after {type(first).__name__}"
    return None


#: Pairs that add nothing only if the first one's output goes nowhere else: merging two Linears (or
#: dropping the first BatchNorm) needs the middle tensor for nothing but the second layer.
_NEEDS_SOLE_USE = (nn.Linear,) + BATCHNORM


@contextmanager
def _trace_hooks(model: nn.Module, order: list, pairs: list, relu_stats: dict, hidden: set, redundant: list):
    """Record leaf execution order, Conv -> BN pairs (the BN's input is the conv's output tensor),
    per-unit activity of ReLU outputs, and the Sigmoid/Tanh modules whose output tensor is the input
    of a Linear / Conv / RNN / attention layer (``hidden``: used as a layer's nonlinearity; a gate
    multiplied into features, as in Squeeze-Excitation, is not). Layers that only reshape, pool,
    normalise or drop pass that on. ``redundant`` gets layers that add nothing to the one feeding
    them (see ``_redundant_pair``). Hooks are removed and each module's mode restored in ``finally``."""
    handles, modes = [], [(m, m.training) for m in model.modules()]
    produced = _TensorMap()  # output tensor -> (name, module) of the leaf that returned it last
    saturating = _TensorMap()  # output tensor -> name of the Sigmoid/Tanh it comes from
    try:
        for name, m in model.named_modules():
            if isinstance(m, torch.jit.ScriptModule):
                continue
            leaf = not list(m.children())
            if not leaf:
                if isinstance(m, CONSUMERS):  # e.g. MultiheadAttention (its projections are not called as modules)
                    def consumer_pre(mod, inp):
                        src = saturating.get(_first_tensor(inp))
                        if src is not None:
                            hidden.add(src)
                    handles.append(m.register_forward_pre_hook(consumer_pre))
                continue

            def fwd(mod, inp, out, name=name):
                x = _first_tensor(inp)
                order.append({"name": name, "type": type(mod).__name__, "in_shape": None if x is None else list(x.shape)})
                if not isinstance(out, torch.Tensor):
                    return
                # an in-place activation returns its input: the tensor is now the activation's
                produced.put(out, (name, mod))
                if isinstance(mod, SATURATING):
                    saturating.put(out, name)
                elif isinstance(mod, PASS_THROUGH):
                    src = saturating.get(x)
                    if src is not None:
                        saturating.put(out, src)
                if isinstance(mod, (nn.ReLU, nn.ReLU6)):
                    # A unit (feature / channel) is dead when it is zero for every sample and position;
                    # the Gradient-flow page's rule, so the two pages agree.
                    alive = relu_units_alive(out)
                    prev = relu_stats.get(name)
                    if alive is not None:
                        relu_stats[name] = alive if prev is None or prev.shape != alive.shape else (prev | alive)

            def pre(mod, inp, name=name):
                x = _first_tensor(inp)
                src = produced.get(x)
                if isinstance(mod, BATCHNORM) and src is not None and isinstance(src[1], CONV):
                    pairs.append([src[0], name])
                why = None if src is None else _redundant_pair(src[1], mod)
                if why and not any(r["layers"] == [src[0], name] for r in redundant):
                    # the tensor is kept until the forward ends: whether it fans out is known only then
                    redundant.append({"layers": [src[0], name], "why": why,
                                      "_tensor": x if isinstance(src[1], _NEEDS_SOLE_USE) else None})
                if isinstance(mod, CONSUMERS):
                    sat = saturating.get(x)
                    if sat is not None:
                        hidden.add(sat)

            handles.append(m.register_forward_hook(fwd))
            handles.append(m.register_forward_pre_hook(pre))
        yield
    finally:
        for h in handles:
            h.remove()
        for m, training in modes:
            m.training = training


def forward_facts(model: nn.Module, inputs: tuple) -> ForwardFacts:
    """Facts from one forward in eval mode without grad: execution order, Conv->BN pairs,
    hidden saturating activations (Sigmoid/Tanh feeding a weighted layer), layer widths in
    execution order, dead ReLU units. Each module's train/eval mode is restored."""
    order, pairs, relu_stats, hidden, redundant = [], [], {}, set(), []
    uses = _Uses()
    with _trace_hooks(model, order, pairs, relu_stats, hidden, redundant):
        model.eval()
        with torch.no_grad(), uses:
            call_model(model, inputs)
    # a middle tensor read by anything besides the second layer (a residual, another branch) fans out
    redundant = [RedundantPair(layers=tuple(r["layers"]), why=r["why"]) for r in redundant
                 if r["_tensor"] is None or uses.count(r["_tensor"]) <= 1]
    names = {n: m for n, m in model.named_modules()}
    executed = [o for o in order]
    last = executed[-1]["name"] if executed else None
    pooler = sorted(n for n in hidden if any(p in part for part in n.split(".") for p in POOLER_NAMES))
    hidden_saturating = sorted(set(hidden) - set(pooler))
    widths = []
    for o in executed:
        m = names.get(o["name"])
        if isinstance(m, nn.Linear):
            widths.append({"name": o["name"], "type": "Linear", "in": m.in_features, "out": m.out_features})
        elif isinstance(m, CONV):
            widths.append({"name": o["name"], "type": type(m).__name__, "in": m.in_channels, "out": m.out_channels})
        elif isinstance(m, nn.Embedding) and m.embedding_dim >= EMBEDDING_WIDTH_MIN:
            widths.append({"name": o["name"], "type": "Embedding", "in": None, "out": m.embedding_dim})
        elif is_hf_conv1d(m):
            widths.append({"name": o["name"], "type": "Conv1D", "in": m.weight.shape[0], "out": m.weight.shape[1]})
    # Inner widths: everything but the raw input of the first layer and the output of the last
    # (those are fixed by the data and the number of classes).
    dims = []
    seen = set()
    for i, w in enumerate(widths):
        if w["in"] is not None and i > 0:
            dims.append((w["name"], "in", w["in"]))
        if i < len(widths) - 1:
            dims.append((w["name"], "out", w["out"]))
    off = []
    for name, side, d in dims:
        if d % 8 and (name, side) not in seen:
            seen.add((name, side))
            off.append(OffWidth(name=name, side=side, dim=d))
    units = sum(int(v.numel()) for v in relu_stats.values())
    dead = sum(int((~v).sum()) for v in relu_stats.values())
    return ForwardFacts(
        executed_leaves=len(executed),
        conv_bn_pairs=tuple(tuple(p) for p in pairs),
        hidden_saturating=tuple(hidden_saturating),
        pooler_saturating=tuple(pooler),
        redundant_layers=tuple(redundant),
        output_activation=executed[-1]["type"] if executed and isinstance(names.get(last), ACTIVATIONS) else None,
        widths=tuple(LayerWidth(name=w["name"], type=w["type"], in_=w["in"], out=w["out"]) for w in widths),
        inner_dims=len(dims),
        widths_not_multiple_of_8=tuple(off),
        relu_units=units,
        dead_relu_units=dead,
        relu_modules=sum(1 for e in executed if e["type"] in ("ReLU", "ReLU6")),
        conv_input_channels_last=None,
    )
