"""Optimize's result, typed (diagnostics.results: one serialisation for the worker, the store, --json and
result.json), and its partial result (the rows known while the job runs: ctx.partial). No torch.

A trial's row holds what the trial measured: built and checked (first call, peak memory, size, fidelity,
artifact), then timed (the interleaved rounds' figures, speed-up with its interval and verdict), then
assessed (assess.py: ``flag`` and ``assessment``). Rows of fixes that did not run keep their figures None and
say ``why``. ``cv`` and ``decided_at`` are written on timed rows only, ``measuring`` on a partial result's
rows still being timed. Runs stored before the best fix's interval and the rounds' end were kept
(``best_speedup_ci_*``, ``timing_stop``) read back with those unset.
"""

from __future__ import annotations

from typing import Annotated, Any

from diagnostics.declare import column, metric, table
from diagnostics.results import UNSET, Disturbance, Record, Result, UnsetType


class Artifact(Record, frozen=True, kw_only=True):
    """The optimized model kept for download: its file (``kind``: torchscript, state_dict, onnx, pt2) and the
    recipe that reproduces it; why it is not TorchScript, where it fell back to a state_dict; an ONNX model's
    side file of weights; the keyword inputs a TorchScript archive takes by position."""

    kind: str
    path: str
    recipe: str
    why_not_torchscript: str | None | UnsetType = UNSET
    data_path: str | UnsetType = UNSET
    inputs_by_position: tuple[str, ...] | UnsetType = UNSET


class TrialRow(Record, frozen=True, kw_only=True):
    """One candidate: the baseline, the A/A control (the baseline timed as if it were a fix) or a fix."""

    fix: str
    title: str
    #: ok, not_applicable or failed (``why`` says why); a partial result's fix not built yet: waiting
    status: str
    why: str | None
    notes: tuple[str, ...]
    params: dict[str, Any]
    median_ms: Annotated[float | None, column("ms", "median")]
    p90_ms: Annotated[float | None, column("ms", "p90")]
    throughput_per_s: Annotated[float | None, column("per_s", "throughput")]
    first_call_ms: Annotated[float | None, column("ms", "first call")]
    peak_bytes: Annotated[int | None, column("bytes", "peak")]
    size_bytes: Annotated[int | None, column("bytes", "size")]
    size_kind: str | None
    speedup: Annotated[float | None, column("ratio", "speed-up")]
    size_ratio: Annotated[float | None, column("ratio", "size ratio")]
    max_abs_err: Annotated[float | None, column("number", "max abs error")]
    rel_err: Annotated[float | None, column("number", "relative error")]
    cosine: Annotated[float | None, column("number", "cosine")]
    top1_agreement: Annotated[float | None, column("fraction", "top-1 agreement")]
    artifact: Artifact | None
    #: the speed-up's 95% interval (None: fewer rounds than an interval needs, or not timed)
    speedup_ci: tuple[float, float] | None
    verdict: Annotated[str | None, column("text", "verdict (faster / slower / within noise)")]
    #: "low" when the machine was busy or the A/A control read anything but within noise
    confidence: str | None
    time_ms: Annotated[float | None, column("ms", "time (geometric mean of the rounds: speed-up = the baseline's "
                                                  "over this)")]
    rounds: int | None
    #: training mode: the loss after each fidelity step, its largest relative difference from the baseline's,
    #: the gradients' cosine after the first step
    losses: tuple[float, ...] | None
    loss_rel_diff: Annotated[float | None, column("number", "loss difference (relative, largest)")]
    grad_cosine: Annotated[float | None, column("number", "gradient cosine (first step)")]
    cv: float | None | UnsetType = UNSET
    decided_at: int | None | UnsetType = UNSET
    #: assess.py's: gain, trade_off, regression, fidelity_loss or neutral (None: the baseline, the control and
    #: rows that did not run), and its reasons with their numbers
    flag: Annotated[str | None, column("text", "assessment (gain / trade-off / regression / fidelity loss)")]
    assessment: tuple[str, ...]
    #: a partial result's row still being timed: at which round it is ("round 7")
    measuring: str | UnsetType = UNSET


class TimingStop(Record, frozen=True, kw_only=True):
    """How the timed rounds ended (measure.compare.Stop): ``reason`` None (every planned round ran), decided
    (every verdict decided at an interim look) or budget (the time budget spent)."""

    planned: int
    run: int
    reason: str | None
    looks: tuple[int, ...]
    budget_s: float | None


class OptimizeMetrics(Record, frozen=True, kw_only=True):
    baseline_median_ms: Annotated[float, metric("ms", "Baseline latency (median; a training step in training mode)")]
    baseline_size_bytes: Annotated[int, metric("bytes", "Baseline size")]
    baseline_peak_bytes: Annotated[int | None, metric("bytes", "Baseline peak memory")]
    best_fix: Annotated[str | None, metric("text", "Best fix (faster beyond the noise, fidelity kept)")]
    best_speedup: Annotated[float | None, metric("ratio", "Best speed-up",
                                                 interval=("best_speedup_ci_low", "best_speedup_ci_high"))]
    best_speedup_ci_low: Annotated[float | None | UnsetType, metric("ratio", "Best speed-up interval, low")] = UNSET
    best_speedup_ci_high: Annotated[float | None | UnsetType, metric("ratio", "Best speed-up interval, high")] = UNSET
    control_speedup: Annotated[float | None, metric("ratio", "A/A control (noise floor)",
                                                    interval=("control_ci_low", "control_ci_high"),
                                                    verdict="control_verdict")]
    control_ci_low: Annotated[float | None, metric("ratio", "A/A control interval, low")]
    control_ci_high: Annotated[float | None, metric("ratio", "A/A control interval, high")]
    control_verdict: Annotated[str | None, metric(
        "text", "A/A control verdict (within noise when the measurement is sound)")]
    fixes_faster: Annotated[int, metric("count", "Fixes faster beyond the noise")]
    fixes_slower: Annotated[int, metric("count", "Fixes slower beyond the noise")]
    fixes_fidelity_loss: Annotated[int, metric("count", "Fixes losing fidelity (below the thresholds)")]
    trials_ok: Annotated[int, metric("count", "Trials run")]
    trials_failed: Annotated[int, metric("count", "Trials failed")]
    trials_not_applicable: Annotated[int, metric("count", "Trials not applicable")]
    threads: Annotated[int, metric("count", "Torch threads (every candidate)")]


class OptimizeResult(Result, frozen=True, kw_only=True):
    model: str
    device: str
    batch_size: int | None
    #: what the loader made of the model's outputs (classification, lm, ...): top-1 agreement is read for those
    task: str
    #: the timed rounds asked for (``timing_stop``: how many ran)
    iters: int
    mode: str
    #: training mode: the loss, the optimizer and the fidelity steps (None in inference mode)
    loss: str | None
    optimizer: str | None
    train_steps: int | None
    threads: int
    #: baseline first, the A/A control second, then one row per fix in the order asked
    rows: Annotated[tuple[TrialRow, ...], table("Trials")]
    #: what the machine did while the trials were timed (measure.disturbance)
    timing_disturbance: Disturbance
    timing_cv: float | None
    metrics: OptimizeMetrics
    notes: tuple[str, ...]
    timing_stop: TimingStop | UnsetType = UNSET


class OptimizePartial(Record, frozen=True, kw_only=True):
    """What the job reports while it runs: the rows known so far (each fix's once built and checked, then the
    timed rows while the rounds run), the fixes asked for and what it is doing (``stage``)."""

    model: str
    mode: str
    iters: int
    stage: str
    fixes: tuple[str, ...]
    rows: tuple[TrialRow, ...]
