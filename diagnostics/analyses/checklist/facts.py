"""Collect the plain ``facts`` dict that the checklist rules read, in one job.

Three kinds of facts, each a section of the dict:

* ``static``: read from the module tree and one traced forward (module types, Conv -> BN pairs
  found by tensor identity, activations and where they sit, layer widths, modes, dtypes, memory
  format, compile / DataParallel wrappers, weight-init scale).
* ``env``: the device and the backend flags (CUDA, compute capability, cudnn.benchmark, TF32).
* ``measured``: a short training-step profile (ops per step, sync points, kernels, Tensor Core
  kernels), step time, peak memory, saved-activation bytes, gradient health, inference-mode
  speed, a two-point batch-size probe, and the DataLoader when one is described.

Measurements run on the model itself inside ``_state_restored``, which puts back its weights,
buffers, gradients and each module's mode afterwards (a deep copy on the same GPU would double the
weights in the peak-memory figure). Every collector that fails records why under
``facts["errors"]`` instead of failing the job. Facts are plain data (no tensors, no modules).
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import weakref
from contextlib import contextmanager
from typing import Callable

import torch
from torch import nn

from diagnostics.analyses.gradients.job import relu_units_alive
from diagnostics.trace.classify import uses_tensor_cores
from diagnostics.measure.probes import absolute_peak_bytes, time_calls

CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
BATCHNORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
ACTIVATIONS = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.GELU, nn.SiLU, nn.Mish, nn.ELU, nn.SELU, nn.CELU,
               nn.Hardswish, nn.Hardsigmoid, nn.Softplus, nn.Sigmoid, nn.Tanh, nn.Hardtanh)
SATURATING = (nn.Sigmoid, nn.Tanh)
INPLACE_CAPABLE = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.SiLU, nn.Hardswish, nn.Hardtanh)
WEIGHTED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
#: layers that take a hidden activation as their input (a Sigmoid/Tanh feeding one is a hidden activation)
CONSUMERS = WEIGHTED + (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d, nn.Bilinear, nn.LSTM, nn.GRU,
                        nn.RNN, nn.MultiheadAttention)
#: layers between an activation and the next weighted layer that keep it that layer's nonlinearity
PASS_THROUGH = DROPOUT + BATCHNORM + (
    nn.Identity, nn.Flatten, nn.Unflatten, nn.LayerNorm, nn.GroupNorm, nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d,
    nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d)

#: ops that can run on Tensor Cores (matmuls, convolutions, attention), as named in the profiler.
ELIGIBLE_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                "aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::conv1d",
                "aten::conv2d", "aten::conv3d", "aten::_scaled_dot_product_flash_attention",
                "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention")
#: CPU-GPU synchronisation points, counted per step.
SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize",
            "cudaEventSynchronize")
#: ops that copy a tensor into a new layout when a view would often do (clone is what contiguous
#: and reshape-of-a-non-viewable-tensor call).
LAYOUT_COPY_OPS = ("aten::contiguous", "aten::clone")
#: per-element indexing and scalar reads: hundreds of them per step mean a Python loop over a tensor.
ELEMENT_OPS = ("aten::select", "aten::slice", "aten::narrow", "aten::index", "aten::index_put_", "aten::item")
#: Warm-up calls before the inference and batch-size probes time anything: the first calls at a new
#: shape or mode pay one-off costs (oneDNN primitive creation, allocator growth).
WARMUP = 3


# ----------------------------------------------------------------------------- static facts
def static_facts(model: nn.Module) -> dict:
    """Facts from the module tree alone."""
    types: dict[str, int] = {}
    for _, m in model.named_modules():
        types[type(m).__name__] = types.get(type(m).__name__, 0) + 1
    inner = model
    if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        inner = model.module
    elif isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch.compile's OptimizedModule
        inner = model._orig_mod
    mods = list(inner.named_modules())
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
    channels_last = bool(conv2d) and all(
        m.weight.is_contiguous(memory_format=torch.channels_last) and not m.weight.is_contiguous()
        for m in conv2d if m.weight.dim() == 4 and m.weight.shape[2:] != (1, 1))
    dp = isinstance(model, nn.DataParallel)
    ddp = isinstance(model, nn.parallel.DistributedDataParallel)
    dist_backend = None
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        dist_backend = str(torch.distributed.get_backend())
    init = []
    for n, m in mods:
        if isinstance(m, WEIGHTED) and m.weight is not None and m.weight.numel() > 1:
            fan_in = m.weight[0].numel()
            std = float(m.weight.detach().float().std())
            init.append({"name": n, "type": type(m).__name__, "fan_in": fan_in, "std": std,
                         "gain": std * math.sqrt(fan_in)})
    return {
        "model_type": type(model).__name__,
        "module_types": types,
        "n_modules": len(mods),
        "n_conv": len(convs), "n_conv2d": len(conv2d), "n_batchnorm": len(bns), "n_dropout": len(drops),
        "n_linear": sum(1 for _, m in mods if isinstance(m, nn.Linear)),
        "n_rnn": sum(1 for _, m in mods if isinstance(m, (nn.LSTM, nn.GRU, nn.RNN))),
        "n_attention": sum(1 for _, m in mods if isinstance(m, nn.MultiheadAttention)),
        "activations": act_counts,
        "inplace_activations": len(inplace), "not_inplace_activations": not_inplace,
        "training": bool(model.training),
        "dropout_p0": [n for n, m in drops if getattr(m, "p", None) == 0],
        "dropout_bn_train": [n for n, m in drops + bns if m.training],
        "dropout_bn_eval": [n for n, m in drops + bns if not m.training],
        "param_dtypes": dtypes,
        "params_total": sum(p.numel() for p in params),
        "param_bytes": sum(p.numel() * p.element_size() for p in params),
        "params_trainable": sum(p.numel() for p in params if p.requires_grad),
        "channels_last": channels_last,
        "compiled": hasattr(model, "_orig_mod") or type(model).__name__ == "OptimizedModule",
        "torchscript": isinstance(model, torch.jit.ScriptModule),
        "data_parallel": dp,
        "data_parallel_devices": len(model.device_ids or []) if dp else 0,
        "ddp": ddp,
        "dist_backend": dist_backend,
        "init": init,
        "quantized": any("quantized" in type(m).__module__ for _, m in mods),
    }


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
        a, mid, b = first.in_features, first.out_features, second.out_features
        if a * b <= mid * (a + b):
            return f"Linear {a}->{mid} then Linear {mid}->{b} with no nonlinearity between: one Linear {a}->{b}"
        return None
    if isinstance(second, ACTIVATIONS) and type(first) is type(second):
        return f"{type(first).__name__} applied twice in a row"
    if isinstance(second, BATCHNORM) and type(first) is type(second):
        return f"{type(first).__name__} straight after {type(first).__name__}"
    return None


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
                    redundant.append({"layers": [src[0], name], "why": why})
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


def forward_facts(model: nn.Module, inputs: tuple) -> dict:
    """Facts from one forward in eval mode without grad: execution order, Conv->BN pairs,
    hidden saturating activations (Sigmoid/Tanh feeding a weighted layer), layer widths in
    execution order, dead ReLU units. Each module's train/eval mode is restored."""
    order, pairs, relu_stats, hidden, redundant = [], [], {}, set(), []
    with _trace_hooks(model, order, pairs, relu_stats, hidden, redundant):
        model.eval()
        with torch.no_grad():
            model(*inputs)
    names = {n: m for n, m in model.named_modules()}
    executed = [o for o in order]
    last = executed[-1]["name"] if executed else None
    hidden_saturating = sorted(hidden)
    widths = []
    for o in executed:
        m = names.get(o["name"])
        if isinstance(m, nn.Linear):
            widths.append({"name": o["name"], "type": "Linear", "in": m.in_features, "out": m.out_features})
        elif isinstance(m, CONV):
            widths.append({"name": o["name"], "type": type(m).__name__, "in": m.in_channels, "out": m.out_channels})
        elif isinstance(m, nn.Embedding):
            widths.append({"name": o["name"], "type": "Embedding", "in": None, "out": m.embedding_dim})
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
            off.append({"name": name, "side": side, "dim": d})
    units = sum(int(v.numel()) for v in relu_stats.values())
    dead = sum(int((~v).sum()) for v in relu_stats.values())
    return {
        "executed_leaves": len(executed),
        "conv_bn_pairs": pairs,
        "hidden_saturating": hidden_saturating,
        "redundant_layers": redundant,
        "output_activation": executed[-1]["type"] if executed and isinstance(names.get(last), ACTIVATIONS) else None,
        "widths": widths,
        "inner_dims": len(dims),
        "widths_not_multiple_of_8": off,
        "relu_units": units,
        "dead_relu_units": dead,
        "relu_modules": sum(1 for e in executed if e["type"] in ("ReLU", "ReLU6")),
        "conv_input_channels_last": None,
    }


