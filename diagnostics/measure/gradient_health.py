"""What counts as a vanishing, exploding or dead layer: the thresholds, their meaning, and
``classify`` (torch-free, so the checklist's rules and the pages read the same constants that
``measure.gradflow`` classifies with)."""

from __future__ import annotations

import math
import re

ROOT = "(model)"

# --- classification thresholds ----------------------------------------------------------------------
# A layer is judged on its *relative gradient* ‖g‖ / ‖w‖ (its gradient norm averaged over the steps, over
# its weight norm before the first step): how fast its weights move per unit of learning rate, whatever
# their scale. (Without weight norms, as in an attached run, on its gradient norm.) It is compared with
# two robust references, never with the single largest layer, which one outlier sets (DETR's first
# decoder layer attends over all-zero queries: its self-attention output projection's gradient is ~1000x
# the encoder's, and 37 healthy layers fell under 1e-3 x it):
#  * the model's reference: the relative gradient that REFERENCE_QUANTILE of its plain layers (no kind
#    below) reach or exceed (the 90th percentile: up to a tenth of them may be outliers above it);
#  * its peers: the same layer at the other depths (its name with the block indices dropped, e.g.
#    encoder.layers.*.self_attn.q_proj), their median, with at least PEER_MIN_LAYERS of them (itself not
#    counted).
#: A layer's relative gradient below this × the model's reference is vanishing: it learns 10^4 times slower
#: than the layers learning fastest. Healthy architectures built from configs sit at >= 10^-3.4 (SpeechT5's
#: first convolution, under a norm); deep_sigmoid_mlp's first 14 layers at 10^-15 .. 10^-4.
VANISHING_RATIO = 1e-4
#: ... or below this × the median of its peers (one layer starving among its kind at other depths).
#: Healthy: >= 10^-2.2 (BART's first encoder MLP).
PEER_VANISHING_RATIO = 1e-3
PEER_MIN_LAYERS = 3
#: Up to this fraction of the layers may sit above the model's reference (outliers do not set it).
REFERENCE_QUANTILE = 0.1
#: With no weight norm and no relative gradient (an attached run), a gradient norm below this is vanishing.
VANISHING_NORM = 1e-7
#: A layer whose gradient L2 norm exceeds this (in any step before gradients turned NaN / Inf) is
#: exploding. Healthy samples stay below 10; the badly initialised MLP starts above 1e7.
EXPLODING_NORM = 1e3
#: A layer whose gradient entries are exactly zero at least this often (over all steps) is dead.
DEAD_ZERO_FRACTION = 0.99
#: A relative gradient below this is no gradient at all in float32 (an update lr·g could not change a
#: weight: float32 resolves 1.2e-7 of it). A query / key projection this far down while its attention's
#: other projections learn is *idle*, not vanishing: its attention's output does not depend on its scores
#: (its values are identical: DETR's first decoder layer attends over all-zero queries, always).
NUMERICAL_ZERO_RATIO = 1e-12
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

# --- phases -------------------------------------------------------------------------------------------
PHASE_INIT = "at initialisation"
PHASE_TRAINED = "after training"
PHASE_UNKNOWN = "unknown"
#: A loss at or above this fraction of chance level (ln of the number of classes: a uniform guess) says
#: the model has not learned yet: it is judged as at initialisation.
CHANCE_LOSS_FRACTION = 0.9

# --- layer kinds that are small by design -----------------------------------------------------------
KIND_QK = "query/key projection"
KIND_REL_POS = "relative-position bias"
KIND_LAYER_SCALE = "layer scale"
KIND_NORM = "normalisation"
KIND_SSM_DT = "state-space time step"
KIND_EMBEDDING = "embedding"
KIND_OTHER = "layer"
#: At initialisation a layer of these kinds is vanishing only below this × the model's reference. Their
#: relative gradients are small by design: a query / key projection's is second order in the init scale
#: (logits near 0, the softmax nearly uniform: BART 10^-5.4, Swin 10^-4.6 x the reference), a relative-
#: position table's is reached only through them (SpeechT5's pe_k 10^-6.7), a norm's weight is all ones
#: (Whisper, SegFormer 10^-5.4), an embedding's rows are N(0, 1) and mostly not looked up (10^-4.5), a
#: layer scale starts at 1e-6 .. 0.1, Mamba's time step goes through a softplus and a scan (10^-4.9).
KIND_VANISHING_RATIO = {KIND_QK: 1e-8, KIND_REL_POS: 1e-8, KIND_LAYER_SCALE: 1e-8, KIND_NORM: 1e-8,
                        KIND_SSM_DT: 1e-8, KIND_EMBEDDING: 1e-8}
