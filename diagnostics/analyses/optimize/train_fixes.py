"""How each training fix is applied: ``train_<fix>(model, ctx, params) -> TrainSetup``.

What the fixes are (ids, titles, parameters, when they apply) is declared in catalog.py
(``TRAIN_FIXES``). A training fix changes the whole step, not only the model, so its recipe
returns a ``TrainSetup``: the module being trained, its optimizer, and its step: the one training
step (``measure.training.Step``: zero_grad, forward, loss, backward, optimizer step) with the fix's
options (autocast and a GradScaler, micro-batches, a compiled model and optimizer step, converted
inputs). ``step(inputs=...)`` returns the loss, detached. ``params`` lists the model's parameters in
the baseline's order, the same Parameter objects the step updates, so the gradients of a fix are
read against the baseline's one by one. ``model`` is a deep copy the recipe may change.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from diagnostics.analyses.optimize.fixes import FixNotApplicable
from diagnostics.inputs import as_inputs
from diagnostics.measure.training import Step, Trainee, make_optimizer


@dataclass
class TrainContext:
    """What every recipe needs besides the model: the loss, the optimizer the user chose, the device."""

    inputs: tuple
    loss_fn: Callable[[object], torch.Tensor]
    optimizer: str
    lr: float
    device: torch.device
    #: per-module bytes saved for backward, measured on the baseline (module name -> bytes), or None
    saved_bytes: dict | None = None


@dataclass
class TrainSetup:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    step: Step  # one training step: step(inputs=batch) returns the loss, detached
    params: list  # the trained Parameters, in the baseline's order
    notes: list = field(default_factory=list)
    #: after training, the model to serve (QAT's converted int8 model); None: ``model`` itself
    finish: Callable[[], nn.Module] | None = None


def train_step(model: nn.Module, ctx: TrainContext, optimizer: torch.optim.Optimizer, *, prepare=None,
               **options) -> Step:
    """The baseline's step on ``model`` (ctx's loss and inputs) with ``optimizer``; ``prepare`` converts the
    inputs inside the forward; ``options`` are the step's own (autocast, scaler, split, update)."""
    return Step(Trainee(model, ctx.loss_fn, ctx.inputs, prepare=prepare), True, optimizer, **options)


def baseline(model: nn.Module, ctx: TrainContext) -> TrainSetup:
    params = list(model.parameters())
    opt = make_optimizer(params, ctx.optimizer, ctx.lr)
    return TrainSetup(model, opt, train_step(model, ctx, opt), params)


# ----------------------------------------------------------------------------- recipes
def train_amp(model, ctx: TrainContext, p: dict) -> TrainSetup:
    dev = ctx.device.type
    dtype = {"auto": torch.float16 if dev == "cuda" else torch.bfloat16, "bfloat16": torch.bfloat16,
             "float16": torch.float16}[p["dtype"]]
    if dev == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise FixNotApplicable("this GPU has no bfloat16 support: choose float16 (with GradScaler)")
    params = list(model.parameters())
    opt = make_optimizer(params, ctx.optimizer, ctx.lr)
    scaler = torch.amp.GradScaler(dev) if dtype == torch.float16 else None
    step = train_step(model, ctx, opt, autocast=lambda: torch.autocast(dev, dtype=dtype), scaler=scaler)
    name = str(dtype).removeprefix("torch.")
    notes = [f"autocast {name} on {dev} around forward and loss"
             + ("; GradScaler scales the loss, unscales the gradients and skips steps with inf/NaN gradients"
                if scaler else "; no GradScaler (bfloat16 has float32's exponent range)")]
    if dev == "cpu":
        notes.append("CPU autocast speeds up only on CPUs with bfloat16 / AMX units; elsewhere expect a slowdown")
    return TrainSetup(model, opt, step, params, notes)


def checkpoint_module(module: nn.Module) -> None:
    """Make ``module`` run under torch.utils.checkpoint (non-reentrant): its activations are
    recomputed during backward instead of saved. Its forward is replaced on the instance, so its
    type, attributes, parameter names and hooks stay as they were (containers that inspect their
    layers, like nn.TransformerEncoder, still see them)."""
    from torch.utils.checkpoint import checkpoint

    inner = module.forward

    def forward(*args, **kwargs):
        if not torch.is_grad_enabled():
            return inner(*args, **kwargs)
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    module.forward = forward


