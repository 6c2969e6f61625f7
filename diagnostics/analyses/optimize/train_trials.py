"""Training-step trials: the baseline's training step and each training fix, measured in one process.

Every candidate starts from the same initial state (a deep copy of the user's model, a fresh
optimizer of the same kind and learning rate, the same random seed) and trains on the same batch:

- fidelity: ``steps`` training steps; the loss after each against the baseline's, the cosine of the
  gradients after the first step against the baseline's (parameter by parameter, in the baseline's
  order), and the trained model's outputs (eval mode) against the trained baseline's;
- peak memory of one more step, measured like the memory analysis's training peak: parameters,
  buffers, inputs and optimizer state resident before the step, plus the step's own allocations
  (gradients and activations);
- time: every candidate's step in the same interleaved rounds (ABBA, ``measure.compare``), with the
  A/A control as the noise floor, and what the machine did meanwhile.

Rows are reported as they come (``report``), as inference trials report theirs (trials.py).
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn

from diagnostics.analyses.optimize.catalog import get_fix
from diagnostics.analyses.optimize.train_fixes import TrainContext, TrainSetup, baseline
from diagnostics.analyses.optimize.trials import (Report, _row, fidelity, fix_rows, serialized_bytes, timing_reporter,
                                                  with_times)
from diagnostics.inputs import call as call_model
from diagnostics.measure.compare import Stop, timed_rounds
from diagnostics.measure.disturbance import assess, watch
from diagnostics.measure.memory import SavedTensorTracker, measure_peak
from diagnostics.tensors import buffer_bytes, optimizer_state_bytes, param_bytes, tensor_bytes
from diagnostics.measure.timer import timed

SEED = 0


def short_error(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"


def grad_vector(params: list) -> torch.Tensor:
    parts = []
    for p in params:
        g = p.grad
        parts.append(torch.zeros(p.numel(), dtype=torch.float64) if g is None
                     else g.detach().reshape(-1).double().cpu())
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float | None:
    if a.numel() != b.numel() or not a.numel():
        return None
    na, nb = a.norm().item(), b.norm().item()
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(a.dot(b).item() / (na * nb))


def train_for(setup: TrainSetup, inputs: tuple, steps: int, device) -> tuple[list[float], torch.Tensor, float]:
    """``steps`` steps; the losses, the gradients after the first step and the first step's seconds."""
    losses, grads, first_ms = [], None, 0.0
    for i in range(steps):
        if i == 0:
            first_ms, loss = timed(lambda: setup.step(inputs=inputs), device)
            grads = grad_vector(setup.params)
        else:
            loss = setup.step(inputs=inputs)
        losses.append(float(loss))
    return losses, grads, first_ms / 1e3


def resident_bytes(setup: TrainSetup, inputs: tuple) -> int:
    """What a step starts with: parameters, buffers, inputs, optimizer state (no gradients)."""
    return (param_bytes(setup.model) + buffer_bytes(setup.model) + tensor_bytes(inputs)
            + optimizer_state_bytes(setup.optimizer))


def saved_activation_bytes(model: nn.Module, inputs: tuple, loss_fn) -> dict:
    """Bytes each module saves for backward in one training forward (module name -> bytes)."""
    tracker = SavedTensorTracker()
    with tracker.track(model, inputs):
        loss = loss_fn(call_model(model, inputs))
    del loss
    return dict(tracker.saved)


def eval_outputs(model: nn.Module, inputs: tuple):
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            return call_model(model, inputs)
    finally:
        model.train(was)


