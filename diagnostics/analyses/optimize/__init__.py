"""The optimize analysis: the baseline and each chosen fix as trials, measured in the same job
(job.py, trials.py); the fixes are declared in catalog.py and applied by fixes.py."""

from diagnostics.analyses.optimize.catalog import all_fix_ids, check_params
from diagnostics.measure.optimizers import OPTIMIZERS
from diagnostics.declare import Analysis, Column, Metric, Option, Table

ANALYSIS = Analysis(
    name="optimize", title="One-click fixes (trials)", target="diagnostics.analyses.optimize.job:analyze",
    command="optimize", exclusive=True, timeout_s=600, view="ui.views.optimize:show",
    report="diagnostics.render.charts.optimize:optimize_sections",
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
    metrics=(
        Metric("baseline_median_ms", "ms", "Baseline latency (median; a training step in training mode)"),
        Metric("baseline_size_bytes", "bytes", "Baseline size"),
        Metric("baseline_peak_bytes", "bytes", "Baseline peak memory"),
        Metric("best_fix", "text", "Best fix (faster beyond the noise, fidelity kept)"),
        Metric("best_speedup", "ratio", "Best speed-up", interval=("best_speedup_ci_low", "best_speedup_ci_high")),
        Metric("best_speedup_ci_low", "ratio", "Best speed-up interval, low"),
        Metric("best_speedup_ci_high", "ratio", "Best speed-up interval, high"),
        Metric("control_speedup", "ratio", "A/A control (noise floor)", interval=("control_ci_low", "control_ci_high"),
               verdict="control_verdict"),
        Metric("control_ci_low", "ratio", "A/A control interval, low"),
        Metric("control_ci_high", "ratio", "A/A control interval, high"),
        Metric("control_verdict", "text", "A/A control verdict (within noise when the measurement is sound)"),
        Metric("fixes_faster", "count", "Fixes faster beyond the noise"),
        Metric("fixes_slower", "count", "Fixes slower beyond the noise"),
        Metric("fixes_fidelity_loss", "count", "Fixes losing fidelity (below the thresholds)"),
        Metric("threads", "count", "Torch threads (every candidate)"),
        Metric("trials_ok", "count", "Trials run"),
        Metric("trials_failed", "count", "Trials failed"),
        Metric("trials_not_applicable", "count", "Trials not applicable"),
    ),
    tables=(
        Table("rows", "Trials", (Column("median_ms", "ms", "median"), Column("p90_ms", "ms", "p90"),
                                 Column("throughput_per_s", "per_s", "throughput"),
                                 Column("first_call_ms", "ms", "first call"), Column("peak_bytes", "bytes", "peak"),
                                 Column("size_bytes", "bytes", "size"),
                                 Column("time_ms", "ms", "time (geometric mean of the rounds: speed-up = the "
                                        "baseline's over this)"),
                                 Column("speedup", "ratio", "speed-up"),
                                 Column("verdict", "text", "verdict (faster / slower / within noise)"),
                                 Column("size_ratio", "ratio", "size ratio"),
                                 Column("max_abs_err", "number", "max abs error"),
                                 Column("rel_err", "number", "relative error"), Column("cosine", "number", "cosine"),
                                 Column("top1_agreement", "fraction", "top-1 agreement"),
                                 Column("loss_rel_diff", "number", "loss difference (relative, largest)"),
                                 Column("grad_cosine", "number", "gradient cosine (first step)"),
                                 Column("flag", "text", "assessment (gain / trade-off / regression / fidelity loss)"))),
    ),
)
