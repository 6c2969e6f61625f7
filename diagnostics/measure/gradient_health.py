"""What counts as a vanishing, exploding or dead layer: the thresholds, their meaning, and
``classify`` (torch-free, so the checklist's rules and the pages read the same constants that
``measure.gradflow`` classifies with)."""

from __future__ import annotations

import math

ROOT = "(model)"

# --- classification thresholds (per layer, on its gradient norm averaged over the steps) -----------
#: A layer whose gradient norm is below this fraction of the largest layer's norm is vanishing:
#: it learns at least a thousand times slower than the layer learning fastest.
VANISHING_RATIO = 1e-3
#: ... or whose gradient norm is below this absolute value (nothing reaches it).
VANISHING_NORM = 1e-7
#: A layer whose gradient L2 norm exceeds this (in any step before gradients turned NaN / Inf) is
#: exploding. Healthy samples stay below 10; the badly initialised MLP starts above 1e7.
EXPLODING_NORM = 1e3
#: A layer whose gradient entries are exactly zero at least this often (over all steps) is dead.
DEAD_ZERO_FRACTION = 0.99
#: A ReLU unit never positive over the batch is dead; a sigmoid output within this of 0 or 1
#: (a tanh output within it of -1 or 1) is saturated.
SATURATION_EPS = 0.01
#: Activation modules with more dead / saturated units than this fraction are flagged.
ACTIVATION_FLAG_FRACTION = 0.5
#: A ReLU unit (a feature, or a channel of a feature map) is judged dead only with at least this
#: many observations in one forward pass (samples x positions): at batch 1 an MLP's unit is
#: "never positive" half the time by chance.
MIN_UNIT_OBSERVATIONS = 8
#: Layers whose gradient touches only the rows a batch looked up: unused rows are exactly zero,
#: so they are dead only when no row got a gradient at all.
SPARSE_ROW_LAYERS = ("Embedding", "EmbeddingBag")

# --- layer kinds that are small at initialisation by design ---------------------------------------
# Comparing every layer with the largest one calls these vanishing on healthy models. Each kind gets
# its own ratio to the largest layer (KIND_VANISHING_RATIO) and is also compared with its peers, the
# other layers of the same kind at other depths (PEER_VANISHING_RATIO): a kind whose members all sit
# low is judged by the first, one member starving among its peers by the second. Measured with HF's
# standard init (normal(0, 0.02), 2 steps, SGD): BERT (hidden 128, 4 layers) query / key projections
# at 3.7e-4 .. 6.4e-4 x the largest layer (the softmax is nearly uniform, so its gradient is small);
# Mamba's dt_proj at 2.8e-4 .. 4.6e-4; T5's relative-attention bias and RMS norms at >= 9.8e-3.
KIND_QK = "query/key projection"
KIND_REL_POS = "relative-position bias"
KIND_LAYER_SCALE = "layer scale"
KIND_NORM = "normalisation"
KIND_SSM_DT = "state-space time step"
KIND_OTHER = "layer"
#: A layer of a small-by-design kind is vanishing below this × the largest layer's norm (100x looser
#: than VANISHING_RATIO: the measured healthy values above sit 10-40x over it).
KIND_VANISHING_RATIO = {KIND_QK: 1e-5, KIND_REL_POS: 1e-5, KIND_LAYER_SCALE: 1e-5, KIND_NORM: 1e-5, KIND_SSM_DT: 1e-5}
#: ... or below this × the largest layer of its own kind (with at least PEER_MIN_LAYERS of that kind)
#: while also below VANISHING_RATIO × the largest layer (so no kind is judged more strictly than a plain layer).
PEER_VANISHING_RATIO = 1e-3
PEER_MIN_LAYERS = 2
#: Each layer is compared with the largest layer of its *neighbourhood*: the nearest module above it
#: whose subtree holds another layer (its attention, MLP or block), and the neighbourhood with the whole
#: model: vanishing if below its rule's ratio × the neighbourhood's largest norm, or if that largest is
#: itself below VANISHING_RATIO × the model's largest. Against the model's largest layer alone, one
#: outlier misjudges the rest: a hierarchical ViT's patch embedding (a small-init convolution behind a
#: LayerNorm, whose gradient the norm scales up by 1 / the convolution's output scale) sits ~40x above
#: its blocks, and the query / key projections and relative-position biases of its first stage fell
#: under 1e-5 × it (Swin, fresh init: 9 of 31 layers flagged), each 3e-4 .. 3e-3 × its own attention.
#: A deep stack of vanishing blocks is still caught: each block's largest layer is far below the model's.