def choose_blocks(model: nn.Module, saved: dict | None, limit: int = 0) -> tuple[list[str], str]:
    """The blocks to checkpoint: the children of one container (ModuleList / Sequential), chosen
    from the activation bytes each module saves for backward (measured): the container whose
    children cover at least half of them with the smallest largest child; the largest blocks first
    when ``limit`` caps them. Returns the block names and how they were chosen."""
    saved = saved or {}

    def subtree_bytes(prefix: str) -> int:
        return sum(b for name, b in saved.items() if name == prefix or name.startswith(prefix + "."))

    total = sum(saved.values())
    candidates = []
    for name, mod in model.named_modules():
        if not isinstance(mod, (nn.ModuleList, nn.Sequential)) or _blocks_in(mod) < 2:
            continue  # a container of single layers: recomputing one layer saves nothing
        kids = [f"{name}.{k}" if name else k for k, _ in mod.named_children()]
        sizes = [subtree_bytes(k) for k in kids]
        candidates.append((kids, sum(sizes), max(sizes)))
    if not candidates:
        raise FixNotApplicable("no ModuleList / Sequential holding two or more blocks (modules with layers of "
                               "their own) to checkpoint: the layers sit in flat containers; group them into block "
                               "modules, or use torch.utils.checkpoint.checkpoint_sequential")
    # Backward recomputes one checkpointed block at a time, so the finest container that still
    # covers most of the saved activations saves the most: among those covering at least half,
    # the one whose largest block saves the least (a whole-model Sequential recomputes everything
    # at once and saves nothing).
    covering = [c for c in candidates if total and c[1] >= 0.5 * total] or candidates
    best = list(min(covering, key=lambda c: (c[2], -c[1]))[0])
    # Refine: a chosen block that is itself a ModuleList (never called) or the largest block and a
    # Sequential of several blocks is replaced by its children, so no one recompute brings back most of
    # the activations (a ResNet's first stage, say).
    while True:
        split = [n for n in best if isinstance(model.get_submodule(n), nn.ModuleList)]
        big = max(best, key=subtree_bytes)
        mod = model.get_submodule(big)
        if not split and isinstance(mod, nn.Sequential) and _blocks_in(mod) >= 2 and subtree_bytes(big) > 0:
            split = [big]  # a Sequential of blocks (not of single layers, whose recompute saves nothing)
        if not split:
            break
        for n in split:
            i = best.index(n)
            best[i:i + 1] = [f"{n}.{k}" for k, _ in model.get_submodule(n).named_children()]
    ranked = sorted(best, key=subtree_bytes, reverse=True)
    chosen = ranked[:limit] if limit else best
    share = sum(subtree_bytes(k) for k in chosen) / (total or 1)
    how = (f"{len(chosen)} block(s) of the container saving the most activations for backward; together they "
           f"save {sum(subtree_bytes(k) for k in chosen):,} bytes, {share:.0%} of the step's saved activations"
           if saved else f"{len(chosen)} block(s) (no activation measurement)")
    return chosen, how


def _blocks_in(container: nn.Module) -> int:
    """How many children of ``container`` are blocks: modules with submodules of their own."""
    return sum(1 for c in container.children() if next(c.children(), None) is not None)


def train_checkpointing(model, ctx: TrainContext, p: dict) -> TrainSetup:
    params = list(model.parameters())
    blocks, how = choose_blocks(model, ctx.saved_bytes, p["blocks"])
    for name in blocks:
        checkpoint_module(model.get_submodule(name))
    opt = make_optimizer(params, ctx.optimizer, ctx.lr)
    shown = ", ".join(blocks[:8]) + (f" and {len(blocks) - 8} more" if len(blocks) > 8 else "")
    notes = [f"checkpointed: {shown} ({how})", "each checkpointed block runs its forward twice: once in forward, "
             "again in backward"]
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for b in blocks for m in model.get_submodule(b).modules()):
        notes.append("BatchNorm layers inside checkpointed blocks update their running statistics twice per step "
                     "(the recompute too): eval-mode outputs drift from the baseline's; the gradients do not")
    return TrainSetup(model, opt, train_step(model, ctx, opt), params, notes)


def split_batch(inputs, k: int) -> list:
    batch = next((x.shape[0] for x in inputs if isinstance(x, torch.Tensor) and x.dim()), None)
    if batch is None:
        raise FixNotApplicable("the inputs have no batch dimension to split")
    if batch % k:
        raise FixNotApplicable(f"the batch ({batch}) does not split into {k} equal micro-batches: choose "
                               f"micro_batches dividing {batch}")
    m = batch // k

    def part(x, i):
        return x[i * m:(i + 1) * m] if isinstance(x, torch.Tensor) and x.dim() and x.shape[0] == batch else x

    return [as_inputs(inputs).map(lambda x, i=i: part(x, i)) for i in range(k)]  # keyword inputs too


def train_accumulation(model, ctx: TrainContext, p: dict) -> TrainSetup:
    k = p["micro_batches"]
    split_batch(ctx.inputs, k)  # refuses now, with why, rather than in the first step
    params = list(model.parameters())
    opt = make_optimizer(params, ctx.optimizer, ctx.lr)
    rows_loss = getattr(ctx.loss_fn, "for_rows", None)  # a loss whose targets follow the batch's rows

    def micro_batches(inputs) -> list:
        """The k micro-batches, each with its loss (the rows of the targets it holds, where the loss
        says how): the step divides each loss by k and its gradients add up over them."""
        parts = split_batch(inputs, k)
        if not rows_loss:
            return [(part, ctx.loss_fn) for part in parts]
        m = next(x.shape[0] for x in parts[0] if isinstance(x, torch.Tensor) and x.dim())
        return [(part, lambda out, i=i: rows_loss(out, i * m, (i + 1) * m, m * k)) for i, part in enumerate(parts)]

    notes = [f"{k} micro-batches of {next(x.shape[0] for x in ctx.inputs if isinstance(x, torch.Tensor)) // k}, "
             "each loss divided by k: for a mean-reduced loss the summed gradients are the full batch's"]
    if not rows_loss:
        notes.append("the loss sees each micro-batch as a batch of its own: with targets tied to the batch "
                     "shape, losses differ from the full batch's")
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        notes.append("BatchNorm normalises each micro-batch with its own statistics: gradients and losses "
                     "differ slightly from the full batch's")
    return TrainSetup(model, opt, train_step(model, ctx, opt, split=micro_batches), params, notes)


