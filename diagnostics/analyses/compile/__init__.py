"""The torch.compile explorer: graph breaks with their source lines, graphs, recompiles, compile time,
and eager vs compiled time measured interleaved (job.py)."""

from diagnostics.declare import Analysis, Column, Metric, Option, Table

MODES = ("default", "reduce-overhead", "max-autotune")
BACKENDS = ("inductor", "aot_eager", "eager")

ANALYSIS = Analysis(
    name="compile", title="torch.compile explorer", target="diagnostics.analyses.compile.job:analyze",
    command="compile", exclusive=True, timeout_s=900, view="ui.views.compile:show",
    report="diagnostics.render.charts.compile:compile_sections",
    description="graph breaks (reason, file:line, fix), graphs, recompiles, compile time, eager vs compiled",
    options=(
        Option("backend", "choice", "inductor", "torch.compile backend (aot_eager / eager: diagnose without "
               "code generation)", choices=BACKENDS),
        Option("mode", "choice", "default", "torch.compile mode", choices=MODES),
        Option("dynamic", "choice", "auto", "dynamic shapes: auto (Dynamo decides), static, dynamic",
               choices=("auto", "static", "dynamic")),
        Option("fullgraph", "bool", True, "also compile with fullgraph=True, which names the first break"),
        Option("recompile_probe", "bool", True, "call the compiled model once more at twice the batch, to show "
               "the recompiles a new input shape causes"),
        Option("train", "bool", False, "also compare a training step (forward + backward), eager vs compiled"),
        Option("rounds", "int", 10, "interleaved timing rounds, eager vs compiled and an A/A control (each times every "
               "call twice, in a fresh random order and its reverse); a 95% interval and a verdict need at least 6",
               lo=1, hi=1000),
        Option("warmup", "int", 2, "untimed calls of each before timing (after the first, compiling, call)",
               lo=0, hi=100),
    ),
    metrics=(
        Metric("graph_count", "count", "Graphs", "as Dynamo counts them (torch._dynamo.explain)"),
        Metric("graph_break_count", "count", "Graph breaks"),
        Metric("break_sites", "count", "Break sites", "distinct reason and source line"),
        Metric("op_count", "count", "Ops captured"),
        Metric("recompiles", "count", "Recompiles"),
        Metric("fullgraph_ok", "bool", "Compiles with fullgraph=True"),
        Metric("compile_time_s", "s", "Compile time", "Dynamo + backend, all frames of the first call"),
        Metric("first_call_ms", "ms", "First compiled call"),
        Metric("eager_ms", "ms", "Eager (time per call)", "geometric mean of the interleaved rounds' times"),
        Metric("compiled_ms", "ms", "Compiled (time per call)", "geometric mean of the interleaved rounds' times"),
        Metric("speedup", "ratio", "Compiled speed-up", "eager time / compiled time: the geometric mean of the "
               "interleaved rounds' ratios", interval=("speedup_ci_low", "speedup_ci_high"), verdict="verdict"),
        Metric("speedup_ci_low", "ratio", "Speed-up interval, low"),
        Metric("speedup_ci_high", "ratio", "Speed-up interval, high"),
        Metric("verdict", "text", "Verdict"),
        Metric("train_speedup", "ratio", "Training-step speed-up",
               interval=("train_speedup_ci_low", "train_speedup_ci_high"), verdict="train_verdict"),
        Metric("train_speedup_ci_low", "ratio", "Training-step speed-up interval, low"),
        Metric("train_speedup_ci_high", "ratio", "Training-step speed-up interval, high"),
        Metric("train_verdict", "text", "Training-step verdict"),
        Metric("generated_kernels", "count", "Generated kernels", "inductor only"),
    ),
    tables=(
        Table("graph_breaks", "Graph breaks", (Column("location", "text", "file:line"),
                                               Column("count", "count", "times hit"))),
        Table("graphs", "Graphs", (Column("ops", "count", "ops"),)),
        Table("recompiles", "Recompiles", ()),
        Table("compile_frames", "Compile time per frame", (Column("seconds", "s", "compile time"),)),
    ),
)
