"""Gradient flow: per-layer gradient statistics over a few training steps, and a health verdict.

A "layer" is a module that owns parameters (tied weights belong to the first module holding them),
listed in forward order. Hooks on every parameter (``register_post_accumulate_grad_hook``) record
the gradient's L2 norm, mean and max |g|, zero fraction and NaN / Inf counts as soon as it is
accumulated; after the optimizer step the update-to-weight ratio ||w' - w|| / ||w|| is measured.
Forward hooks on ReLU / Sigmoid / Tanh modules give dead-unit and saturation fractions.
Each layer is classified with the thresholds below (named constants, shown on the page).
The model's weights are restored afterwards.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

import torch
from torch import nn

from diagnostics.measure.gradient_health import (ACTIVATION_FLAG_FRACTION, LAYER_SCALE_GATE_MAX,
                                                 MIN_UNIT_OBSERVATIONS, ROOT, SATURATION_EPS, STATUSES,
                                                 THRESHOLD_HELP, THRESHOLDS, finite as _finite, is_layer_scale_param,
                                                 phase_of, summarize_layers)
from diagnostics.measure.state import restored_state
from diagnostics.tensors import tensor_key
from diagnostics.measure.training import Step
from diagnostics.errors import TorchScopeError

#: Model sources built with random weights for the run (a built-in sample, a transformers config).
RANDOM_INIT_SOURCES = ("sample", "hf")

_RELUS = (nn.ReLU, nn.ReLU6, nn.LeakyReLU)
_SIGMOIDS = (nn.Sigmoid, nn.Hardsigmoid)
_TANHS = (nn.Tanh, nn.Hardtanh)



def param_owners(model: nn.Module) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """Module name -> its own trainable parameters; a tied parameter goes to its first owner (tied by
    object, or through one storage: see ``tied_aliases``)."""
    seen, owners = set(), {}
    for mname, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            if tensor_key(p) in seen or not p.requires_grad:
                continue
            seen.add(tensor_key(p))
            owners.setdefault(mname or ROOT, []).append((pname, p))
    return owners


def tied_aliases(model: nn.Module) -> dict[int, list[nn.Parameter]]:
    """id of a parameter ``param_owners`` keeps -> the other Parameter objects over its storage.

    torch.export save / load gives tied weights back as two Parameter objects over one storage, and
    its graph may read the weight through either (GPT-2's embedding is looked up through the head's
    object): the gradient of the weight is the sum of theirs."""
    first: dict[object, nn.Parameter] = {}
    others: dict[int, list[nn.Parameter]] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        if not p.requires_grad:
            continue
        kept = first.setdefault(tensor_key(p), p)
        if kept is not p and all(q is not p for q in others.get(id(kept), [])):
            others.setdefault(id(kept), []).append(p)
    return others


def fold_aliases(params: dict[int, tuple[str, nn.Parameter]], aliases: dict[int, list[nn.Parameter]]) -> None:
    """Move the gradients of a tied weight's other Parameter objects onto the one kept (summed), so
    that hooks, statistics and the optimizer see the weight's whole gradient once."""
    for pid, extra in aliases.items():
        kept = params[pid][1]
        grads = [q.grad for q in [kept, *extra] if q.grad is not None]
        for q in extra:
            q.grad = None
        if grads and (len(grads) > 1 or kept.grad is None):
            kept.grad = torch.stack(grads).sum(0) if len(grads) > 1 else grads[0]


@contextmanager
def forward_order_hooks(model: nn.Module, order: list[str]):
    """Append each module's name the first time its forward starts (pre-hooks: parents first)."""
    handles = []
    try:
        for mname, mod in model.named_modules():
            if isinstance(mod, torch.jit.ScriptModule):
                continue

            def pre(_m, _inp, name=mname or ROOT):
                if name not in order:
                    order.append(name)

            handles.append(mod.register_forward_pre_hook(pre))
        yield
    finally:
        for h in handles:
            h.remove()


def activation_kind(mod: nn.Module) -> str | None:
    if isinstance(mod, _RELUS):
        return "relu"
    if isinstance(mod, _SIGMOIDS):
        return "sigmoid"
    if isinstance(mod, _TANHS):
        return "tanh"
    return None


def relu_units_alive(out: torch.Tensor) -> torch.Tensor | None:
    """Per unit, whether it was positive at least once in this output. Units are features (dim 1 of
    [B, F], the last dim of [B, T, F]) or channels (dim 1 of [B, C, H, W, ...]). None when the output
    is not finite or has fewer than MIN_UNIT_OBSERVATIONS values per unit."""
    y = out.detach()
    if y.dim() < 2 or not bool(torch.isfinite(y).all()):
        return None
    unit_dim = 2 if y.dim() == 3 else 1
    units = y.movedim(unit_dim, 0).reshape(y.shape[unit_dim], -1)
    if units.shape[1] < MIN_UNIT_OBSERVATIONS:
        return None
    return (units > 0).any(dim=1)


