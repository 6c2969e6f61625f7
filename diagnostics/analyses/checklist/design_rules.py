"""The checklist's model-design rules: hidden activations, layer widths, weight init, Dropout / BatchNorm
mode, gradients (finite, flowing), dead ReLU units, redundant layers. Each ``rule(facts) -> Finding``;
``rules.RULES`` lists them with the rest.
"""

from __future__ import annotations

from diagnostics.analyses.checklist.records import GradientFacts
from diagnostics.analyses.checklist.rule_form import got, measured, na, pct
from diagnostics.analyses.checklist.thresholds import (DEAD_UNIT_FRACTION_MAX, EXPLODING_NORM, INIT_GAIN_MAX,
                                                       INIT_GAIN_MIN, INIT_GAIN_MIN_NORMED, PEER_VANISHING_RATIO,
                                                       VANISHING_RATIO, WIDTH_MULTIPLE)
from diagnostics.measure.gradient_health import MIN_UNIT_OBSERVATIONS

def check_hidden_activations(f):
    fw = f.forward
    if fw is None:
        return na("the forward pass could not be traced")
    hidden = fw.hidden_saturating
    acts = f.static.activations
    if not acts:
        return na("no activation modules (functional activations are not inspected)")
    nums = {"hidden_saturating": len(hidden), "activation_modules": sum(acts.values())}
    if hidden:
        return ("warn", f"{len(hidden)} Sigmoid/Tanh activations in hidden layers ({', '.join(hidden[:4])})",
                "Sigmoid and tanh saturate (gradients vanish in deep stacks) and cost more than ReLU / GELU / SiLU: "
                "use those for hidden layers.", nums)
    pooler = fw.pooler_saturating
    return ("pass", "hidden activations: " + ", ".join(f"{k} x{v}" for k, v in acts.items())
            + (f"; the Tanh/Sigmoid of the pooler ({', '.join(pooler[:2])}) is the pretrained recipe's, left alone"
               if pooler else ""), "", nums)


def check_layer_widths(f):
    fw = f.forward
    if fw is None or not fw.inner_dims:
        return na("no inner Linear / Conv / Embedding widths")
    off = fw.widths_not_multiple_of_8
    n = fw.inner_dims
    nums = {"inner_dims": n, "not_multiple": len(off), "multiple": WIDTH_MULTIPLE}
    if off:
        ex = ", ".join(f"{o.name}.{o.side}={o.dim}" for o in off[:4])
        status = "fail" if len(off) > n / 2 else "warn"
        return (status, f"{len(off)} of {n} inner widths are not multiples of {WIDTH_MULTIPLE} ({ex})",
                f"Pad hidden sizes / channels to multiples of {WIDTH_MULTIPLE} (64 for best GPU efficiency): Tensor "
                "Cores and vector units work on such tiles.", nums)
    return "pass", f"all {n} inner widths are multiples of {WIDTH_MULTIPLE}", "", nums


#: Init scales that are an architecture's convention, not a mistake (``structure.init_role``), and why.
INIT_CONVENTIONS = {
    "zero-initialised": "zero-initialised, as a residual branch's last projection is on purpose (ReZero, "
                        "adaLN-Zero, zero-init-residual ResNets: the block starts as the identity; the gradient-flow "
                        "check tells whether gradient reaches it)",
    "vocabulary head": "a vocabulary (LM) head, whose scale is the architecture's choice: T5 draws it (and its "
                       "embedding, when tied) from N(0, 1) on purpose, rescaling the decoder's output by "
                       "d_model^-0.5 when tied",
}


