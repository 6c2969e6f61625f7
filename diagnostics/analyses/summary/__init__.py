"""The model summary: parameters, bytes, output shapes and FLOPs, in total and per layer (job.py)."""

from diagnostics.declare import Analysis, Column, Metric, Option, Table

ANALYSIS = Analysis(
    name="summary", title="Model summary", target="diagnostics.analyses.summary.job:analyze", command="summary",
    view="ui.views.summary:show", report="diagnostics.render.charts.summary:summary_sections",
    description="parameters, bytes, output shapes and FLOPs (forward and backward), in total and per layer",
    options=(
        Option("skip_backward", "bool", False, "count forward FLOPs only (no backward pass)"),
    ),
    metrics=(
        Metric("params_total", "count", "Parameters", "tied weights counted once", better="lower"),
        Metric("params_trainable", "count", "Trainable parameters"),
        Metric("params_frozen", "count", "Frozen parameters"),
        Metric("param_bytes", "bytes", "Parameter memory", better="lower"),
        Metric("buffer_bytes", "bytes", "Buffer memory"),
        Metric("flops_forward", "flop", "FLOPs (forward)", better="lower"),
        Metric("flops_backward", "flop", "FLOPs (backward)"),
        Metric("flops_train_step", "flop", "FLOPs (forward + backward)", better="lower"),
        Metric("flops_forward_per_token", "flop", "FLOPs per token (forward)",
               "forward FLOPs / (batch x sequence length) of the first input; models whose first input is token ids "
               "(encoder-decoders: per encoder token, input_ids)", better="lower"),
        Metric("tied_parameters", "count", "Tied parameters"),
        Metric("batch_size", "count", "Batch size"),
    ),
    tables=(
        Table("layers", "Layers", (Column("params", "count", "parameters"), Column("trainable", "count", "trainable"),
                                   Column("pct_of_total", "percent", "share of parameters"),
                                   Column("flops_forward", "flop", "FLOPs forward"),
                                   Column("flops_backward", "flop", "FLOPs backward"))),
    ),
)