def activation_stats(kind: str, out: torch.Tensor) -> dict:
    """Dead-unit fraction (ReLU: a unit never > 0 in this pass; None when it cannot be judged) or
    saturated-output fraction."""
    y = out.detach().float()
    if kind == "relu":
        alive = relu_units_alive(y)
        return {"dead_fraction": None if alive is None else float(1.0 - alive.float().mean()),
                "saturated_fraction": None}
    if kind == "sigmoid":
        sat = (y < SATURATION_EPS) | (y > 1 - SATURATION_EPS)
    else:
        sat = y.abs() > 1 - SATURATION_EPS
    return {"dead_fraction": None, "saturated_fraction": float(sat.float().mean())}


@contextmanager
def activation_hooks(model: nn.Module, sink: dict):
    """Record activation statistics of ReLU / Sigmoid / Tanh modules on every forward pass."""
    handles = []
    try:
        for mname, mod in model.named_modules():
            kind = activation_kind(mod)
            if kind is None or isinstance(mod, torch.jit.ScriptModule):
                continue

            def hook(_m, _inp, out, name=mname or ROOT, kind=kind):
                if isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel():
                    sink.setdefault(name, {"kind": kind, "type": type(_m).__name__, "samples": []})["samples"].append(
                        activation_stats(kind, out))

            handles.append(mod.register_forward_hook(hook))
        yield
    finally:
        for h in handles:
            h.remove()


def grad_stats(g: torch.Tensor) -> dict:
    """Sums over one gradient tensor, accumulated per layer: squares, |g|, max |g|, zeros, NaN, Inf."""
    g = g.detach()
    if g.is_sparse:
        g = g.to_dense()
    g = g.float()
    nan = int(torch.isnan(g).sum())
    inf = int(torch.isinf(g).sum())
    finite = torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0)
    return {
        "sq": float(finite.double().pow(2).sum()),
        "abs": float(finite.double().abs().sum()),
        "max": float(finite.abs().max()) if g.numel() else 0.0,
        "zeros": int((g == 0).sum()),
        # a parameter whose gradient is mostly non-zero: the gradient reaches the layer's output
        "dense": int(g.numel() > 0 and int((g != 0).sum()) * 2 > g.numel()),
        "nan": nan,
        "inf": inf,
        "numel": g.numel(),
    }


def add_grad_stats(sink: dict, layer: str, grad: torch.Tensor) -> None:
    s, acc = grad_stats(grad), sink.setdefault(layer, {})
    for k, v in s.items():
        acc[k] = max(acc.get(k, 0.0), v) if k == "max" else acc.get(k, 0) + v


@contextmanager
def grad_hooks(params: dict[int, str], sink: dict, skip: frozenset = frozenset()):
    """One post-accumulate-grad hook per parameter (but those in ``skip``, a tied weight's, read after
    its aliases are folded); ``sink[layer]`` collects that step's sums."""
    handles = []
    try:
        for p_id, (layer, p) in params.items():
            if p_id in skip:
                continue

            def hook(param, layer=layer):
                if param.grad is not None:
                    add_grad_stats(sink, layer, param.grad)

            handles.append(p.register_post_accumulate_grad_hook(hook))
        yield
    finally:
        for h in handles:
            h.remove()


def layer_scale_gates(model: nn.Module) -> dict[str, float]:
    """Block name -> mean |γ| of the small layer-scale parameters gating it (the largest, if several).

    A module owning a layer-scale parameter and other layers (HF ConvNeXt's layer) gates itself; a
    bare LayerScale module (timm's ``ls1.gamma``) gates its parent block. Only γ with mean |γ| below
    LAYER_SCALE_GATE_MAX count: a grown-up layer scale does not hide its branch's gradients."""
    gates: dict[str, float] = {}
    for mname, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            if not p.is_floating_point() or not p.numel() or not is_layer_scale_param(pname, type(mod).__name__):
                continue
            scale = float(p.detach().abs().float().mean())
            if scale >= LAYER_SCALE_GATE_MAX:
                continue
            has_layers = any(True for c in mod.children() for _ in c.parameters())
            block = mname if has_layers or "." not in mname else mname.rsplit(".", 1)[0]
            gates[block] = max(gates.get(block, 0.0), scale)
    return gates


