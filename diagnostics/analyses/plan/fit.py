"""Fit in a budget: which modules to checkpoint so a configuration's predicted peak fits, at the least
recompute time.

Candidates: the model's repeated blocks (measure.checkpoint.blocks_of: transformer layers, ResNet
stages' blocks), else its top-level children that hold parameters. For each, from the unconstrained
step's trace, the bytes saved for backward while it ran (what checkpointing it can free), and the cost
of checkpointing it: its forward runs once more per step, in backward. That time is **measured** here
(``recompute_times``): the model's own weights, inputs of the configuration's shapes, one real forward
with hooks keeping each candidate's inputs, then each candidate's forward timed with autograd
recording, as the recompute runs: REPEATS rounds over the candidates after a warm-up, the median of
each (fewer when they take over TIMING_BUDGET_S, at least MIN_REPEATS); modules alike (class, weights' and
inputs' shapes: a transformer's layers) pool their samples). Where the plan cannot run the model
here (a model on the meta device, a GPU target, bf16 / fp16 weights), the times are not measured: the
candidates are ranked by their forward FLOPs, and the result says so.

The choice: memory saved by checkpointing does not add up module by module (the recompute holds one
module's activations again while its backward runs; the peak can move to another phase or module), so
no closed-form knapsack is trusted with the answer (torch's private sac_ilp solves a MILP on per-op
estimates; here each candidate set is traced instead). Candidates are ranked by recompute time per byte
saved (the greedy order of the knapsack: optimal for its fractional relaxation, and exact when the
blocks are alike, as a transformer's are); the shortest prefix of that ranking whose *traced* peak fits
is found by bisection over prefixes (a longer prefix holds no more, as a rule; the answer is checked by its own trace), then each
chosen module is dropped in turn, costliest first (at most MAX_PRUNED), if the rest still fits (traced).
The answer is a traced point: ``predicted_peak_bytes`` is that trace's peak, never an interpolation.

When even every candidate checkpointed does not fit, ``smallest_peak_bytes`` is that peak, and ``needed``
lists what else would make it fit, each traced at the budget (plan/suggest.py: a smaller micro-batch,
bf16 autocast, optimizer state on the CPU, sharding, bf16 weights, a leaner optimizer).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import replace

from diagnostics.analyses.plan.configs import Config
from diagnostics.analyses.plan.planner import Planner, forward_flops
from diagnostics.analyses.plan.result import Fit, FitCandidate
from diagnostics.errors import TorchScopeError

#: timed calls of each candidate's forward (after one warm-up): their median is its recompute time
REPEATS = 10
#: ... but no more rounds than fit in this many seconds, once MIN_REPEATS are done (a large model on the CPU)
TIMING_BUDGET_S = 20.0
MIN_REPEATS = 3
#: chosen modules (costliest first) tried for dropping, one trace each
MAX_PRUNED = 6

METHOD = ("candidates (repeated blocks, else top-level children) ranked by recompute time per byte they save; "
          "the shortest prefix of that ranking whose traced peak fits (bisection over prefixes), then each chosen "
          "module dropped, costliest first, where the rest still fits (traced)")


def candidates_of(model) -> list[str]:
    from diagnostics.measure.checkpoint import blocks_of

    blocks = blocks_of(model)
    if blocks:
        return blocks
    return [n for n, m in model.named_children() if any(True for _ in m.parameters())]


def recompute_times(loaded, config: Config, names: list[str]) -> dict[str, float]:
    """Each named module's forward time (ms) on this CPU at ``config``'s shapes, autograd recording (what
    checkpointing's recompute runs in backward). The user's model is run as it is and left as it was."""
    import torch

    from diagnostics.analyses.plan.trace import _autocast, specs_at
    from diagnostics.inputs import make_inputs
    from diagnostics.measure.state import restored_state
    from diagnostics.measure.timer import time_calls

    model = loaded.model
    mods = dict(model.named_modules())
    kept: dict[str, tuple] = {}

    def keep(name):
        def hook(_m, args, kwargs):
            if name not in kept:
                kept[name] = (args, kwargs)
        return hook

    def fresh(x):
        if isinstance(x, torch.Tensor):
            return x.detach().requires_grad_(x.requires_grad or x.is_floating_point())
        return x

    inputs = make_inputs(specs_at(loaded.input_specs, config.batch, config.seq, config.setting.seq_input), "cpu",
                         loaded.spec.seed)
    out: dict[str, float] = {}
    with restored_state(model):
        model.train()
        handles = [mods[n].register_forward_pre_hook(keep(n), with_kwargs=True) for n in names]
        try:
            with torch.no_grad(), _autocast(config, "cpu"):
                inputs.call(model)
        finally:
            for h in handles:
                h.remove()
        calls, groups = {}, {}
        for n in names:
            if n not in kept:
                continue
            args, kwargs = kept[n]
            args = tuple(fresh(a) for a in args)
            kwargs = {k: fresh(v) for k, v in kwargs.items()}
            m = mods[n]

            def call(m=m, args=args, kwargs=kwargs):
                with torch.enable_grad(), _autocast(config, "cpu"):
                    m(*args, **kwargs)

            calls[n] = call
            groups.setdefault(_signature(m, args, kwargs), []).append(n)
        samples: dict[str, list[float]] = {n: [] for n in calls}
        for n, call in calls.items():
            call()  # warm-up
        t0 = time.perf_counter()
        for r in range(REPEATS):  # round-robin: a busy moment of the machine falls on every candidate alike
            for n, call in calls.items():
                samples[n] += time_calls(call, "cpu", 1)
            if r + 1 >= MIN_REPEATS and time.perf_counter() - t0 > TIMING_BUDGET_S:
                break
        for members in groups.values():  # modules alike (class, weights' and inputs' shapes) pool their samples
            pooled = sorted(x for n in members for x in samples[n])
            for n in members:
                out[n] = float(pooled[len(pooled) // 2])
    return out


def _signature(m, args, kwargs) -> tuple:
    import torch

    def shape(x):
        return (tuple(x.shape), str(x.dtype)) if isinstance(x, torch.Tensor) else repr(type(x))

    return (type(m).__qualname__, tuple(tuple(p.shape) for p in m.parameters()), tuple(shape(a) for a in args),
            tuple(sorted((k, shape(v)) for k, v in kwargs.items())))


def _timing(planner: Planner, config: Config) -> str:
    """Why the recompute times can be measured here, or why not ("" when they can)."""
    from diagnostics.analyses.plan.configs import DTYPES

    if planner.loaded.meta:
        return "the model is on the meta device (no weights to run)"
    if planner.target.kind != "cpu":
        return f"the target ({planner.target.name}) is not this machine's CPU"
    if DTYPES[config.setting.dtype].param != "float32":
        return f"{config.setting.dtype} weights are not the model's own (fp32)"
    return ""


@contextmanager
def _budget(planner: Planner, budget: int):
    """The planner's fits / budget against ``budget`` bytes instead of its device (for the suggestions)."""
    import msgspec

    own = planner.target
    planner.target = msgspec.structs.replace(own, capacity_bytes=int(budget) + int(own.context_bytes or 0))
    try:
        yield
    finally:
        planner.target = own


def _candidate_times(planner: Planner, config: Config, names: list[str], progress,
                     not_timed: str = "") -> tuple[dict[str, float], str]:
    """Each candidate's recompute time measured on this CPU (empty when it cannot be), and how it was had.
    ``not_timed``: why the model must not be run here to time them (then ranked by FLOPs, said so)."""
    why_not = not_timed or _timing(planner, config)
    times: dict[str, float] = {}
    if not why_not:
        progress("timing each candidate's forward on this CPU")
        try:
            times = recompute_times(planner.loaded, config, names)
            return times, (f"measured on this CPU: each module's forward with autograd recording, the median of "
                           f"{REPEATS} rounds (modules alike pooled) at batch {config.batch}"
                           + (f", seq {config.seq}" if config.seq is not None else ""))
        except Exception as e:  # the ranking falls back to FLOPs; the answer is still traced
            why_not = f"timing failed ({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})"
    return times, f"not measured ({why_not}): candidates ranked by forward FLOPs, recompute time not given"


def _fewest_that_fit(ranked: list[str], budget: int, cost, peak_of) -> tuple[list[str], int, bool]:
    """The shortest prefix of ``ranked`` whose step fits ``budget`` (bisection), then costly members the others
    make unneeded dropped; (everything, its peak, False) when not even all of them fit."""
    peaks: dict[int, int] = {len(ranked): peak_of(ranked)}
    if peaks[len(ranked)] > budget:  # nothing checkpointing can do fits: the smallest peak, and what else
        return list(ranked), peaks[len(ranked)], False
    lo, hi = 0, len(ranked)  # prefix lo does not fit (0: the unconstrained step), hi fits
    while hi - lo > 1:
        mid = (lo + hi) // 2
        peaks[mid] = peak_of(ranked[:mid])
        lo, hi = (lo, mid) if peaks[mid] <= budget else (mid, hi)
    chosen, peak = list(ranked[:hi]), peaks[hi]
    for n in sorted(chosen, key=cost, reverse=True)[:MAX_PRUNED]:  # a costly one the others make unneeded
        if len(chosen) == 1:
            break
        rest = [c for c in chosen if c != n]
        p = peak_of(rest)
        if p <= budget:
            chosen, peak = rest, p
    return chosen, peak, True


def _what_else(planner: Planner, selected: Config, chosen: list[str], budget: int, notes: list[str]) -> tuple:
    """Nothing checkpointing does fits: the suggestions (traced) that would, with ``chosen`` checkpointed."""
    from diagnostics.analyses.plan.suggest import suggestions

    with _budget(planner, budget):
        largest = _largest_batch(planner, selected, ",".join(chosen), budget)
        own = planner.checkpoint_patterns
        planner.checkpoint_patterns = ",".join(chosen)
        try:
            return tuple(suggestions(planner, selected, largest, notes))
        finally:
            planner.checkpoint_patterns = own


def fit_budget(planner: Planner, config: Config, budget: int, notes: list[str], progress=None,
               not_timed: str = "") -> Fit:
    """The budget answer for ``config`` (a training step, unsharded, without checkpointing). ``not_timed``:
    why the recompute times must not be measured by running the model here (then ranked by FLOPs, said so)."""
    progress = progress or (lambda m: None)
    traces0 = planner.traces
    base = planner.run(config)
    base_peak, _ = planner.device_peak(base)
    if base_peak <= budget:
        return Fit(budget_bytes=budget, configuration=config.setting.label, batch=config.batch, seq=config.seq,
                   unconstrained_peak_bytes=base_peak, checkpoint_modules=(), predicted_peak_bytes=base_peak,
                   recompute_ms=0.0, recompute_flops=0, fits=True, method=METHOD, traces=planner.traces - traces0,
                   timing="nothing to checkpoint: the step fits without it")
    from diagnostics.analyses.plan.trace import skeleton

    names = candidates_of(skeleton(planner.loaded.model))
    if not names:
        raise TorchScopeError("budget: the model has no blocks or children to checkpoint")
    saved = {n: int(base.saved_in(n)) for n in names}
    flops = forward_flops(planner, config) or {}
    times, timing = _candidate_times(planner, config, names, progress, not_timed)

    def cost(n: str) -> float:
        return times[n] if n in times else float(flops.get(n, 0))

    ranked = sorted((n for n in names if saved[n] > 0), key=lambda n: cost(n) / saved[n])
    ranked += [n for n in names if saved[n] <= 0]
    selected = replace(config, setting=replace(config.setting, checkpointing="selected"))

    def peak_of(chosen) -> int:
        progress(f"tracing with {len(chosen)} module(s) checkpointed")
        return planner.device_peak(planner.run(selected, checkpoint_patterns=",".join(chosen)))[0]

    chosen, peak, ok = _fewest_that_fit(ranked, budget, cost, peak_of)
    needed, smallest = (), None
    if not ok:
        smallest = peak
        progress("nothing checkpointing does fits: tracing what else would")
        needed = _what_else(planner, selected, chosen, budget, notes)
    rc_ms = round(sum(times[n] for n in chosen), 3) if chosen and all(n in times for n in chosen) else (
        0.0 if not chosen else None)
    rc_flops = int(sum(flops.get(n, 0) for n in chosen)) if flops else None
    cands = tuple(FitCandidate(module=n, saved_bytes=saved[n],
                               recompute_ms=(round(times[n], 3) if n in times else None),
                               forward_flops=flops.get(n), chosen=n in chosen) for n in ranked)
    return Fit(budget_bytes=budget, configuration=config.setting.label, batch=config.batch, seq=config.seq,
               unconstrained_peak_bytes=base_peak, checkpoint_modules=tuple(n for n in ranked if n in chosen),
               predicted_peak_bytes=peak, recompute_ms=rc_ms, recompute_flops=rc_flops, fits=ok,
               smallest_peak_bytes=smallest, needed=needed, candidates=cands, timing=timing, method=METHOD,
               traces=planner.traces - traces0)


def _largest_batch(planner: Planner, selected: Config, patterns: str, budget: int) -> int | None:
    """The largest batch below the configuration's whose step, so checkpointed, fits ``budget`` (bisection
    with traces; None: not even batch 1)."""
    def fits(b: int) -> bool:
        return planner.device_peak(planner.run(selected.with_size(b, selected.seq), checkpoint_patterns=patterns))[0] \
            <= budget

    lo, hi = 0, selected.batch
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            ok = fits(mid)
        except TorchScopeError:
            return lo or None
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo or None

