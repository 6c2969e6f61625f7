"""A fix trial's result, typed (diagnostics.results: one serialisation for the store, --json and History).
No torch.

One row per candidate: the baseline, the A/A ``control`` (the baseline run again as if it were a fix) and
each fix asked for; ``combination``: the fixes found faster, tried together at the end (None when fewer than
two were). A fix that could not act on the script is ``applicable`` False with its ``reason``; one whose runs
crashed has ``verdict`` "failed" and the script's message in ``reason``; one whose losses became non-finite
where the baseline's were finite, "diverged".
"""

from __future__ import annotations

from typing import Annotated

from diagnostics.declare import column, metric, table
from diagnostics.results import Record, Result

#: A row's verdict: measured ones (measure.compare.VERDICTS), else why it has none.
VERDICTS = ("faster", "slower", "within noise", "not applicable", "failed", "diverged", "stopped")


class FixTrial(Record, frozen=True, kw_only=True):
    fix: str
    title: str
    applicable: bool | None
    reason: str | None
    verdict: Annotated[str | None, column("text", "verdict")]
    speedup: Annotated[float | None, column("ratio", "speed-up")]
    speedup_ci: tuple[float, float] | None
    step_ms: Annotated[float | None, column("ms", "step (geometric mean of the runs)")]
    peak_bytes: Annotated[int | None, column("bytes", "peak memory")]
    loss_max_rel_diff: Annotated[float | None, column("number", "loss difference (relative, largest)")]
    grad_norm_max_rel_diff: Annotated[float | None, column("number", "gradient norm difference (relative, largest)")]
    warmup_extra_ms: Annotated[float | None, column("ms", "warm-up beyond the baseline's (compile)")]
    rounds: int
    round_ms: tuple[float | None, ...]
    losses: tuple[float, ...] | None
    grad_norms: tuple[float, ...] | None
    #: the change to make in the script, pointing at its line (a fix that acted)
    change: str | None


class TrialsMetrics(Record, frozen=True, kw_only=True):
    baseline_step_ms: Annotated[float | None, metric("ms", "Baseline step (the script as it is)")]
    best_fix: Annotated[str | None, metric("text", "Best fix (faster beyond the noise)")]
    best_speedup: Annotated[float | None, metric("ratio", "Best speed-up", interval=("best_ci_low", "best_ci_high"))]
    best_ci_low: Annotated[float | None, metric("ratio", "Best speed-up interval, low")]
    best_ci_high: Annotated[float | None, metric("ratio", "Best speed-up interval, high")]
    control_speedup: Annotated[float | None, metric("ratio", "A/A control (noise floor)",
                                                    interval=("control_ci_low", "control_ci_high"),
                                                    verdict="control_verdict")]
    control_ci_low: Annotated[float | None, metric("ratio", "A/A control interval, low")]
    control_ci_high: Annotated[float | None, metric("ratio", "A/A control interval, high")]
    control_verdict: Annotated[str | None, metric("text", "A/A control verdict (within noise when the measurement "
                                                          "is sound)")]
    fixes_faster: Annotated[int, metric("count", "Fixes faster beyond the noise")]
    fixes_slower: Annotated[int, metric("count", "Fixes slower beyond the noise")]
    fixes_not_applicable: Annotated[int, metric("count", "Fixes not applicable")]
    fixes_failed: Annotated[int, metric("count", "Fixes failed or diverged")]
    runs: Annotated[int, metric("count", "Runs of the script")]


class TrialsResult(Result, frozen=True, kw_only=True):
    command: tuple[str, ...]
    cwd: str
    fixes: tuple[str, ...]
    #: ok; stopped (Stop, Ctrl-C, --timeout: what was measured is kept); failed (the baseline itself failed)
    status: str
    steps: int
    warmup: int
    rounds: int
    device: str | None
    #: the baseline, the A/A control, then each fix in the order asked
    trials: Annotated[tuple[FixTrial, ...], table("Trials")]
    combination: FixTrial | None
    #: for each faster fix (and the combination), the change to make in the script
    changes: tuple[str, ...]
    method: str
    metrics: TrialsMetrics
    notes: tuple[str, ...]
    folder: str
