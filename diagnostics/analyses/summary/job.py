"""Model summary: parameter counts, bytes, output shapes and FLOPs, in total and per layer.

FLOPs come from ``diagnostics.measure.flops.FlopCounter`` (torch's FlopCounterMode, plus grouped
matmuls and fused attention): matmuls, convolutions and attention count; an op it cannot count is
named in the notes and in the layer's ``flops_not_counted``, and a layer whose only arithmetic went
uncounted shows None, not 0. Backward FLOPs are those of forward+backward minus forward; the training step
is counted in training mode (``model.train()``), as ``profile --mode train`` counts it: a model may compute
more for training (SpeechT5's feature encoder asks for its first convolution's input gradient only then),
with the random state forked and seeded so the count is the same on every run. Parameters shared
between modules (tied weights) are counted once, for the first module that holds them.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from diagnostics.analyses.summary import ANALYSIS, SummaryLayer, SummaryMetrics, SummaryResult
from diagnostics.errors import ModelRunError
from diagnostics.measure.flops import FlopCount, FlopCounter
from diagnostics.measure.training import Step
from diagnostics.tensors import shape_of, tensor_key, unique_params
from diagnostics.results import UNSET, ModelInput

ROOT = "(model)"


@contextmanager
def output_shape_hooks(model: nn.Module, shapes: dict[str, object]):
    """Record each module's first output shape; hooks are removed and the mode restored after."""
    handles = []
    was_training = model.training
    try:
        for name, mod in model.named_modules():
            if isinstance(mod, torch.jit.ScriptModule):
                continue  # TorchScript modules take no Python hooks

            def hook(_m, _inp, out, name=name):
                shapes.setdefault(name or ROOT, shape_of(out))

            handles.append(mod.register_forward_hook(hook))
        yield
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)


def _flops_by_module(model: nn.Module, run) -> FlopCount:
    counter = FlopCounter()
    # The fused MultiheadAttention fast path (eval, no grad) runs one fused op; the regular path runs
    # the matmuls the per-layer table attributes to the projections, so count that one.
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with counter:
            run()
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    return counter.result(type(model).__name__)


def script_subtrees(model: nn.Module) -> list[str]:
    """Names of the outermost TorchScript modules in ``model`` (ROOT for a TorchScript model)."""
    tops: list[str] = []
    for mname, mod in model.named_modules():
        name = mname or ROOT
        if isinstance(mod, torch.jit.ScriptModule) and not any(
                t == ROOT or name.startswith(t + ".") for t in tops):
            tops.append(name)
    return tops


def _in_script(name: str, tops: list[str]) -> bool:
    return any(t == ROOT or name == t or name.startswith(t + ".") for t in tops)


def script_note(tops: list[str]) -> str | None:
    """Why a TorchScript model's (or submodule's) layers have no shapes and no FLOPs of their own."""
    if not tops:
        return None
    why = ("TorchScript modules take no Python forward hooks, so nothing sees where one submodule's work ends and "
           "the next begins: ")
    if tops == [ROOT]:
        return ("per-layer shapes and FLOPs not counted: this is a TorchScript model. " + why +
                "the output shape is the model's own and its FLOPs are counted for the whole graph, on the model's "
                "row (its layers' FLOPs show as not counted); parameters per layer are exact. For a per-layer "
                "breakdown, load the Python model (a .py file with build_model() and example_inputs()).")
    shown = ", ".join(tops[:3]) + (f" and {len(tops) - 3} more" if len(tops) > 3 else "")
    return (f"per-layer shapes and FLOPs not counted inside the TorchScript submodule{'s' if len(tops) > 1 else ''} "
            f"{shown}. " + why + "their FLOPs are counted on the nearest Python module above them.")


def _per_layer(count: FlopCount) -> dict[str, int]:
    return {(k or ROOT): v for k, v in count.by_module.items()}


#: Modules with a fused inference fast path (eval, no grad), whose outputs may differ in shape from the
#: regular path (nested tensors for padded batches): their shapes come from a forward without grad.
FAST_PATH_MODULES = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder)