#: After training the kinds small only *at initialisation* (attention that has learned its patterns,
#: layer scales that have grown) are held to this instead; norms, embeddings and time steps keep theirs.
TRAINED_VANISHING_RATIO = {KIND_QK: 1e-6, KIND_REL_POS: 1e-6, KIND_LAYER_SCALE: 1e-6}
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
#: SpeechT5's relative positional encoding (its key table, pe_k)
_REL_POS_NAMES = frozenset({"pe_k", "pe_v"})
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
    # by its class, or by its name where the class is lost (an exported program's InterpreterModule)
    if "norm" in module_type.lower() or "norm" in last or re.fullmatch(r"ln(_\w+|\d+)?", last):
        return KIND_NORM
    if (any(m in low for m in _REL_POS_MARKS) or last in _REL_POS_NAMES
            or any(m in p.lower() for p in param_names for m in _REL_POS_MARKS)):
        return KIND_REL_POS
    if last in _QK_NAMES:
        return KIND_QK
    if last in _SSM_DT_NAMES or any(p in _SSM_DT_NAMES for p in param_names):
        return KIND_SSM_DT
    if param_names and all(is_layer_scale_param(p, module_type) for p in param_names):
        return KIND_LAYER_SCALE
    if module_type in SPARSE_ROW_LAYERS:
        return KIND_EMBEDDING
    return KIND_OTHER


def peer_role(name: str) -> str:
    """A layer's role, the same at every depth: its name with the block indices replaced by ``*``
    (``encoder.layers.3.self_attn.q_proj`` -> ``encoder.layers.*.self_attn.q_proj``)."""
    return ".".join("*" if part.isdigit() else part for part in name.split("."))


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


def kind_ratio(kind: str, phase: str) -> float:
    """The vanishing ratio to the model's reference for a kind in a phase (unknown: as at initialisation)."""
    if phase == PHASE_TRAINED and kind in TRAINED_VANISHING_RATIO:
        return TRAINED_VANISHING_RATIO[kind]
    return KIND_VANISHING_RATIO.get(kind, VANISHING_RATIO)


def vanishing_rule(kind: str, phase: str = PHASE_INIT, relative: bool = True) -> str:
    """The vanishing rule that applies to a kind, as shown in the layers table's ``rule`` column."""
    what = "‖g‖/‖w‖" if relative else "gradient norm"
    return (f"{what} < {kind_ratio(kind, phase):g} × the model's reference (its layers' "
            f"{1 - REFERENCE_QUANTILE:.0%} percentile), or < {PEER_VANISHING_RATIO:g} × its peers' median (the "
            f"same layer at >= {PEER_MIN_LAYERS} other depths)")