# ----------------------------------------------------------------------------- environment
def environment_facts(device: torch.device | str) -> dict:
    device = torch.device(device)
    cuda = torch.cuda.is_available()
    env = {
        "device": str(device), "device_type": device.type, "cuda_available": cuda,
        "cudnn_available": torch.backends.cudnn.is_available(),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "torch_version": torch.__version__, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "cxx_compiler": bool(shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")),
        "nccl_available": bool(torch.distributed.is_available() and torch.distributed.is_nccl_available()),
        "world_size": (torch.distributed.get_world_size() if torch.distributed.is_available()
                       and torch.distributed.is_initialized() else 1),
        "compute_capability": None, "device_name": None, "device_memory_bytes": None,
        "cuda_device_count": torch.cuda.device_count() if cuda else 0,
    }
    if device.type == "cuda" and cuda:
        props = torch.cuda.get_device_properties(device)
        env.update(compute_capability=float(f"{props.major}.{props.minor}"), device_name=props.name,
                   device_memory_bytes=int(props.total_memory),
                   bf16_supported=bool(torch.cuda.is_bf16_supported()))
    else:
        try:
            import psutil

            env["device_memory_bytes"] = int(psutil.virtual_memory().total)
        except Exception:
            pass
        env["device_name"] = "CPU"
    return env


# ----------------------------------------------------------------------------- measured facts
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _train_step_fn(model: nn.Module, inputs: tuple, loss_fn: Callable) -> Callable[[], None]:
    def step():
        model.zero_grad(set_to_none=True)
        out = model(*inputs)
        loss_fn(out).backward()
    return step


def profile_facts(step: Callable[[], None], device: torch.device, steps: int = 2) -> dict:
    """Profile ``steps`` training steps (``measure.profiling.profile_steps``) and read, per step,
    ops, kernels, sync points and Tensor Cores from the trace (``step_profile_facts``)."""
    from diagnostics.measure.profiling import profile_steps

    # _sync between the steps, outside them: the harness's wait, not the model's.
    return step_profile_facts(profile_steps(step, steps, device, between=lambda: _sync(device)), device)


def step_profile_facts(trace, device: torch.device) -> dict:
    """The profile facts of a Trace whose steps are marked (classify.STEP_RE).

    Events are counted as torch's EventList counts calls (a call recorded twice, an only child
    named like its parent, once: views.repeated_calls) and, except kernels, only when they start
    inside a step. Top-level operators are the aten ops the step calls directly.
    """
    import numpy as np

    from diagnostics.trace import intervals as iv
    from diagnostics.trace.classify import comm_mask, host_mask, kernel_mask
    from diagnostics.trace.views import repeated_calls, step_spans

    st = step_spans(trace)
    steps = len(st)
    if not steps:
        raise ValueError("the profile holds no marked step")
    ev = trace.events
    ts, dur = ev["ts"].to_numpy(), ev["dur"].to_numpy()
    names = trace.strings("name")
    parent = trace.nesting()["parent"]
    is_step = np.zeros(len(ev), dtype=bool)
    is_step[st["row"].to_numpy()] = True
    lo = st["start_us"].to_numpy()
    i = np.clip(np.searchsorted(lo, ts, side="right") - 1, 0, None)
    within = (ts >= lo[i]) & (ts <= lo[i] + st["dur_us"].to_numpy()[i])
    in_step = host_mask(trace) & within & ~is_step
    calls = in_step & ~repeated_calls(trace)
    counts: dict[str, int] = {}
    for name in names[calls].tolist():
        counts[name] = counts.get(name, 0) + 1
    # Called by the step itself (or by nothing): what the user's code asked for, not what ops call.
    direct = calls & ((parent < 0) | is_step[np.maximum(parent, 0)])
    top = direct & np.array([n.startswith("aten::") for n in trace.labels("name")])[trace.codes("name")]
    wall_us = statistics.median(st["dur_us"].tolist())
    kernels = kernel_mask(trace)
    kernel_names = sorted(set(names[kernels].tolist()))
    tc = [n for n in kernel_names if uses_tensor_cores(n)]
    busy_us = iv.length(iv.union(ts[kernels], ts[kernels] + dur[kernels]))
    comm_us = float(dur[kernels & comm_mask(trace)].sum())
    kernel_us = float(dur[kernels].sum())
    sync = {name: counts.get(name, 0) / steps for name in SYNC_OPS}
    copies = layout_copy_facts(trace, in_step, calls, device, kernel_us, steps)
    # Indexing and scalar reads called straight from Python (not inside another op: LSTM, attention
    # and backward kernels index internally); ``for row in x`` is one unbind with a select per row.
    element: dict[str, float] = {}
    for r in np.flatnonzero(direct).tolist():
        if names[r] in ELEMENT_OPS:
            element[names[r]] = element.get(names[r], 0) + 1 / steps
        elif names[r] == "aten::unbind":
            rows = int((calls & (parent == r) & (names == "aten::select")).sum())
            element["aten::select (unbind)"] = element.get("aten::select (unbind)", 0) + rows / steps
    return {
        **copies,
        "element_ops_per_step": element,
        "element_ops_total_per_step": sum(element.values()),
        "steps": steps,
        "step_wall_us": wall_us,
        "ops_per_step": int(top.sum()) / steps,
        "median_op_us": statistics.median(dur[top].tolist()) if top.any() else None,
        "kernels_per_step": int(kernels.sum()) / steps,
        "median_kernel_us": statistics.median(dur[kernels].tolist()) if kernels.any() else None,
        "sync_per_step": sync,
        "sync_points_per_step": sum(v for k, v in sync.items() if k != "aten::_local_scalar_dense"),
        "eligible_ops": sorted({n for n in counts if n in ELIGIBLE_OPS}),
        "tensor_core_kernels": tc[:20],
        "kernel_names_sample": kernel_names[:20],
        "gpu_busy_fraction": (busy_us / steps / wall_us) if (kernels.any() and wall_us) else None,
        "communication_fraction": (comm_us / kernel_us) if kernel_us else None,
        "top_ops": sorted(({"name": k, "count_per_step": v / steps} for k, v in counts.items()
                           if k.startswith("aten::")), key=lambda r: -r["count_per_step"])[:15],
    }


def layout_copy_facts(trace, in_step, calls, device: torch.device, kernel_us: float, steps: int) -> dict:
    """Layout copies the forward asks for (``.contiguous()``, ``.clone()``, a ``reshape`` of a view
    that cannot be viewed) against the step's operator time: on CPU the ops' CPU time, on CUDA their
    kernels' time (the GPU work launched inside the copy). A copy inside another copy counts once;
    copies inside backward kernels (made by PyTorch for its own kernels) are left out. ``in_step``:
    the host events that start in a step; ``calls``: those of them torch counts as calls."""
    import numpy as np

    from diagnostics.trace.classify import BACKWARD_NODE_PREFIX, RUNTIME_CATS, gpu_work_mask

    names = trace.strings("name")
    parent = trace.nesting()["parent"]

    def ancestors(r: int):
        p = parent[r]
        while p >= 0:
            yield p
            p = parent[p]

    def forward_copy(r: int) -> bool:
        return not any(names[p] in LAYOUT_COPY_OPS or names[p].startswith(BACKWARD_NODE_PREFIX)
                       for p in ancestors(r))

    copies = [r for r in np.flatnonzero(calls & np.isin(names, LAYOUT_COPY_OPS)).tolist() if forward_copy(r)]
    dur = trace.events["dur"].to_numpy()
    if device.type == "cuda":
        # GPU work whose launch call (same correlation id) runs inside one of the copies.
        ev = trace.events
        launch = trace.complete_mask() & trace.cat_mask(RUNTIME_CATS) & (ev["corr"].to_numpy() >= 0)
        by_corr = dict(zip(ev["corr"].to_numpy()[launch].tolist(), np.flatnonzero(launch).tolist()))
        work = np.flatnonzero(gpu_work_mask(trace))
        mine = set(copies)
        copy_us = sum(float(dur[w]) for w, c in zip(work.tolist(), ev["corr"].to_numpy()[work].tolist())
                      if c in by_corr and any(a in mine for a in ancestors(by_corr[c])))
        total_us = kernel_us
    else:
        copy_us = float(dur[copies].sum())
        total_us = float(np.nansum(trace.nesting()["self_us"][in_step]))
    return {"layout_copies_per_step": len(copies) / steps, "layout_copy_us_per_step": copy_us / steps,
            "op_time_us_per_step": total_us / steps,
            "layout_copy_fraction": (copy_us / total_us) if total_us else None,
            "layout_copy_time_kind": "GPU kernel" if device.type == "cuda" else "CPU operator"}


class _Ctx:
    """The least an analysis needs: ``loaded`` and ``progress`` (to reuse analyses in-process)."""

    def __init__(self, loaded):
        self.loaded = loaded

    def progress(self, fraction: float, message: str = "") -> None:
        pass


def gradient_facts(loaded, steps: int = 1) -> dict:
    """Gradient health from the Gradient-flow analysis (run in-process; it restores the weights)."""
    from diagnostics.analyses.gradients import job as gradients
    r = gradients.analyze(_Ctx(loaded), {"steps": steps, "optimizer": "sgd", "lr": 0.01})
    m = r["metrics"]
    return {"verdict": r["verdict"], "layers": m["layers"], "vanishing": m["layers_vanishing"],
            "exploding": m["layers_exploding"], "dead": m["layers_dead"], "nonfinite": m["layers_nonfinite"],
            "global_norm_first": m["global_norm_first"], "global_norm_max": m["global_norm_max"],
            "min_ratio": m["grad_norm_min_ratio"],
            "flagged": [{"layer": l["layer"], "status": l["status"], "reason": l["reason"]}
                        for l in r["layers"] if l["status"] != "healthy"]}


def measured_facts(loaded, model: nn.Module, *,
                   iters: int = 5, profile_steps: int = 2, make_inputs: Callable[[int], tuple] | None = None,
                   batch_size: int | None = None, progress: Callable[[float, str], None] | None = None,
                   errors: dict | None = None) -> dict:
    """Everything timed or traced. ``model`` is ``loaded.model``: this function trains it, switches
    its mode and zeroes its gradients, so the caller restores it (``collect_facts`` does)."""
    from dataclasses import replace

    inputs, loss_fn, device = loaded.inputs, loaded.loss_fn, loaded.device
    progress = progress or (lambda f, m: None)
    errors = errors if errors is not None else {}
    out: dict = {}
    device = torch.device(device)
    trainable = any(p.requires_grad for p in model.parameters())

    def guarded(key: str, fn):
        try:
            return fn()
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # one failing probe must not sink the checklist
            errors[key] = f"{type(e).__name__}: {str(e)[:300]}"
            return None

    model.train()
    step = _train_step_fn(model, inputs, loss_fn)
    if trainable:
        progress(0.2, "timing the training step")
        out["train_step"] = guarded("train_step", lambda: time_calls(step, device, iters=iters, warmup=2))
        progress(0.35, "profiling the training step")
        out["profile"] = guarded("profile", lambda: profile_facts(step, device, profile_steps))
        progress(0.5, "peak memory and saved activations")
        out["peak_bytes"] = guarded("peak_bytes", lambda: absolute_peak_bytes(step, device))
        def saved():
            from dataclasses import replace

            from diagnostics.measure.memory import measure_saved

            model.zero_grad(set_to_none=True)
            return measure_saved(replace(loaded, model=model), inputs).saved_total

        out["saved_activation_bytes"] = guarded("saved_activations", saved)
        progress(0.6, "gradients")
        out["gradients"] = guarded("gradients", lambda: gradient_facts(replace(loaded, model=model)))
        if device.type == "cuda":
            def growth():
                allocs = []
                for _ in range(4):
                    step()
                    _sync(device)
                    allocs.append(torch.cuda.memory_allocated(device))
                return (allocs[-1] - allocs[1]) / 2
            out["memory_growth_bytes_per_step"] = guarded("memory_growth", growth)
        model.zero_grad(set_to_none=True)
    else:
        errors["train_step"] = "the model has no trainable parameters: training-step facts were skipped"
    progress(0.7, "inference mode vs training mode forward")

    def infer_check():
        model.train()
        with torch.enable_grad():
            grad_t = time_calls(lambda: model(*inputs), device, iters=iters, warmup=WARMUP)
        model.eval()
        with torch.inference_mode():
            inf_t = time_calls(lambda: model(*inputs), device, iters=iters, warmup=WARMUP)
        return {"train_grad_forward_s": grad_t["median_s"], "eval_inference_forward_s": inf_t["median_s"],
                "speedup": grad_t["median_s"] / inf_t["median_s"] if inf_t["median_s"] else None}

    out["inference"] = guarded("inference", infer_check)
    if make_inputs is not None and batch_size:
        progress(0.8, "batch-size probe")

        def batch_probe():
            model.eval()
            res = []
            for b in (batch_size, batch_size * 2):
                x = make_inputs(b)
                with torch.inference_mode():
                    t = time_calls(lambda: model(*x), device, iters=iters, warmup=WARMUP)
                res.append({"batch_size": b, "median_s": t["median_s"], "samples_per_s": b / t["median_s"]})
            return {"points": res, "throughput_gain_2x": res[1]["samples_per_s"] / res[0]["samples_per_s"]}

        out["batch_probe"] = guarded("batch_probe", batch_probe)
    return out


# ----------------------------------------------------------------------------- data loader
from diagnostics.analyses.checklist import LOADER_KEYS  # noqa: E402


def dataloader_facts(desc: dict | None, dataset_path: str | None = None, step_time_s: float | None = None,
                     batches: int = 5) -> dict | None:
    """The DataLoader as described, and (with a dataset module) the measured time per batch."""
    if not desc and not dataset_path:
        return None
    desc = {k: (desc or {}).get(k) for k in LOADER_KEYS}
    facts = {"described": desc, "loader_s_per_batch": None, "step_time_s": step_time_s, "loader_fraction": None,
             "note": None}
    if dataset_path:
        from diagnostics.analyses.checklist.dataset import load_dataset, time_loader

        dataset = load_dataset(dataset_path)
        per_batch, note = time_loader(dataset, desc, batches)
        facts["loader_s_per_batch"] = per_batch
        facts["note"] = note
        if step_time_s and per_batch is not None:
            facts["loader_fraction"] = per_batch / (per_batch + step_time_s)
    return facts


# ----------------------------------------------------------------------------- all together
@contextmanager
def _state_restored(model: nn.Module):
    """Let the probes train and switch modes on ``model`` itself, then put back what they change:
    every parameter's and buffer's values (from one copy in host memory), the tensor objects each
    module holds under those names (so optimizers and tied weights still point at them), the
    gradients (the original tensors) and each module's own train/eval mode (a frozen BatchNorm in a
    training model stays frozen). Python attributes a model changes in its own forward are not
    tracked."""
    host: dict[int, torch.Tensor] = {}
    slots = []  # (the dict that holds the tensor, its key, the tensor)
    for m in model.modules():
        for held in (m._parameters, m._buffers):
            for k, t in list(held.items()):
                if isinstance(t, torch.Tensor):
                    slots.append((held, k, t))
                    if id(t) not in host:
                        host[id(t)] = t.detach().to("cpu", copy=True)
    grads = [(p, p.grad) for p in model.parameters()]
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        with torch.no_grad():
            for held, k, t in slots:
                if k not in held or held[k] is not t:  # a probe replaced (or dropped) it
                    held[k] = t
                saved = host[id(t)]
                if t.shape == saved.shape:
                    t.copy_(saved)
        for p, g in grads:
            p.grad = g
        for m, training in modes:
            m.training = training


def collect_facts(loaded, options: dict | None = None, progress: Callable[[float, str], None] | None = None) -> dict:
    """All facts for ``loaded`` (a LoadedModel). Options: purpose ("training" | "inference"),
    iters, profile_steps, dataloader (dict of LOADER_KEYS), dataset_path, skip_measured."""
    from diagnostics.analyses.checklist import ANALYSIS

    options = ANALYSIS.validate(options)
    progress = progress or (lambda f, m: None)
    errors: dict[str, str] = {}
    model = loaded.model
    progress(0.05, "reading the module tree")
    facts = {"purpose": options["purpose"], "errors": errors,
             "static": static_facts(model), "env": environment_facts(loaded.device),
             "batch_size": loaded.batch_size, "task": getattr(loaded, "task", "unknown")}
    # The probes run on the model itself, not on a deep copy: on a GPU a copy sat next to the
    # original on the same device, so the peak memory measured on it counted the weights twice (a
    # model at 50% of the GPU read as 100%, or ran out of memory), and a model holding something
    # copy.deepcopy cannot copy (a lock, a file) failed the whole checklist. _state_restored puts
    # back what the probes change, from a copy in host memory that no device measurement sees.
    with _state_restored(model):
        try:
            facts["forward"] = forward_facts(model, loaded.inputs)
        except Exception as e:
            errors["forward"] = f"{type(e).__name__}: {str(e)[:300]}"
            facts["forward"] = None
        if facts["forward"] is not None and facts["static"]["n_conv2d"]:
            x = next((t for t in loaded.inputs if t.dim() == 4), None)
            facts["forward"]["conv_input_channels_last"] = (
                None if x is None else bool(x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()))
        if options["skip_measured"]:
            facts["measured"] = None
        else:
            facts["measured"] = measured_facts(
                loaded, model, iters=options["iters"],
                profile_steps=options["profile_steps"], make_inputs=loaded.make_inputs,
                batch_size=loaded.batch_size, progress=progress, errors=errors)
    step_s = ((facts["measured"] or {}).get("train_step") or {}).get("median_s")
    progress(0.9, "data loader")
    try:
        facts["dataloader"] = dataloader_facts(options["dataloader"], options["dataset_path"], step_s)
    except Exception as e:
        from diagnostics.errors import TorchScopeError

        if isinstance(e, TorchScopeError):
            raise
        errors["dataloader"] = f"{type(e).__name__}: {str(e)[:300]}"
        facts["dataloader"] = None
    return facts
