"""Attach mode: the user's own training script, run unmodified under ``python -m diagnostics run --
COMMAND`` (diagnostics.attach starts it with a bootstrap on PYTHONPATH); this analysis reads the run
folder the bootstrap wrote (protocol.py) into the result (result.py, job.py) and its findings
(rules.py). Re-running it on a stored run folder gives the same result."""

from diagnostics.analyses.attach.result import AttachResult
from diagnostics.declare import Analysis, Option

DEFAULT_STEPS = 5

ANALYSIS = Analysis(
    name="attach", title="Run a script", target="diagnostics.analyses.attach.job:analyze", needs_model=False,
    result=AttachResult, view="ui.views.attach:show",
    report="diagnostics.render.charts.attach:attach_sections", timeout_s=300,
    description="your own training script, unmodified, profiled while it runs (python -m diagnostics run -- ...)",
    options=(
        Option("run_dir", "path", None, "the run folder the bootstrap wrote", required=True, flag=""),
        Option("command", "list", [], "the command that ran (for the record)", flag=""),
        Option("cwd", "path", None, "its working folder (for the record)", optional=True, flag=""),
        Option("steps", "int", DEFAULT_STEPS, "profiled steps", lo=1, hi=1000, flag=""),
        Option("at", "int", None, "the first profiled step (auto: after warm-up)", lo=2, optional=True, flag=""),
        Option("exit_code", "int", None, "the script's exit code", optional=True, flag=""),
    ),
)