#: A residual branch y = x + γ·f(x) scales every gradient inside f by γ, and layer scale starts γ
#: small on purpose (ConvNeXt: 1e-6, CaiT / DeiT-III: 1e-5 .. 0.1). A block owning a layer-scale
#: parameter whose mean |γ| is below this is "gated": its layers are judged on gradient norm / mean |γ|.
LAYER_SCALE_GATE_MAX = 0.1

_QK_NAMES = frozenset({"q", "k", "query", "key", "q_proj", "k_proj", "wq", "wk", "to_q", "to_k", "q_lin", "k_lin",
                       "query_proj", "key_proj", "q_linear", "k_linear",
                       # DeBERTa's projections of the relative positions into the attention logits: their
                       # input is the (small at init) relative-position embedding itself
                       "pos_proj", "pos_q_proj", "pos_key_proj", "pos_query_proj"})
_REL_POS_MARKS = ("relative_attention_bias", "relative_position_bias", "rel_pos", "relative_bias", "pos_bias",
                  "rel_embeddings")
_SSM_DT_NAMES = frozenset({"dt_proj", "dt_bias", "time_step_proj"})
_LAYER_SCALE_PARAMS = ("gamma", "layer_scale", "layerscale", "ls_gamma", "lambda_", "scale_param")


def is_layer_scale_param(param_name: str, module_type: str) -> bool:
    """A parameter that scales a residual branch: timm's ``LayerScale.gamma``, HF ConvNeXt's
    ``layer_scale_parameter``, CaiT's ``gamma_1``. Norm modules' ``gamma`` (old TF ports) is a norm weight."""
    low = param_name.lower()
    return "norm" not in module_type.lower() and any(low.startswith(m) for m in _LAYER_SCALE_PARAMS)


def layer_kind(name: str, module_type: str, param_names=()) -> str:
    """The kind of layer, from its module name, class name and own parameter names (no torch)."""
    last = name.rsplit(".", 1)[-1].lower()
    low = name.lower()
    if "norm" in module_type.lower():
        return KIND_NORM
    if any(m in low for m in _REL_POS_MARKS) or any(m in p.lower() for p in param_names for m in _REL_POS_MARKS):
        return KIND_REL_POS
    if last in _QK_NAMES:
        return KIND_QK
    if last in _SSM_DT_NAMES or any(p in _SSM_DT_NAMES for p in param_names):
        return KIND_SSM_DT
    if param_names and all(is_layer_scale_param(p, module_type) for p in param_names):
        return KIND_LAYER_SCALE
    return KIND_OTHER


def neighbourhoods(layers: list[str]) -> dict[str, str]:
    """Layer -> its neighbourhood: the nearest module above it whose subtree holds another layer
    ("" for the whole model; ROOT, the model's own parameters, is in the model's)."""
    out = {}
    for name in layers:
        scope = name
        while scope:
            scope = scope.rsplit(".", 1)[0] if "." in scope and name != ROOT else ""
            if not scope or any(o != name and (o == scope or o.startswith(scope + ".")) for o in layers):
                break
        out[name] = scope
    return out


def in_scope(layer: str, scope: str) -> bool:
    return not scope or layer == scope or layer.startswith(scope + ".")