def check_init(f):
    init = f.static.init
    if not init:
        return na("no Linear / Conv weights")
    normed = bool(f.static.n_norm)
    low = INIT_GAIN_MIN_NORMED if normed else INIT_GAIN_MIN
    # a convention is judged as one, unless every layer is zero: then nothing breaks the symmetry
    conventional = [r for r in init if got(r.role) in INIT_CONVENTIONS]
    if conventional and all(got(r.role) == "zero-initialised" for r in init):
        conventional = []
    judged = [r for r in init if r not in conventional]
    bad = [r for r in judged if not (low <= r.gain <= INIT_GAIN_MAX)]
    gains = [r.gain for r in judged] or [r.gain for r in init]
    nums = {"layers": len(init), "outside": len(bad), "min_gain": min(gains), "max_gain": max(gains), "low": low,
            "conventions": len(conventional)}
    why_low = (f" (lower bound {low}: the model has {f.static.n_norm} normalisation layers, which restore the "
               "scale; small inits such as transformers' normal(0, 0.02) are by design)") if normed else ""
    by_role: dict[str, list] = {}
    for r in conventional:
        by_role.setdefault(r.role, []).append(r)
    also = ""
    for role, rows in by_role.items():
        shown = ", ".join(f"{r.name} ({r.gain:.2f})" for r in rows[:3])
        more = f" and {len(rows) - 3} more" if len(rows) > 3 else ""
        also += f"; by convention, not judged: {shown}{more}: {INIT_CONVENTIONS[role]}"
    if bad:
        ex = ", ".join(f"{r.name} ({r.gain:.2f})" for r in bad[:4])
        return ("warn", f"{len(bad)} of {len(judged)} layers have weight std x sqrt(fan_in) outside "
                f"[{low}, {INIT_GAIN_MAX}]: {ex}{why_low}{also}", "Initialise with Kaiming (ReLU) or Xavier "
                "(tanh/sigmoid) so activations keep their scale through depth.", nums)
    return ("pass", f"weight scale std x sqrt(fan_in) in [{min(gains):.2f}, {max(gains):.2f}] for {len(judged)} layers"
            + why_low + also, "", nums)


def check_dropout_bn_mode(f):
    s = f.static
    if not (s.n_dropout or s.n_batchnorm):
        return na("no Dropout or BatchNorm layers")
    purpose, tr, ev_ = f.purpose, s.dropout_bn_train, s.dropout_bn_eval
    nums = {"in_train_mode": len(tr), "in_eval_mode": len(ev_)}
    if purpose == "inference" and tr:
        return ("fail", f"for inference, {len(tr)} Dropout/BatchNorm layers are in training mode ({', '.join(tr[:4])})",
                "Call model.eval() before inference: Dropout drops activations and BatchNorm uses batch statistics "
                "in training mode.", nums)
    if purpose == "training" and s.training and ev_:
        return ("warn", f"the model is in training mode but {len(ev_)} Dropout/BatchNorm layers are in eval mode "
                f"({', '.join(ev_[:4])})", "Check this is intended (frozen BatchNorm); otherwise call model.train().", nums)
    if purpose == "training" and not s.training:
        return ("warn", "for training, the model is in eval mode: Dropout is off and BatchNorm statistics are frozen",
                "Call model.train() before training steps.", nums)
    return "pass", f"all Dropout/BatchNorm layers are in {'eval' if purpose == 'inference' else 'training'} mode", "", nums


def _grad_examples(g: GradientFacts, status: str) -> str:
    rows = [r for r in g.flagged if r.status == status][:3]
    return "; ".join(f"{r.layer}: {r.reason}" for r in rows)


def check_gradients_nonfinite(f):
    g = got(measured(f).gradients)
    if g is None:
        return na("gradients were not measured (no trainable parameters or backward failed)")
    n = g.nonfinite
    if n:
        return ("fail", f"{n} of {g.layers} layers got NaN/Inf gradients ({_grad_examples(g, 'non-finite')})",
                "Look for log(0), division by zero or overflow (fp16 without a GradScaler); lower the learning "
                "rate; clip gradients.", {"nonfinite_layers": n, "layers": g.layers})
    return "pass", f"gradients of all {g.layers} layers are finite", "", {"nonfinite_layers": 0}


def check_gradient_flow(f):
    g = got(measured(f).gradients)
    if g is None or not g.layers:
        return na("gradients were not measured")
    status, evidence, suggestion, nums = _gradient_flow(g)
    if g.loss_stand_in and status == "fail":
        # no loss was declared: a stand-in loss drives these gradients, so the verdict is low-confidence
        return ("warn", evidence + f" (measured with a stand-in loss, {g.loss}: low confidence)",
                "Declare loss_fn(output) in the model file and run again; " + suggestion, nums)
    return status, evidence, suggestion, nums