def _forward_counts(ctx, loaded, options, trainable, shapes):
    """Output shapes (into ``shapes``) and FLOPs: (forward count, forward+backward count, FLOPs
    note, backward note); a count is None where it failed (its note says why).

    One pass does it all when it can: the training step (or, without backward, the forward pass) under
    the shape hooks and the counter, whose counts are read after the model's forward pass, before the
    loss, and again at the end. Anything failing there (or a model with a fused fast path) goes the
    separate way, pass by pass, which names whose failure it was: the same figures, from fewer passes
    (a GPT-2 config spent 5 forward passes' worth of arithmetic on them: forward, forward again,
    forward + backward; now 3)."""
    model = loaded.model
    was_training = model.training
    model.eval()
    try:
        if not any(isinstance(m, FAST_PATH_MODULES) for m in model.modules()):
            train = bool(trainable) and not options["skip_backward"]
            if train:
                ctx.progress(0.6, "forward + backward FLOPs")
            counted = _one_pass_counts(loaded, model, train)
            if counted is not None:
                fwd, both, found = counted
                shapes.update(found)
                return fwd, both, None, None
        return _counts_pass_by_pass(ctx, loaded, options, trainable, shapes)
    finally:
        model.train(was_training)


#: The seed of a counted training step's random state (layer drop and the like decide which layers run).
TRAIN_COUNT_SEED = 0


@contextmanager
def training_rng(train: bool):
    """A training step's random draws (HF's layer drop skips whole layers in training mode) from a forked,
    seeded random state: the same count on every run, and the caller's random state untouched."""
    if not train:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TRAIN_COUNT_SEED)
        yield


def _one_pass_counts(loaded, model, train: bool):
    """(forward count, forward+backward count or None, shapes) from one counted pass (``train``: the one
    training step, measure.training.Step, without an optimizer; else a forward pass without grad), or None
    if any of it failed."""
    shapes: dict[str, object] = {}
    counter = FlopCounter()
    hooks = ExitStack()   # the shape hooks, on the model's forward only
    forward: dict = {}

    def read_forward(out) -> None:
        """After the model's forward, before its loss: the shape hooks off, the forward's counts read."""
        hooks.close()
        shapes.setdefault(ROOT, shape_of(out))  # a TorchScript root takes no hook: its output still has a shape
        forward["count"] = counter.result(type(model).__name__)

    def loss_after_forward(out):
        read_forward(out)
        return loaded.loss_fn(out)

    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # as _flops_by_module
    try:
        model.zero_grad(set_to_none=True)
        model.train(train)  # a training step in training mode (the caller restores the mode)
        with counter, torch.set_grad_enabled(train), training_rng(train):
            hooks.enter_context(output_shape_hooks(model, shapes))
            if not train:
                read_forward(loaded.forward())
                return forward["count"], None, shapes
            Step(replace(loaded, loss_fn=loss_after_forward), True, optimizer=None, zero_grad=False)()
        return forward["count"], counter.result(type(model).__name__), shapes
    except Exception:
        return None
    finally:
        hooks.close()
        torch.backends.mha.set_fastpath_enabled(fastpath)
        model.zero_grad(set_to_none=True)


def _counts_pass_by_pass(ctx, loaded, options, trainable, shapes):
    """The shapes, the forward count and the training step's count, each in its own pass."""
    model = loaded.model
    flops_note = None
    fwd = both = None
    backward_note = None
    # The model itself first, with shape hooks: a failure here is the model's (or its inputs').
    try:
        with output_shape_hooks(model, shapes), torch.no_grad():
            out = loaded.forward()
        shapes.setdefault(ROOT, shape_of(out))  # a TorchScript root takes no hook: its output still has a shape
        del out
    except Exception as e:
        if not loaded.meta:
            raise
        # On fake tensors some ops' meta kernels are stricter than the CPU's (the grouped matmul of
        # mixture-of-experts layers asks for bf16): the parameters are still counted exactly.
        cause = e.__cause__ or e
        first = next((l.strip() for l in str(cause).splitlines() if l.strip()), "")
        return None, None, (f"FLOPs not counted: the model could not run on fake tensors (meta device): "
                            f"{type(cause).__name__}: {first[:300]}"), None
    try:
        with torch.no_grad():
            fwd = _flops_by_module(model, lambda: loaded.forward())
    except torch.OutOfMemoryError:
        raise
    except Exception as e:  # the counter failed where the model runs: the summary still comes
        cause = e.__cause__ or e
        first = next((l.strip() for l in str(cause).splitlines() if l.strip()), "")
        try:  # with gradients recorded the counter's module tracking takes another path: count there
            fwd = _flops_by_module(model, lambda: loaded.forward())
            flops_note = (f"forward FLOPs counted with gradients enabled: under no_grad torch's FlopCounterMode "
                          f"failed on this model ({type(cause).__name__}: {first[:300]})")
        except torch.OutOfMemoryError:
            raise
        except Exception:
            flops_note = (f"FLOPs not counted: torch's FlopCounterMode failed on this model "
                          f"({type(cause).__name__}: {first[:300]}) though the model itself runs")
    if fwd is not None and trainable and not options["skip_backward"]:
        ctx.progress(0.6, "forward + backward FLOPs")

        step = Step(loaded, True, optimizer=None)   # the one training step: zero_grad, forward, loss, backward

        def train_step():
            with training_rng(True):
                step()

        try:
            model.train()  # counted as profile --mode train counts it (the caller restores the mode)
            both = _flops_by_module(model, train_step)
        except Exception as e:  # a model that cannot train (e.g. integer outputs) still gets a summary
            # the user's error, not Step's wrapping of it (ModelRunError: "backward failed: ...")
            cause = e.__cause__ if isinstance(e, ModelRunError) and e.__cause__ is not None else e
            backward_note = f"backward not counted: {type(cause).__name__}: {cause}"
        finally:
            model.eval()
            model.zero_grad(set_to_none=True)
    return fwd, both, flops_note, backward_note