def vanishing_rule(kind: str) -> str:
    """The vanishing rule that applies to a kind, as shown in the layers table's ``rule`` column (the
    neighbourhood is the row's ``neighbourhood``; it must itself be above VANISHING_RATIO × the largest)."""
    if kind in KIND_VANISHING_RATIO:
        return (f"{kind}: < {KIND_VANISHING_RATIO[kind]:g} × its neighbourhood's largest norm, or < "
                f"{PEER_VANISHING_RATIO:g} × the largest {kind}'s and < {VANISHING_RATIO:g} × the neighbourhood's")
    return f"< {VANISHING_RATIO:g} × its neighbourhood's largest norm"

THRESHOLDS = {
    "VANISHING_RATIO": VANISHING_RATIO,
    "VANISHING_NORM": VANISHING_NORM,
    "EXPLODING_NORM": EXPLODING_NORM,
    "DEAD_ZERO_FRACTION": DEAD_ZERO_FRACTION,
    "SATURATION_EPS": SATURATION_EPS,
    "ACTIVATION_FLAG_FRACTION": ACTIVATION_FLAG_FRACTION,
    "MIN_UNIT_OBSERVATIONS": MIN_UNIT_OBSERVATIONS,
    **{f"KIND_VANISHING_RATIO[{k}]": v for k, v in KIND_VANISHING_RATIO.items()},
    "PEER_VANISHING_RATIO": PEER_VANISHING_RATIO,
    "LAYER_SCALE_GATE_MAX": LAYER_SCALE_GATE_MAX,
}
THRESHOLD_HELP = {
    "VANISHING_RATIO": "vanishing if the layer's mean gradient norm < this × the largest layer's",
    "VANISHING_NORM": "vanishing if the layer's mean gradient norm < this (absolute)",
    "EXPLODING_NORM": "exploding if the layer's gradient norm > this (absolute) in any finite step",
    "DEAD_ZERO_FRACTION": "dead if at least this fraction of its gradient entries are exactly 0 "
                          "(embeddings: only if all are, since rows a batch does not use get none)",
    "SATURATION_EPS": "a sigmoid output within this of 0 / 1 (tanh of ±1) counts as saturated",
    "ACTIVATION_FLAG_FRACTION": "an activation with more dead / saturated units than this is flagged",
    "MIN_UNIT_OBSERVATIONS": "ReLU units are judged dead only with this many values each per forward pass "
                             "(batch × positions)",
    **{f"KIND_VANISHING_RATIO[{k}]": f"a {k} (small at initialisation by design) is vanishing if its norm < this × "
                                     "the largest layer's" for k in KIND_VANISHING_RATIO},
    "PEER_VANISHING_RATIO": "... or < this × the largest layer of its own kind (other depths, at least "
                            f"{PEER_MIN_LAYERS} of that kind) and < VANISHING_RATIO × the largest layer's",
    "LAYER_SCALE_GATE_MAX": "layers in a block whose layer scale has mean |γ| below this are judged on "
                            "gradient norm / mean |γ| (the branch scales their gradients by γ)",
}
STATUSES = ("healthy", "vanishing", "exploding", "dead", "non-finite")


