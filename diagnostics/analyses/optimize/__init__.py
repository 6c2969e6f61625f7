"""The optimize analysis: the baseline and each chosen fix as trials, measured in the same job
(job.py, trials.py); the fixes are declared in catalog.py and applied by fixes.py; its result and its
partial result (the rows as they come) are typed in result.py."""

from diagnostics.analyses.optimize.catalog import all_fix_ids, check_params
from diagnostics.measure.optimizers import OPTIMIZERS
from diagnostics.analyses.optimize.result import OptimizePartial, OptimizeResult
from diagnostics.declare import Analysis, Option

ANALYSIS = Analysis(
    name="optimize", title="One-click fixes (trials)", target="diagnostics.analyses.optimize.job:analyze",
    command="optimize", exclusive=True, timeout_s=600, result=OptimizeResult, partial=OptimizePartial,
    view="ui.views.optimize:show",
    report="diagnostics.render.charts.optimize:optimize_sections",
    partial_text="diagnostics.render.charts.optimize:trial_lines",
    description="each fix on a copy of the model, side by side with the baseline: speed, memory, size, fidelity",
    options=(
        Option("mode", "choice", "inference", "inference: the model called under no_grad; train: a whole "
               "training step (forward, loss, backward, optimizer step)", choices=("inference", "train")),
        Option("fixes", "multi", [], "fix ids to try (repeat --fix for several; default: every fix of the mode)",
               choices=tuple(all_fix_ids()), flag="--fix"),
        Option("params", "dict", {}, "per-fix parameters: {fix_id: {param: value}}", flag="", check=check_params),
        Option("iters", "int", 20, "interleaved timing rounds (each times every trial twice, in a fresh random "
               "order and its reverse); a 95% interval and a verdict need at least 6", lo=1, hi=1000),
        Option("warmup", "int", 3, "untimed calls per trial first", lo=0, hi=100),
        Option("early_stop", "bool", True, "stop timing a fix once its verdict is decided at an interim look "
               "(its 99.9% interval and the A/A control's both clear of 1 and of each other; at most 5 looks, the "
               "first after 11 rounds), and the whole comparison once every fix is decided; off: every fix runs "
               "every round"),
        Option("time_budget_s", "float", 0.0, "stop the timed rounds once they took this long (never before 6 "
               "rounds; the rows say how many they had); 0: no budget", lo=0.0, unit="s"),
        Option("optimizer", "choice", "adamw", "training mode: the optimizer of the step",
               choices=tuple(OPTIMIZERS)),
        Option("lr", "float", 1e-3, "training mode: learning rate", gt=0),
        Option("train_steps", "int", 3, "training mode: steps from the same initial state whose losses are "
               "compared with the baseline's", lo=1, hi=100),
        Option("min_cosine", "float", 0.999, "fidelity threshold: a fix whose outputs (or, training, gradients) "
               "have a cosine below this against the baseline's is flagged as losing fidelity", lo=0.0, hi=1.0),
        Option("min_top1", "float", 0.99, "fidelity threshold for classifiers: top-1 agreement below this is "
               "flagged", lo=0.0, hi=1.0),
        Option("save_artifacts", "bool", True, "keep each optimized model (and its recipe) for download", flag=""),
    ),
)