THRESHOLDS = {
    "VANISHING_RATIO": VANISHING_RATIO,
    "PEER_VANISHING_RATIO": PEER_VANISHING_RATIO,
    "PEER_MIN_LAYERS": PEER_MIN_LAYERS,
    "REFERENCE_QUANTILE": REFERENCE_QUANTILE,
    **{f"KIND_VANISHING_RATIO[{k}]": v for k, v in KIND_VANISHING_RATIO.items()},
    **{f"TRAINED_VANISHING_RATIO[{k}]": v for k, v in TRAINED_VANISHING_RATIO.items()},
    "NUMERICAL_ZERO_RATIO": NUMERICAL_ZERO_RATIO,
    "VANISHING_NORM": VANISHING_NORM,
    "EXPLODING_NORM": EXPLODING_NORM,
    "DEAD_ZERO_FRACTION": DEAD_ZERO_FRACTION,
    "CHANCE_LOSS_FRACTION": CHANCE_LOSS_FRACTION,
    "SATURATION_EPS": SATURATION_EPS,
    "ACTIVATION_FLAG_FRACTION": ACTIVATION_FLAG_FRACTION,
    "MIN_UNIT_OBSERVATIONS": MIN_UNIT_OBSERVATIONS,
    "LAYER_SCALE_GATE_MAX": LAYER_SCALE_GATE_MAX,
}
THRESHOLD_HELP = {
    "VANISHING_RATIO": "vanishing if the layer's relative gradient ‖g‖/‖w‖ (mean gradient norm over its weight norm) "
                       "< this × the model's reference",
    "PEER_VANISHING_RATIO": "... or < this × the median of its peers (the same layer at other depths)",
    "PEER_MIN_LAYERS": "peers are compared only when at least this many layers share a role",
    "REFERENCE_QUANTILE": "the model's reference: the relative gradient this fraction of its plain layers reach or exceed "
                          "(outliers above it do not set the scale)",
    **{f"KIND_VANISHING_RATIO[{k}]": f"a {k} (small by design) is vanishing only below this × the model's reference"
       for k in KIND_VANISHING_RATIO},
    **{f"TRAINED_VANISHING_RATIO[{k}]": f"after training a {k} is held to this instead (small only at initialisation)"
       for k in TRAINED_VANISHING_RATIO},
    "NUMERICAL_ZERO_RATIO": "a query / key projection with ‖g‖/‖w‖ below this while its attention learns is idle "
                            "(its attention's output does not depend on its scores), not vanishing",
    "VANISHING_NORM": "without weight norms (an attached run): vanishing if the mean gradient norm < this",
    "EXPLODING_NORM": "exploding if the layer's gradient norm > this (absolute) in any finite step",
    "DEAD_ZERO_FRACTION": "dead if at least this fraction of its gradient entries are exactly 0 "
                          "(embeddings: only if all are, since rows a batch does not use get none)",
    "CHANCE_LOSS_FRACTION": "a first loss at or above this × chance level (ln of the classes) means the model has "
                            "not learned yet: judged as at initialisation",
    "SATURATION_EPS": "a sigmoid output within this of 0 / 1 (tanh of ±1) counts as saturated",
    "ACTIVATION_FLAG_FRACTION": "an activation with more dead / saturated units than this is flagged",
    "MIN_UNIT_OBSERVATIONS": "ReLU units are judged dead only with this many values each per forward pass "
                             "(batch × positions)",
    "LAYER_SCALE_GATE_MAX": "layers in a block whose layer scale has mean |γ| below this are judged on "
                            "gradient norm / mean |γ| (the branch scales their gradients by γ)",
}
STATUSES = ("healthy", "vanishing", "exploding", "dead", "non-finite")


def phase_of(loss_first: float | None, num_classes: int | None, random_init: bool = False) -> tuple[str, str]:
    """(phase, why): at initialisation when the first loss is still at chance level (ln of the number of
    classes), or the weights were drawn at random just now (``random_init``: a config built here); after
    training when the loss is below it; unknown without a chance level (judged as at initialisation)."""
    if num_classes and num_classes > 1 and loss_first is not None:
        chance = math.log(num_classes)
        if loss_first >= CHANCE_LOSS_FRACTION * chance:
            return PHASE_INIT, (f"the first loss {loss_first:.3g} is at chance level or above (ln {num_classes} = "
                                f"{chance:.3g}): the model has not learned yet")
        return PHASE_TRAINED, (f"the first loss {loss_first:.3g} is below chance level (ln {num_classes} = "
                               f"{chance:.3g}): the model has learned")
    if random_init:
        return PHASE_INIT, "the weights were drawn at random for this run"
    return PHASE_UNKNOWN, ("no chance level to compare the loss with: judged with the allowances of a fresh "
                           "initialisation (the more lenient)")


def reference_level(values: list[float]) -> float | None:
    """The model's reference: the value REFERENCE_QUANTILE of ``values`` reach or exceed."""
    v = sorted((x for x in values if x is not None and x > 0 and math.isfinite(x)), reverse=True)
    return v[int(REFERENCE_QUANTILE * len(v))] if v else None


