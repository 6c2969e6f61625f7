"""The memory analysis: peak memory of inference and of a training step, what holds it, per layer,
over time, and an estimate before running (job.py)."""

from diagnostics.declare import Analysis, Column, Metric, Option, Table
from diagnostics.measure.optimizers import OPTIMIZERS

ANALYSIS = Analysis(
    name="memory", title="Memory", target="diagnostics.analyses.memory.job:analyze", command="memory",
    exclusive=True, timeout_s=600, view="ui.views.memory:show",
    report="diagnostics.render.charts.memory:memory_sections",
    description="peak memory of inference and a training step, what holds it, per layer and over time",
    options=(
        Option("optimizer", "choice", "adamw", "optimizer of the training step: its state counts towards the peak "
               "(SGD with momentum: 1 x the trainable parameters; AdamW: 2 x)", choices=OPTIMIZERS),
        Option("lr", "float", 1e-3, "learning rate", gt=0, label="Learning rate"),
        Option("timeline", "bool", True, "the memory timeline (slower: profiles with shapes and stacks)"),
    ),
    metrics=(
        Metric("peak_train_bytes", "bytes", "Training-step peak", better="lower"),
        Metric("peak_inference_bytes", "bytes", "Inference peak", better="lower"),
        Metric("reserved_train_bytes", "bytes", "Reserved by the CUDA allocator (training)", better="lower"),
        Metric("param_bytes", "bytes", "Parameters", better="lower"),
        Metric("buffer_bytes", "bytes", "Buffers"),
        Metric("grad_bytes", "bytes", "Gradients", better="lower"),
        Metric("optimizer_state_bytes", "bytes", "Optimizer state", better="lower"),
        Metric("static_train_bytes", "bytes", "Weights + gradients + optimizer state",
               "counted without running (a model on the meta device); activations not included", better="lower"),
        Metric("saved_activation_bytes", "bytes", "Activations saved for backward", better="lower"),
        Metric("input_bytes", "bytes", "Inputs"),
        Metric("estimate_bytes", "bytes", "Estimate before running"),
        Metric("estimate_error_pct", "percent", "Estimate error", "(estimate - measured peak) / measured peak"),
        Metric("workspace_bytes", "bytes", "CUDA workspaces", better="lower"),
        Metric("rss_bytes", "bytes", "Worker resident memory", better="lower"),
        Metric("batch_size", "count", "Batch size"),
    ),
    tables=(
        Table("layers", "Activation memory by layer", (Column("output_bytes", "bytes", "output"),
                                                       Column("saved_bytes", "bytes", "saved for backward"))),
        Table("estimate.estimates", "Estimate against the measured peak",
              (Column("bytes", "bytes", "estimate"), Column("error_pct", "percent", "error"))),
    ),
)