def _owned_params(model: nn.Module) -> tuple[dict[str, int], dict[str, int]]:
    """Parameters (all, trainable) per module: each unique parameter belongs to the first module that
    holds it (tied weights counted once)."""
    owner: dict[int, str] = {}
    own_params: dict[str, int] = {}
    own_trainable: dict[str, int] = {}
    for mname, mod in model.named_modules():
        for p in mod.parameters(recurse=False):
            if tensor_key(p) in owner:
                continue
            owner[tensor_key(p)] = mname or ROOT
            own_params[mname or ROOT] = own_params.get(mname or ROOT, 0) + p.numel()
            if p.requires_grad:
                own_trainable[mname or ROOT] = own_trainable.get(mname or ROOT, 0) + p.numel()
    return own_params, own_trainable


@dataclass
class _Flops:
    """Forward and backward FLOPs, in total and per layer, and the ops left uncounted per layer; totals
    None when not counted."""

    fwd_total: int | None = None
    fwd_per: dict = field(default_factory=dict)
    fwd_missing: dict = field(default_factory=dict)
    bwd_total: int | None = None
    bwd_per: dict = field(default_factory=dict)
    bwd_missing: dict = field(default_factory=dict)
    note: str | None = None


def _flops_by_pass(fwd: FlopCount | None, both: FlopCount | None) -> _Flops:
    """Backward = forward+backward minus forward, per layer and per uncounted op."""
    if fwd is None:
        return _Flops()
    f = _Flops(fwd_total=fwd.total, fwd_per=_per_layer(fwd), bwd_total=0,
               fwd_missing={(k or ROOT): v for k, v in fwd.not_counted_by_module.items()})
    if both is not None:
        f.bwd_total = both.total - fwd.total
        f.bwd_per = {k: v - f.fwd_per.get(k, 0) for k, v in _per_layer(both).items()}
        for k, ops in both.not_counted_by_module.items():
            extra = {op: n - f.fwd_missing.get(k or ROOT, {}).get(op, 0) for op, n in ops.items()}
            f.bwd_missing[k or ROOT] = {op: n for op, n in extra.items() if n > 0}
    f.note = (both or fwd).note("FLOP totals")
    return f


def _flops_or_none(counted: int | None, missing: dict) -> int | None:
    """0 FLOPs where ops went uncounted is not a count: None (shown as not counted)."""
    return None if counted is None or (counted == 0 and missing) else counted


def _layer_rows(model: nn.Module, shapes: dict, own_params: dict, own_trainable: dict, total: int,
                f: _Flops, tops) -> list[SummaryLayer]:
    """One row per module, in the model's order."""
    layers = []
    for mname, mod in model.named_modules():
        name = mname or ROOT
        subtree = {tensor_key(p): p for p in (p for _, p in mod.named_parameters(remove_duplicate=False))}
        children = list(mod.named_children())
        layers.append(SummaryLayer(
            name=name,
            parent=None if not mname else (mname.rsplit(".", 1)[0] if "." in mname else ROOT),
            # a TorchScript module's class is RecursiveScriptModule; original_name is the class it was made from
            type=getattr(mod, "original_name", None) or type(mod).__name__
                 if isinstance(mod, torch.jit.ScriptModule) else type(mod).__name__,
            depth=0 if not mname else mname.count(".") + 1,
            is_leaf=not children,
            output_shape=shapes.get(name),
            params=own_params.get(name, 0),
            params_total=sum(p.numel() for p in subtree.values()),
            pct_of_total=100.0 * own_params.get(name, 0) / total if total else 0.0,
            trainable=own_trainable.get(name, 0),
            # inside TorchScript (not the root) nothing is attributed: not counted, never 0
            flops_forward=None if f.fwd_total is None or (name != ROOT and _in_script(name, tops)) else
                          _flops_or_none(f.fwd_per.get(name, 0), f.fwd_missing.get(name)),
            flops_backward=None if f.bwd_total is None or (name != ROOT and _in_script(name, tops)) else
                           _flops_or_none(f.bwd_per.get(name, 0), f.bwd_missing.get(name)),
            # ops run under this module whose FLOPs the counts above leave out
            flops_not_counted=", ".join(sorted(set(f.fwd_missing.get(name, {})) | set(f.bwd_missing.get(name, {}))))
                              or None,
        ))
    return layers


