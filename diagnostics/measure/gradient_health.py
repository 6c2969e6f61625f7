"""What counts as a vanishing, exploding or dead layer: the thresholds, their meaning, and
``classify`` (torch-free, so the checklist's rules and the pages read the same constants that
``measure.gradflow`` classifies with)."""

from __future__ import annotations

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

THRESHOLDS = {
    "VANISHING_RATIO": VANISHING_RATIO,
    "VANISHING_NORM": VANISHING_NORM,
    "EXPLODING_NORM": EXPLODING_NORM,
    "DEAD_ZERO_FRACTION": DEAD_ZERO_FRACTION,
    "SATURATION_EPS": SATURATION_EPS,
    "ACTIVATION_FLAG_FRACTION": ACTIVATION_FLAG_FRACTION,
    "MIN_UNIT_OBSERVATIONS": MIN_UNIT_OBSERVATIONS,
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
}
STATUSES = ("healthy", "vanishing", "exploding", "dead", "non-finite")


def classify(layer: dict, largest_norm: float) -> tuple[str, str]:
    """(status, reason) for one layer summary (see the thresholds above).

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
    if norm < VANISHING_NORM:
        return "vanishing", f"gradient norm {norm:.3g} < {VANISHING_NORM:g}"
    if largest_norm > 0 and norm < VANISHING_RATIO * largest_norm:
        return "vanishing", (f"gradient norm {norm:.3g} is {norm / largest_norm:.2g} × the largest layer's "
                             f"({largest_norm:.3g}); < {VANISHING_RATIO:g}")
    return "healthy", ""