def run_train_trials(model: nn.Module, inputs: tuple, device: torch.device | str, loss_fn, fixes: list[str],
                     facts: dict, params: dict | None = None, *, optimizer: str = "adamw", lr: float = 1e-3,
                     steps: int = 3, iters: int = 10, warmup: int = 2, classifier: bool = True,
                     early_stop: bool = False, budget_s: float | None = None,
                     progress: Callable[[float, str], None] | None = None,
                     report: Report | None = None) -> tuple[list[dict], dict, Stop]:
    """Rows (the baseline first, the A/A control, then one per fix), the machine's disturbance and how
    the timed rounds ended (early stopping and the time budget: ``measure.compare.run_rounds``);
    ``report`` gets the rows as they come."""
    device = torch.device(device)
    progress = progress or (lambda f, m: None)
    report_rows = report or (lambda rows, message: None)
    params = params or {}
    batch = next((x.shape[0] for x in inputs if isinstance(x, torch.Tensor) and x.dim()), 1)
    saved = _saved_by_block(model, inputs, loss_fn, progress) if "activation_checkpointing" in fixes else None
    ctx = TrainContext(inputs, loss_fn, optimizer, lr, device, saved)

    def build(fix_id: str | None, opts: dict) -> TrainSetup:
        torch.manual_seed(SEED)
        m = copy.deepcopy(model).train()
        return baseline(m, ctx) if fix_id is None else get_fix(fix_id, "train").apply(m, ctx, opts)

    progress(0.03, "baseline training steps")
    setups: dict[str, TrainSetup] = {}
    base = build(None, {})
    torch.manual_seed(SEED)
    base_losses, base_grads, base_first = train_for(base, inputs, steps, device)
    base_out = eval_outputs(base.model, inputs)
    rows = [_row("baseline", f"Baseline training step ({_opt_title(base.optimizer)})", "ok", size_ratio=1.0,
                 first_call_ms=base_first * 1e3, losses=base_losses, loss_rel_diff=0.0, grad_cosine=1.0,
                 **fidelity(base_out, base_out, classifier))]
    setups["baseline"] = base

    def attempt(fix_id: str, fix, opts: dict) -> tuple[dict, TrainSetup]:
        setup = build(fix_id, opts)
        torch.manual_seed(SEED)
        losses, grads, first = train_for(setup, inputs, steps, device)
        served = setup.finish() if setup.finish else setup.model
        out = eval_outputs(served, inputs)
        rel = [abs(a - b) / abs(b) if b else abs(a - b) for a, b in zip(losses, base_losses)]
        row = _row(fix_id, fix.title, "ok", notes=list(setup.notes), params=opts, first_call_ms=first * 1e3,
                   losses=losses, loss_rel_diff=max(rel) if rel else None,
                   grad_cosine=cosine(grads, base_grads), **fidelity(base_out, out, classifier))
        if setup.finish:
            row["notes"].append("size and output fidelity: the converted model, after the training steps")
            row["size_bytes"], row["size_kind"] = serialized_bytes(served)
        return row, setup

    setups.update(fix_rows(fixes, "train", facts, params, rows, attempt, why_failed=short_error, report=report,
                           progress=progress, share=(0.05, 0.45), words=("trained", "training with")))

    progress(0.55, "peak memory of one training step per candidate")
    _peaks_and_sizes(rows, setups, inputs, device)
    report_rows(rows, f"trained {len(fixes)} of {len(fixes)} fixes, peak memory measured; timing")
    progress(0.6, f"timing {len(setups)} training steps and the A/A control in interleaved rounds")
    calls = {k: (lambda s=s: s.step(inputs=inputs)) for k, s in setups.items()}
    try:
        with watch() as w:
            r, stop = timed_rounds(calls, device, iters, warmup, batch_size=batch, control=True,
                                   progress=lambda f, m: progress(0.6 + 0.38 * f, m), early_stop=early_stop,
                                   budget_s=budget_s, on_round=timing_reporter(rows, report, "the baseline step"))
            times = r.summary()
    except torch.OutOfMemoryError:
        raise
    except Exception as e:
        raise RuntimeError(f"timing the training steps failed: {short_error(e)}") from e
    disturbance = assess(w.figures, times["baseline"]["cv"])
    return with_times(rows, times, disturbance, "the baseline step"), disturbance, stop


def _saved_by_block(model: nn.Module, inputs: tuple, loss_fn, progress) -> dict:
    """The activations each block saves for backward (what activation checkpointing chooses by), on a copy."""
    progress(0.01, "measuring the activations each block saves for backward")
    probe = copy.deepcopy(model).train()
    try:
        return saved_activation_bytes(probe, inputs, loss_fn)
    finally:
        del probe


def _peaks_and_sizes(rows: list[dict], setups: dict, inputs: tuple, device) -> None:
    """Each trained candidate's peak memory over one step, its size where not known yet, and its size against
    the baseline's (set on the rows)."""
    for row in rows:
        setup = setups.get(row["fix"])
        if setup is None:
            continue
        setup.step.zero_grad()  # the step starts with no gradients, as a training loop's does
        peak = measure_peak(lambda: setup.step(inputs=inputs), device, resident_bytes(setup, inputs))
        row["peak_bytes"] = int(peak.peak_bytes)
        if row["size_bytes"] is None:
            row["size_bytes"], row["size_kind"] = serialized_bytes(setup.model)
    base_size = rows[0]["size_bytes"]
    for row in rows:
        if row["size_bytes"] is not None and base_size:
            row["size_ratio"] = row["size_bytes"] / base_size


def _opt_title(opt: torch.optim.Optimizer) -> str:
    d = opt.defaults
    extra = f", momentum {d['momentum']}" if d.get("momentum") else ""
    return f"{type(opt).__name__}, lr {d['lr']:g}{extra}"
