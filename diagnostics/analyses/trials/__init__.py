"""Fix trials on the user's own script (``python -m diagnostics run --try FIX[,FIX...] -- COMMAND``): each
candidate's fixes applied by the trial guest inside the script's process (diagnostics/attach/fixes.py), the
runs timed in interleaved rounds with an A/A control by diagnostics/attach/trials.py, which writes the
trials folder; this analysis reads that folder (job.py) into the result (result.py). Re-running it on a
stored folder gives the same result. No torch here."""

from diagnostics.analyses.trials.result import TrialsResult
from diagnostics.declare import Analysis, Option

DEFAULT_STEPS = 10
DEFAULT_WARMUP = 3
DEFAULT_ROUNDS = 6

ANALYSIS = Analysis(
    name="trials", title="Try fixes on a script", target="diagnostics.analyses.trials.job:analyze",
    needs_model=False, result=TrialsResult, view="ui.views.trials:show",
    report="diagnostics.render.charts.trials:trials_sections", timeout_s=300,
    description="fixes tried on your own training script, each run timed against the bare script with an A/A "
                "control (python -m diagnostics run --try FIX,... -- ...)",
    options=(
        Option("folder", "path", None, "the trials folder diagnostics.attach.trials wrote", required=True, flag=""),
    ),
)
