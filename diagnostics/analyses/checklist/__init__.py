"""The optimization checklist: facts about the model (facts.py), rules over them (rules.py), a
score, and reports (job.py)."""

from diagnostics.declare import Analysis, Metric, Option, OptionError, Table

PURPOSES = ("training", "inference")
LOADER_KEYS = ("batch_size", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
#: How the score is computed, in words (the page, the reports and the docs show this sentence).
SCORE_FORMULA = ("Score = 100 x (pass + 0.5 x warn) / (pass + warn + fail + rule errors); rules that do not "
                 "apply do not count, and a rule that crashed counts as failed.")


def check_dataloader(dl: dict) -> dict:
    """A DataLoader description: only its known keys, counts as non-negative integers."""
    unknown = [k for k in dl if k not in LOADER_KEYS]
    if unknown:
        raise OptionError(f"option dataloader: unknown key{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(map(repr, unknown))}; known: {', '.join(LOADER_KEYS)}")
    for key in ("batch_size", "num_workers", "prefetch_factor"):
        v = dl.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "num_workers" else 1)):
            raise OptionError(f"option dataloader: {key} must be "
                              f"{'an integer >= 0' if key == 'num_workers' else 'a positive integer'}, got {v!r}")
    return dl


ANALYSIS = Analysis(
    name="checklist", title="Optimization checklist", target="diagnostics.analyses.checklist.job:analyze",
    command="checklist", exclusive=True, timeout_s=600, view="ui.views.checklist:show",
    report="diagnostics.render.charts.checklist:checklist_sections",
    description="rules that measure the model and say what to change, with a score",
    options=(
        Option("purpose", "choice", "training", "what the model is for: decides which mode Dropout and BatchNorm "
               "should be in", choices=PURPOSES),
        Option("iters", "int", 5, "timed repetitions of each timed probe", lo=1, hi=100, label="Timed repetitions"),
        Option("profile_steps", "int", 2, "profiled training steps", lo=1, hi=20),
        Option("dataloader", "dict", None, "your DataLoader's settings (batch_size, num_workers, pin_memory, "
               "prefetch_factor, persistent_workers): feeds the data-pipeline rules", flag="",
               check=check_dataloader),
        Option("dataset_path", "path", None, "a Python file defining build_dataset(), to time the DataLoader "
               "(refused in server-safe mode)", flag=""),
        Option("skip_measured", "bool", False, "static facts only: nothing is timed or profiled", flag=""),
    ),
    metrics=(
        Metric("score", "score", "Score", SCORE_FORMULA, better="higher"),
        Metric("pass", "count", "Passed", better="higher"),
        Metric("warn", "count", "Warnings", better="lower"),
        Metric("fail", "count", "Failed", better="lower"),
        Metric("error", "count", "Rule errors", "rules that crashed (counted as failed)", better="lower"),
        Metric("not_applicable", "count", "Not applicable"),
        Metric("applicable", "count", "Applicable rules"),
    ),
    tables=(Table("findings", "Findings"), Table("thresholds", "Thresholds")),
)