def train_fused_optimizer(model, ctx: TrainContext, p: dict) -> TrainSetup:
    params = list(model.parameters())
    impl = p["impl"]
    if impl == "auto":
        impl = "fused"
    opt = make_optimizer(params, ctx.optimizer, ctx.lr)  # the same hyper-parameters as the baseline's
    cls = type(opt)
    accepted = inspect.signature(cls.__init__).parameters
    defaults = {k: v for k, v in opt.defaults.items() if k in accepted and k not in ("fused", "foreach")}
    try:
        fast = cls(params, **defaults, **{impl: True})
    except (RuntimeError, ValueError, TypeError) as e:
        if p["impl"] != "auto":
            raise FixNotApplicable(f"{cls.__name__}({impl}=True) is not available here: {e}") from None
        impl = "foreach"
        fast = cls(params, **defaults, foreach=True)
    base_impl = "foreach" if ctx.device.type == "cuda" else "for-loop (single tensor)"
    return TrainSetup(model, fast, train_step(model, ctx, fast), params,
                      [f"{cls.__name__}({impl}=True) against the default implementation on {ctx.device.type} "
                       f"({base_impl})"])


def train_compile(model, ctx: TrainContext, p: dict) -> TrainSetup:
    params = list(model.parameters())
    opt = make_optimizer(params, ctx.optimizer, ctx.lr)
    step = train_step(torch.compile(model), ctx, opt, update=torch.compile(opt.step))
    return TrainSetup(model, opt, step, params,
                      ["torch.compile(model): TorchInductor kernels for forward and backward (AOTAutograd); "
                       "torch.compile(optimizer.step); the loss stays eager. The first step compiles (see first "
                       "call): worth it over long runs"])


def train_channels_last(model, ctx: TrainContext, p: dict) -> TrainSetup:
    params = list(model.parameters())
    model = model.to(memory_format=torch.channels_last)  # keeps the Parameter objects
    opt = make_optimizer(params, ctx.optimizer, ctx.lr)

    def to_nhwc(inputs):
        return as_inputs(inputs).map(lambda x: x.contiguous(memory_format=torch.channels_last)
                                     if isinstance(x, torch.Tensor) and x.dim() == 4 else x)

    return TrainSetup(model, opt, train_step(model, ctx, opt, prepare=to_nhwc), params,
                      ["weights and 4-D inputs in NHWC; gradients follow the weights' format"])


def train_qat(model, ctx: TrainContext, p: dict) -> TrainSetup:
    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
        from torchao.quantization.qat import IntxFakeQuantizeConfig, QATConfig
    except ImportError as e:
        raise FixNotApplicable(f"quantization-aware training needs torchao (pip install torchao): {e}") from None
    params = list(model.parameters())
    param_names = [n for n, _ in model.named_parameters()]
    names = [n for n, m in model.named_modules() if type(m) is nn.Linear]
    if not names:
        raise FixNotApplicable("no nn.Linear layers to fake-quantize")
    act = IntxFakeQuantizeConfig(torch.int8, "per_token", is_symmetric=False)
    weight = IntxFakeQuantizeConfig(torch.int8, "per_channel")
    quantize_(model, QATConfig(activation_config=act, weight_config=weight, step="prepare"))
    by_name = dict(model.named_parameters())
    # torchao swaps each Linear for a FakeQuantizedLinear that takes over its weight and bias:
    # read the gradients from the parameters the prepared model trains, matched by name.
    trained = [by_name.get(n, p_) for n, p_ in zip(param_names, params)]
    opt = make_optimizer(list(model.parameters()), ctx.optimizer, ctx.lr)

    def finish():  # on a copy: the QAT model keeps training (the timed steps)
        served = copy.deepcopy(model)
        quantize_(served, QATConfig(step="convert"))
        quantize_(served, Int8DynamicActivationInt8WeightConfig())
        return served

    return TrainSetup(model, opt, train_step(model, ctx, opt), trained,
                      [f"{len(names)} Linear layer(s) train with fake int8 (activations per token, asymmetric; "
                       "weights per channel, symmetric), then convert to int8 weights with dynamic int8 "
                       "activations (torchao)", "fake quantization costs time in training; the gain is the "
                       "int8 model it yields"], finish=finish)