def _gradient_flow(g: GradientFacts):
    nums = {"vanishing": g.vanishing, "exploding": g.exploding, "dead": g.dead,
            "global_norm_max": g.global_norm_max, "min_ratio": g.min_ratio, "layers": g.layers}
    if g.exploding:
        return ("fail", f"exploding gradients in {g.exploding} of {g.layers} layers (norm > "
                f"{EXPLODING_NORM:g}): {_grad_examples(g, 'exploding')}", "Fix the init scale, add normalisation, "
                "lower the learning rate, clip gradients (torch.nn.utils.clip_grad_norm_).", nums)
    if g.vanishing:
        over = f" over {g.steps} steps" if got(g.steps) else ""
        phase = f", {g.phase}" if got(g.phase) else ""
        return ("fail", f"vanishing gradients in {g.vanishing} of {g.layers} layers{over}{phase} (relative "
                f"gradient ‖g‖/‖w‖ < {VANISHING_RATIO:g} x the model's reference, or < {PEER_VANISHING_RATIO:g} x its "
                f"peers' at other depths; layers small by design by their kind's allowance): "
                f"{_grad_examples(g, 'vanishing')}",
                "Use ReLU-family activations, residual connections, normalisation layers and Kaiming init.", nums)
    if g.dead:
        return ("warn", f"{g.dead} layers get all-zero gradients: {_grad_examples(g, 'dead')}",
                "Check for dead ReLUs or detached branches.", nums)
    ratio = g.min_ratio
    return ("pass", f"all {g.layers} layers healthy; max gradient norm {g.global_norm_max:.3g}, smallest "
            f"layer norm {'n/a' if ratio is None else f'{ratio:.2g}'} x the largest", "", nums)


def check_dead_units(f):
    fw = f.forward
    units = fw.relu_units if fw else 0
    if not units:
        if fw and fw.relu_modules:
            return na(f"the batch is too small to judge ReLU units (a unit needs {MIN_UNIT_OBSERVATIONS} values "
                      "per pass, samples × positions): raise the batch size")
        return na("no ReLU modules")
    dead = fw.dead_relu_units
    frac = dead / units
    nums = {"dead": dead, "units": units, "fraction": frac}
    ev = f"{dead} of {units} ReLU units output zero for the whole batch ({pct(frac)}, max {pct(DEAD_UNIT_FRACTION_MAX)})"
    if frac > DEAD_UNIT_FRACTION_MAX:
        return "warn", ev, "Dead ReLUs learn nothing: lower the learning rate, fix the init, or use LeakyReLU / GELU.", nums
    return "pass", ev, "", nums


def check_redundant_layers(f):
    fw = f.forward
    if fw is None:
        return na("the forward pass could not be traced")
    p0 = f.static.dropout_p0
    pairs = fw.redundant_layers
    items = [f"{' -> '.join(r.layers)} ({r.why})" for r in pairs]
    nums = {"dropout_p0": len(p0), "redundant_pairs": len(pairs)}
    # Dropout(p=0) is an identity a config switched off (transformers' *_dropout_prob = 0): harmless, said only
    p0_note = (f"; {len(p0)} Dropout(p=0) ({', '.join(p0[:3])}) are identities, harmless" if p0 else "")
    if items:
        return ("warn", f"{len(items)} layers add nothing: " + "; ".join(items[:4]) + ("; ..." if len(items) > 4 else "")
                + p0_note, "Remove repeated activations and a BatchNorm that another BatchNorm follows; merge two "
                "Linear layers with no nonlinearity between into one (W2 W1, W2 b1 + b2), or put the activation you "
                "meant between them.", nums)
    return ("pass", "no Linear -> Linear without a nonlinearity, repeated activation or BatchNorm straight after "
            "BatchNorm" + p0_note, "", nums)