def _per_token(loaded, f: _Flops):
    """Forward FLOPs per token when the first input is token ids (batch, sequence); UNSET otherwise."""
    first = loaded.input_specs[0] if loaded.input_specs else None
    if first is None or first.dtype not in ("int64", "int32") or len(first.shape) != 2:
        return UNSET
    # token ids (batch, sequence): FLOPs per token, the figure language models are compared by
    counted = _flops_or_none(f.fwd_total, f.fwd_missing.get(ROOT))
    return None if counted is None else counted / (first.shape[0] * first.shape[1])


def analyze(ctx, options: dict) -> SummaryResult:
    options = ANALYSIS.validate(options)  # idempotent: the runner validated them too
    loaded = ctx.loaded
    model = loaded.model
    ctx.progress(0.1, "counting parameters")
    own_params, own_trainable = _owned_params(model)
    unique = unique_params(model)
    total = sum(p.numel() for p in unique)
    trainable = sum(p.numel() for p in unique if p.requires_grad)
    param_bytes = sum(p.numel() * p.element_size() for p in unique)
    buffer_bytes = sum(b.numel() * b.element_size() for b in {id(b): b for b in model.buffers()}.values())
    tied = sum(1 for _ in model.named_parameters(remove_duplicate=False)) - len(unique)

    ctx.progress(0.3, "forward pass: shapes and FLOPs")
    shapes: dict[str, object] = {}
    # A model built on the meta device (a config too big for this machine) runs on fake tensors:
    # shapes and FLOPs without allocating; parameters are counted from the meta tensors as usual.
    counting = nullcontext()
    if loaded.meta:
        from diagnostics.tensors import fake_mode

        counting = fake_mode()
    with counting:
        fwd, both, flops_note, backward_note = _forward_counts(ctx, loaded, options, trainable, shapes)
    f = _flops_by_pass(fwd, both)

    ctx.progress(0.9, "building table")
    tops = script_subtrees(model)
    layers = _layer_rows(model, shapes, own_params, own_trainable, total, f, tops)
    metrics = SummaryMetrics(
        params_total=total,
        params_trainable=trainable,
        params_frozen=total - trainable,
        param_bytes=param_bytes,
        buffer_bytes=buffer_bytes,
        flops_forward=_flops_or_none(f.fwd_total, f.fwd_missing.get(ROOT)),
        flops_backward=_flops_or_none(f.bwd_total, f.bwd_missing.get(ROOT)),
        flops_train_step=None if f.fwd_total is None or f.bwd_total is None else
                         _flops_or_none(f.fwd_total + f.bwd_total, f.fwd_missing.get(ROOT) or f.bwd_missing.get(ROOT)),
        tied_parameters=tied,
        batch_size=loaded.batch_size,
        flops_forward_per_token=_per_token(loaded, f),
    )
    meta_note = None
    if loaded.meta:
        meta_note = (f"this model was {loaded.meta}: parameters and FLOPs are counted exactly (FLOPs on fake "
                     "tensors; backward with the math attention backward, where a fused kernel may also recompute "
                     "the attention scores); no activation memory or time was measured")
    return SummaryResult(
        model=loaded.spec.label,
        model_type=type(model).__name__,
        device=str(loaded.device),
        inputs=tuple(ModelInput(shape=tuple(s.shape), dtype=s.dtype, **({"name": s.name} if s.name else {}))
                     for s in loaded.input_specs),
        output_shape=shapes.get(ROOT),
        loss=loaded.loss_name,
        metrics=metrics,
        layers=tuple(layers),
        meta=loaded.meta is not None,
        notes=tuple(n for n in [meta_note, script_note(tops), flops_note, f.note, backward_note] if n),
    )