def classify(layer: dict, reference: float | None, phase: str = PHASE_INIT) -> tuple[str, str]:
    """(status, reason) for one layer summary (see the thresholds above).

    ``layer["signal"]`` is what is judged: the relative gradient ‖g‖/‖w‖ (or, with
    ``layer["relative"]`` False, the gradient norm), already divided by a layer-scale gate;
    ``reference`` the model's reference level of it; ``layer["peer_median"]`` its peers' median (None:
    fewer than PEER_MIN_LAYERS); ``layer["idle"]`` a reason it is idle by construction (a query / key
    projection without gradient in an attention that learns). Exploding is checked first: an exploding
    layer's weights usually turn NaN a step later, and the explosion, not the NaN, is the cause.
    """
    nonfinite = layer["nan_count"] or layer["inf_count"]
    then = (f"; then {layer['nan_count']} NaN / {layer['inf_count']} Inf gradient entries"
            if nonfinite else "")
    peak = layer["grad_norm_max"]
    if peak is not None and peak > EXPLODING_NORM:
        return "exploding", f"gradient norm reached {peak:.3g} > {EXPLODING_NORM:g}{then}"
    if nonfinite:
        return "non-finite", f"{layer['nan_count']} NaN and {layer['inf_count']} Inf gradient entries"
    if layer.get("type") in SPARSE_ROW_LAYERS:
        if layer["zero_fraction"] >= 1.0:
            return "dead", "no row of this embedding got a gradient"
    elif layer["zero_fraction"] >= DEAD_ZERO_FRACTION:
        if layer.get("reached"):
            # its bias (a parameter whose gradient is mostly non-zero) learns: the gradient reaches the layer,
            # its weight gets none because its input is zero
            return "healthy", (f"idle weights by construction, not dead: {layer['zero_fraction']:.1%} of its gradient "
                               "entries are zero because its input is all zero (DETR's first decoder layer over "
                               "all-zero queries), while a parameter of it gets a full gradient: the gradient "
                               "reaches it")
        return "dead", f"{layer['zero_fraction']:.1%} of gradient entries are exactly zero"
    if layer.get("idle"):
        return "healthy", layer["idle"]
    signal = layer.get("signal")
    relative = layer.get("relative", True)
    what = "‖g‖/‖w‖" if relative else "gradient norm"
    gate = layer.get("gate_scale")
    if gate:
        what += f" / layer scale |γ| {gate:.2g}"
    if signal is None:
        return "healthy", ("its weights are all zero (zero-initialised): judged on dead and exploding gradients "
                           "only" if relative and layer.get("weight_norm") == 0 else "")
    if not relative and signal < VANISHING_NORM:
        return "vanishing", f"{what} {signal:.3g} < {VANISHING_NORM:g}"
    kind = layer.get("kind", KIND_OTHER)
    ratio = kind_ratio(kind, phase)
    label = "" if kind == KIND_OTHER else f", the allowance of a {kind}{'' if phase != PHASE_TRAINED else ' after training'}"
    if reference and signal < ratio * reference:
        return "vanishing", (f"{what} {signal:.3g} is {signal / reference:.2g} × the model's reference {reference:.3g} "
                             f"(its layers' {1 - REFERENCE_QUANTILE:.0%} percentile); < {ratio:g}{label}")
    peers = layer.get("peer_median")
    if peers and signal < PEER_VANISHING_RATIO * peers:
        return "vanishing", (f"{what} {signal:.3g} is {signal / peers:.2g} × the median of its "
                             f"{layer.get('peer_count', 0)} peers {layer.get('peer_role', '')} ({peers:.3g}); "
                             f"< {PEER_VANISHING_RATIO:g}")
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


def weight_norm(per_step: list[dict], layer: str) -> float | None:
    """The layer's weight L2 norm before the first step (None: not measured, as in an attached run)."""
    upd = (per_step[0].get("upd") or {}).get(layer) if per_step else None
    return None if upd is None else finite(math.sqrt(upd[1]))