def classify(layer: dict, largest_norm: float, peer_largest: float | None = None) -> tuple[str, str]:
    """(status, reason) for one layer summary (see the thresholds above).

    ``layer["kind"]`` (default: a plain layer) picks the vanishing rule; ``peer_largest`` is the
    largest norm among the layers of its kind (None: too few peers); ``layer["gate_scale"]`` (mean
    |γ| of a small layer scale gating its block) divides the norm before the vanishing checks;
    ``layer["neighbourhood"]`` and ``layer["neighbourhood_norm"]`` (its largest norm) are what the
    ratios compare with (without them: the model's largest layer).
    Exploding is checked first: an exploding layer's weights usually turn NaN a step later, and
    the explosion, not the NaN, is the cause to report.
    """
    nonfinite = layer["nan_count"] or layer["inf_count"]
    then = (f"; then {layer['nan_count']} NaN / {layer['inf_count']} Inf gradient entries"
            if nonfinite else "")
    peak = layer["grad_norm_max"]
    if peak is not None and peak > EXPLODING_NORM:
        return "exploding", f"gradient norm reached {peak:.3g} > {EXPLODING_NORM:g}{then}"
    if nonfinite:
        return "non-finite", f"{layer['nan_count']} NaN and {layer['inf_count']} Inf gradient entries"
    norm = layer["grad_norm_mean"]
    if layer.get("type") in SPARSE_ROW_LAYERS:
        if layer["zero_fraction"] >= 1.0:
            return "dead", "no row of this embedding got a gradient"
    elif layer["zero_fraction"] >= DEAD_ZERO_FRACTION:
        return "dead", f"{layer['zero_fraction']:.1%} of gradient entries are exactly zero"
    gate = layer.get("gate_scale")
    what = "gradient norm"
    if gate:
        norm, what = norm / gate, f"gradient norm / layer scale |γ| {gate:.2g}"
    if norm < VANISHING_NORM:
        return "vanishing", f"{what} {norm:.3g} < {VANISHING_NORM:g}"
    scope, ref = layer.get("neighbourhood"), layer.get("neighbourhood_norm")
    if ref is None or not scope or scope == ROOT:
        ref, where = largest_norm, "the largest layer's"
    else:
        where = f"the largest in {scope}"
        if largest_norm > 0 and ref < VANISHING_RATIO * largest_norm:
            return "vanishing", (f"its neighbourhood {scope} vanishes: its largest gradient norm {ref:.3g} is "
                                 f"{ref / largest_norm:.2g} × the largest layer's ({largest_norm:.3g}); < "
                                 f"{VANISHING_RATIO:g}")
    kind = layer.get("kind", KIND_OTHER)
    ratio = KIND_VANISHING_RATIO.get(kind, VANISHING_RATIO)
    label = "" if kind == KIND_OTHER else f" (rule for a {kind})"
    if ref > 0 and norm < ratio * ref:
        return "vanishing", f"{what} {norm:.3g} is {norm / ref:.2g} × {where} ({ref:.3g}); < {ratio:g}{label}"
    # the peer rule only applies below the plain rule's line: a kind's own rule is never stricter
    if (kind in KIND_VANISHING_RATIO and peer_largest and norm < PEER_VANISHING_RATIO * peer_largest
            and norm < VANISHING_RATIO * ref):
        return "vanishing", (f"{what} {norm:.3g} is {norm / peer_largest:.2g} × the largest {kind}'s "
                             f"({peer_largest:.3g}); < {PEER_VANISHING_RATIO:g}")
    return "healthy", ""


def finite(x: float) -> float | None:
    """JSON has no NaN / Inf: non-finite numbers become None (the NaN / Inf counts say why)."""
    x = float(x)
    return x if math.isfinite(x) else None


def gate_for(name: str, gates: dict[str, float]) -> float | None:
    """The gate of the innermost gated block holding ``name`` (not the layer scale itself)."""
    best = None
    for block, scale in gates.items():
        if name.startswith(block + ".") and (best is None or len(block) > len(best[0])):
            best = (block, scale)
    return best[1] if best else None


