"""The torch.compile explorer: graph breaks with their source lines, graphs, recompiles, compile time,
and eager vs compiled time measured interleaved (job.py); its result and its partial result (Dynamo's
findings first) are typed in result.py."""

from diagnostics.analyses.compile.result import CompilePartial, CompileResult
from diagnostics.declare import Analysis, Option

MODES = ("default", "reduce-overhead", "max-autotune")
BACKENDS = ("inductor", "aot_eager", "eager")

ANALYSIS = Analysis(
    name="compile", title="torch.compile explorer", target="diagnostics.analyses.compile.job:analyze",
    command="compile", exclusive=True, timeout_s=900, result=CompileResult, partial=CompilePartial,
    view="ui.views.compile:show",
    report="diagnostics.render.charts.compile:compile_sections",
    partial_text="diagnostics.render.charts.compile:dynamo_lines",
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
)