def layer_order(called: list[str], layers: list[str]) -> list[str]:
    """Layers in forward order. A layer whose forward never ran as a module call (MultiheadAttention
    calls its out_proj functionally) goes after its nearest called ancestor's subtree."""
    seq = list(called)
    for name in layers:
        if name in seq:
            continue
        anc = name
        while anc != ROOT:
            anc = anc.rsplit(".", 1)[0] if "." in anc else ROOT
            if anc in seq and anc != ROOT:
                break
        if anc == ROOT or anc not in seq:
            seq.append(name)
            continue
        i = seq.index(anc) + 1
        while i < len(seq) and seq[i].startswith(anc + "."):
            i += 1
        seq.insert(i, name)
    return [n for n in seq if n in layers]


def _update_sums(params: dict, before: dict) -> dict[str, list[float]]:
    """Per layer: [||w' - w||^2, ||w||^2] over its parameters, after the optimizer step."""
    upd: dict[str, list[float]] = {}
    with torch.no_grad():
        for pid, (layer, p) in params.items():
            d = (p.detach() - before[pid]).double().pow(2).sum().item()
            w = before[pid].double().pow(2).sum().item()
            u = upd.setdefault(layer, [0.0, 0.0])
            u[0] += d
            u[1] += w
    return upd


def _hooked_steps(loaded, o: dict, params: dict, aliases: dict, progress):
    """Train ``o["steps"]`` steps (the model restored afterwards) with the gradient, forward-order and activation
    hooks on: (the layers' forward order, activation samples, per-step sinks and updates, the losses)."""
    model = loaded.model
    order: list[str] = []
    acts: dict[str, dict] = {}
    per_step: list[dict] = []
    losses: list[float | None] = []
    with restored_state(model):
        model.train()
        train_step = Step(loaded, True, o["optimizer"], o["lr"], params=[p for _, p in params.values()])

        def read_grads(sink: dict, before: dict) -> None:
            """After backward (the hooks read the gradients as they came): fold a tied weight's gradients,
            read those, and keep the weights the optimizer step is about to change."""
            fold_aliases(params, aliases)
            for pid in aliases:
                layer, p = params[pid]
                if p.grad is not None:
                    add_grad_stats(sink, layer, p.grad)
            before.update({pid: p.detach().clone() for pid, (_, p) in params.items()})

        with forward_order_hooks(model, order), activation_hooks(model, acts):
            for step in range(o["steps"]):
                sink: dict[str, dict] = {}
                before: dict[int, torch.Tensor] = {}
                with grad_hooks(params, sink, frozenset(aliases)):
                    loss = train_step(after_backward=lambda: read_grads(sink, before))
                upd = _update_sums(params, before)
                del before
                per_step.append({"sink": sink, "upd": upd})
                losses.append(_finite(loss))
                progress(0.05 + 0.85 * (step + 1) / o["steps"], f"step {step + 1} / {o['steps']}")
    return order, acts, per_step, losses


def _activation_rows(acts: dict, order: list[str]) -> list[dict]:
    """Per hooked activation module, in forward order: its mean dead (ReLU) or saturated fraction, flagged
    above ACTIVATION_FLAG_FRACTION."""
    activations = []
    for name, a in acts.items():
        samples = a["samples"]
        key = "dead_fraction" if a["kind"] == "relu" else "saturated_fraction"
        seen = [s[key] for s in samples if s[key] is not None]
        value = sum(seen) / len(seen) if seen else None  # None: too few values per unit to judge
        activations.append({
            "module": name, "type": a["type"], "kind": a["kind"],
            "dead_fraction": value if key == "dead_fraction" else None,
            "saturated_fraction": value if key == "saturated_fraction" else None,
            "flagged": value is not None and value > ACTIVATION_FLAG_FRACTION,
        })
    activations.sort(key=lambda r: order.index(r["module"]) if r["module"] in order else len(order))
    return activations


def _flow_metrics(layers: list[dict], activations: list[dict], global_norms: list[dict], losses: list,
                  steps: int) -> tuple[dict, dict]:
    """The run's figures, and the layers counted by status."""
    counts = {s: sum(1 for l in layers if l["status"] == s) for s in STATUSES}
    dead_fracs = [a["dead_fraction"] for a in activations if a["dead_fraction"] is not None]
    sat_fracs = [a["saturated_fraction"] for a in activations if a["saturated_fraction"] is not None]
    metrics = {
        "layers": len(layers),
        "layers_healthy": counts["healthy"],
        "layers_vanishing": counts["vanishing"],
        "layers_exploding": counts["exploding"],
        "layers_dead": counts["dead"],
        "layers_nonfinite": counts["non-finite"],
        "layers_flagged": len(layers) - counts["healthy"],
        "global_norm_first": _finite(global_norms[0]["global_norm"]),
        "global_norm_last": _finite(global_norms[-1]["global_norm"]),
        "global_norm_max": _finite(max(g["global_norm"] for g in global_norms)),
        "grad_norm_min_ratio": _finite(min(l["grad_norm_relative"] or 0.0 for l in layers)),
        "loss_first": losses[0], "loss_last": losses[-1],
        "dead_relu_fraction_max": max(dead_fracs) if dead_fracs else None,
        "saturated_fraction_max": max(sat_fracs) if sat_fracs else None,
        "activations_flagged": sum(1 for a in activations if a["flagged"]),
        "steps": steps,
    }
    return metrics, counts