def summarize_layers(names: list[str], per_step: list[dict], numels: dict[str, int], types: dict[str, str],
                     param_names: dict[str, list[str]], gates: dict[str, float], losses: list) -> tuple:
    """Per-step and per-layer gradient statistics, each layer classified (``classify``).

    ``per_step``: one {"sink": {layer: sums}, "upd": {layer: (update sq, weight sq)}} per step, the sums
    being sq, abs, max, zeros, nan, inf, numel of the layer's gradients (a layer missing from a step's
    sink got no gradient: all zeros). ``gates``: block -> mean |γ| of a small layer scale gating it.
    Returns (steps_table, layers, global_norms), as the Gradient flow page shows them."""
    steps_table, layers, global_norms = [], [], []
    for s, rec in enumerate(per_step):
        total_sq = 0.0
        for name in names:
            acc = rec["sink"].get(name)
            if acc is None:  # no gradient reached it this step
                acc = {"sq": 0.0, "abs": 0.0, "max": 0.0, "zeros": numels[name], "nan": 0, "inf": 0,
                       "numel": numels[name]}
            total_sq += acc["sq"]
            d, w = (rec.get("upd") or {}).get(name, (0.0, 0.0))
            steps_table.append({
                "step": rec.get("step", s + 1), "layer": name,
                "grad_norm": math.sqrt(acc["sq"]),
                "grad_abs_mean": acc["abs"] / max(1, acc["numel"]),
                "grad_abs_max": acc["max"],
                "update_ratio": finite(math.sqrt(d) / math.sqrt(w)) if w > 0 else None,
                "zero_fraction": acc["zeros"] / max(1, acc["numel"]),
                "nan_count": acc["nan"], "inf_count": acc["inf"],
                "numel": acc["numel"],
            })
        global_norms.append({"step": rec.get("step", s + 1), "global_norm": math.sqrt(total_sq), "loss": losses[s]})

    for name in names:
        all_rows = [r for r in steps_table if r["layer"] == name]
        rows = [r for r in all_rows if not (r["nan_count"] or r["inf_count"])] or all_rows
        ratios = [r["update_ratio"] for r in rows if r["update_ratio"] is not None]
        numel = rows[0]["numel"]
        layers.append({
            "index": len(layers), "layer": name, "type": types.get(name, "?"),
            "params": numel,
            "param_names": list(param_names.get(name, [])),
            "grad_norm_mean": sum(r["grad_norm"] for r in rows) / len(rows),
            "grad_norm_max": max(r["grad_norm"] for r in rows),
            "grad_norm_first": all_rows[0]["grad_norm"], "grad_norm_last": all_rows[-1]["grad_norm"],
            "grad_abs_mean": sum(r["grad_abs_mean"] for r in rows) / len(rows),
            "grad_abs_max": max(r["grad_abs_max"] for r in rows),
            "update_ratio_mean": sum(ratios) / len(ratios) if ratios else None,
            "update_ratio_max": max(ratios) if ratios else None,
            "zero_fraction": sum(r["zero_fraction"] for r in rows) / len(rows),
            "nan_count": sum(r["nan_count"] for r in all_rows), "inf_count": sum(r["inf_count"] for r in all_rows),
            "finite_steps": sum(1 for r in all_rows if not (r["nan_count"] or r["inf_count"])),
        })
    for l in layers:
        l["kind"] = layer_kind(l["layer"], l["type"], l["param_names"])
        l["gate_scale"] = None if l["kind"] == "layer scale" else gate_for(l["layer"], gates)
        l["rule"] = vanishing_rule(l["kind"]) + (
            f"; judged on gradient norm / layer scale mean |γ| {l['gate_scale']:.2g}" if l["gate_scale"] else "")
    largest = max((l["grad_norm_mean"] for l in layers), default=0.0)
    scopes = neighbourhoods([l["layer"] for l in layers])
    for l in layers:  # the neighbourhood's largest norm, layer-scale gates divided out as in classify
        l["neighbourhood"] = scopes[l["layer"]] or ROOT
        l["neighbourhood_norm"] = max((finite(o["grad_norm_mean"] / (o["gate_scale"] or 1.0)) or 0.0)
                                      for o in layers if in_scope(o["layer"], scopes[l["layer"]]))
    peers: dict[str, list[float]] = {}
    for l in layers:
        if l["kind"] in KIND_VANISHING_RATIO:
            peers.setdefault(l["kind"], []).append(l["grad_norm_mean"] / (l["gate_scale"] or 1.0))
    for l in layers:
        kin = peers.get(l["kind"], [])
        l["status"], l["reason"] = classify(l, largest, max(kin) if len(kin) >= PEER_MIN_LAYERS else None)
        l["grad_norm_relative"] = l["grad_norm_mean"] / largest if largest > 0 else None
    return steps_table, layers, global_norms