def _median(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else math.sqrt(v[n // 2 - 1] * v[n // 2])  # geometric: these span decades


def judge_layers(layers: list[dict], phase: str = PHASE_INIT) -> float | None:
    """Classify each layer summary in place (``status``, ``reason``, ``signal``, ``relative_grad``,
    ``peer_role`` / ``peer_median``, ``rule``); returns the model's reference level."""
    relative = all(l.get("weight_norm") is not None for l in layers)
    for l in layers:
        g = l["grad_norm_mean"]
        gate = l.get("gate_scale") or 1.0
        w = l.get("weight_norm")
        l["relative_grad"] = finite(g / w) if (w and g is not None) else None
        l["relative"] = relative
        if not relative:
            l["signal"] = None if g is None else finite(g / gate)
        else:
            l["signal"] = None if l["relative_grad"] is None else finite(l["relative_grad"] / gate)
    healthy_like = [l for l in layers if not (l["nan_count"] or l["inf_count"])]
    # plain layers set the reference: a kind with a scale of its own (a layer scale's γ of 1e-6 moves 1e3 x
    # faster than the convolutions it gates) would set it for every other
    reference = reference_level([l["signal"] for l in healthy_like if l["kind"] == KIND_OTHER]) \
        or reference_level([l["signal"] for l in healthy_like])
    roles: dict[str, list[float]] = {}
    for l in healthy_like:
        if l["signal"]:
            roles.setdefault(peer_role(l["layer"]), []).append(l["signal"])
    scopes = neighbourhoods([l["layer"] for l in layers])
    for l in layers:
        role = peer_role(l["layer"])
        kin = list(roles.get(role, []))
        if l["signal"] and not (l["nan_count"] or l["inf_count"]):
            kin.remove(l["signal"])  # its peers are the others
        l["peer_role"] = role
        l["peer_count"] = len(kin)
        l["peer_median"] = _median(kin) if len(kin) >= PEER_MIN_LAYERS else None
        l["neighbourhood"] = scopes[l["layer"]] or ROOT
        l["neighbourhood_norm"] = max((finite(o["grad_norm_mean"] / (o.get("gate_scale") or 1.0)) or 0.0)
                                      for o in layers if in_scope(o["layer"], scopes[l["layer"]]))
        l["idle"] = None
        if l["kind"] == KIND_QK and relative and reference and l["signal"] is not None \
                and l["signal"] < NUMERICAL_ZERO_RATIO:
            # its attention: the other layers of its neighbourhood, learning at the plain rule's pace or faster
            active = [o for o in layers if o is not l and in_scope(o["layer"], scopes[l["layer"]])
                      and o["kind"] == KIND_OTHER and (o["signal"] or 0) >= VANISHING_RATIO * reference]
            if active:
                o = max(active, key=lambda x: x["signal"])
                l["idle"] = (f"idle by construction, not vanishing: ‖g‖/‖w‖ {l['signal']:.2g} is no gradient in float32 "
                             f"(< {NUMERICAL_ZERO_RATIO:g}) while its attention learns ({o['layer']}: {o['signal']:.3g}): "
                             "the attention's output does not depend on its scores (its values are identical, as "
                             "in DETR's first decoder layer over all-zero queries)")
        l["status"], l["reason"] = classify(l, reference, phase)
        l["rule"] = vanishing_rule(l["kind"], phase, relative) + (
            f"; judged on ‖g‖/‖w‖ / layer scale mean |γ| {l['gate_scale']:.2g}" if l.get("gate_scale") else "")
    for l in layers:
        del l["idle"], l["relative"], l["peer_count"], l["signal"]
    return reference


def summarize_layers(names: list[str], per_step: list[dict], numels: dict[str, int], types: dict[str, str],
                     param_names: dict[str, list[str]], gates: dict[str, float], losses: list,
                     phase: str = PHASE_INIT) -> tuple:
    """Per-step and per-layer gradient statistics, each layer classified (``judge_layers``).

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
                       "numel": numels[name], "dense": 0}
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
                "_dense": acc.get("dense"),  # None: not counted (an attached run)
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
            "weight_norm": weight_norm(per_step, name),
            "reached": any(r["_dense"] for r in all_rows),
        })
    for l in layers:
        l["kind"] = layer_kind(l["layer"], l["type"], l["param_names"])
        l["gate_scale"] = None if l["kind"] == KIND_LAYER_SCALE else gate_for(l["layer"], gates)
    judge_layers(layers, phase)
    for r in steps_table:
        del r["_dense"]
    for l in layers:
        del l["reached"]
    largest = max((l["grad_norm_mean"] for l in layers), default=0.0)
    for l in layers:
        l["grad_norm_relative"] = l["grad_norm_mean"] / largest if largest > 0 else None
    return steps_table, layers, global_norms