def _finite_figures(steps_table: list[dict], layers: list[dict], global_norms: list[dict]) -> None:
    """Non-finite norms and magnitudes made None in place (JSON has no NaN / Inf)."""
    for r in steps_table:
        for k in ("grad_norm", "grad_abs_mean", "grad_abs_max"):
            r[k] = _finite(r[k])
    for l in layers:
        for k in ("grad_norm_mean", "grad_norm_max", "grad_norm_first", "grad_norm_last", "grad_abs_mean", "grad_abs_max",
                  "grad_norm_relative", "relative_grad", "peer_median"):
            l[k] = None if l[k] is None else _finite(l[k])
    for g in global_norms:
        g["global_norm"] = _finite(g["global_norm"])


def gradient_flow(loaded, steps: int, optimizer: str = "sgd", lr: float = 0.01,
                  progress: Callable[[float, str], None] | None = None) -> dict:
    """Train ``steps`` steps on the loaded model (restored afterwards) with hooks on every layer's
    parameter gradients and on the activations: per-step and per-layer gradient statistics, update
    ratios, dead / saturated activations, and each layer's status (``gradient_health.classify``)."""
    progress = progress or (lambda f, m: None)
    o = {"steps": int(steps), "optimizer": optimizer, "lr": float(lr)}
    model = loaded.model
    owners = param_owners(model)
    if not owners:
        raise TorchScopeError("the model has no trainable parameters: there is no gradient flow to look at")
    params = {id(p): (layer, p) for layer, ps in owners.items() for _, p in ps}
    aliases = tied_aliases(model)
    progress(0.05, "training steps with gradient hooks")
    order, acts, per_step, losses = _hooked_steps(loaded, o, params, aliases, progress)

    progress(0.92, "classifying layers")
    names = layer_order(order, list(owners))
    types = dict((mname or ROOT, type(m).__name__) for mname, m in model.named_modules())
    # a config or a sample is built with random weights here; a loss at chance level says the same
    phase, phase_reason = phase_of(losses[0], getattr(loaded, "num_classes", None),
                                   random_init=loaded.spec.source in RANDOM_INIT_SOURCES and not loaded.spec.weights_path)
    steps_table, layers, global_norms = summarize_layers(
        names, per_step, {n: sum(p.numel() for _, p in owners[n]) for n in names}, types,
        {n: [pn for pn, _ in owners[n]] for n in names}, layer_scale_gates(model), losses, phase)
    activations = _activation_rows(acts, order)
    metrics, counts = _flow_metrics(layers, activations, global_norms, losses, o["steps"])
    verdict = "healthy" if metrics["layers_flagged"] == 0 else ", ".join(
        f"{counts[s]} {s}" for s in STATUSES[1:] if counts[s])
    _finite_figures(steps_table, layers, global_norms)
    progress(1.0, "done")
    stand_in = bool(getattr(loaded, "loss_stand_in", False))
    notes = []
    if stand_in:
        notes.append(f"the loss is a stand-in ({loaded.loss_name}): with no loss declared, the gradients are those "
                     "of a fixed random direction of the output, not of your training objective; declare "
                     "loss_fn(output) in the model file for verdicts about your training (an exported or "
                     "TorchScript program always gets the stand-in). Verdicts from a stand-in loss are "
                     "low-confidence.")
    return {
        "loss": getattr(loaded, "loss_name", None), "loss_stand_in": stand_in,
        "confidence": "low" if stand_in else "normal",
        "phase": phase, "phase_reason": phase_reason,
        "model": loaded.spec.label,
        "device": str(loaded.device),
        "verdict": verdict,
        "thresholds": [{"name": k, "value": v, "meaning": THRESHOLD_HELP[k]} for k, v in THRESHOLDS.items()],
        "metrics": metrics,
        "layers": layers,
        "steps": steps_table,
        "global_norms": global_norms,
        "activations": activations,
        "notes": notes,
    }
