"""Make it fit: the cheapest changes that bring a configuration under the device's memory, each traced.

Candidates, cheapest first (the order the list keeps among those that fit):

1. a smaller micro-batch with gradient accumulation (the largest batch that fits, k micro-batches
   per step: the same samples and FLOPs per step, k sequential passes);
2. bf16 autocast (fp32 weights kept; activations in bf16);
3. activation checkpointing of every block (cost: the blocks' forward recomputed in backward, FLOPs
   counted on fake tensors by the FLOP counter);
4. optimizer state on the CPU (offload: host memory and PCIe traffic every step);
5. sharding with ZeRO-3 / FSDP2 over the fewest ranks that fit (cost: that many GPUs and the
   all-gathers / reduce-scatters of parameters and gradients);
6. bf16 weights (parameters, gradients and state in bf16: precision of the update);
7. a leaner optimizer (SGD with momentum, Adafactor: different training dynamics).

Each candidate's peak is traced, not guessed; one that cannot be traced is left out with a note.
"""

from __future__ import annotations

import math
from dataclasses import replace

from diagnostics.analyses.plan.configs import Config
from diagnostics.analyses.plan.planner import Planner, recompute_flops
from diagnostics.analyses.plan.result import Suggestion
from diagnostics.errors import TorchScopeError

SHARD_RANKS = (2, 4, 8, 16, 32, 64)
#: Suggestions that fit after which costlier candidates are not traced.
FITTING_ENOUGH = 3


def _shard_suggestion(planner: Planner, config: Config, notes: list):
    """ZeRO-3 over the fewest ranks in SHARD_RANKS that fit: the peak per rank is a + b / N (the sharded
    parameters, gradients and state shrink with N, activations do not), fitted from N = 2 and 8, then the
    answer traced."""
    s = config.setting

    def at(n):
        return replace(config, setting=replace(s, shard="zero3", ranks=n))

    try:
        p2, p8 = (planner.device_peak(planner.run(at(n), first_rank_only=True))[0] for n in (2, 8))
    except TorchScopeError as e:
        notes.append(f"sharding not suggested: {e}")
        return None
    b = (p2 - p8) / (1 / 2 - 1 / 8)
    a = p2 - b / 2
    n = next((n for n in SHARD_RANKS if a + b / n <= planner.budget()), None)
    if n is None:
        notes.append(f"sharding alone does not make it fit: what ZeRO-3 does not shard (activations, temporaries) "
                     f"needs about {int(a):,} bytes per rank (fitted from 2 and 8 ranks)")
        return None
    return _suggest(planner, at(n), f"ZeRO-3 / FSDP2 over {n} GPUs",
                    f"{n} GPUs; parameters all-gathered and gradients reduce-scattered every step", 5)


def _suggest(planner: Planner, config: Config, change: str, cost: str, rank: int, *,
             flops: bool = False) -> tuple[int, Suggestion] | None:
    try:
        st = planner.run(config, first_rank_only=True)
    except TorchScopeError:
        return None
    peak, _ = planner.device_peak(st)
    rf = recompute_flops(planner, config) if flops else None
    if flops and rf is not None:
        cost = f"{cost}: {rf:,} FLOPs recomputed per step"
    return rank, Suggestion(change=change, peak_bytes=peak, fits=planner.fits(peak), headroom_bytes=planner.budget() - peak,
                            cost=cost, recompute_flops=rf, batch=config.batch, seq=config.seq,
                            setting=config.setting.label)


def _state_bytes(planner: Planner, optimizer: str, base) -> int:
    """The closed-form optimizer state of ``optimizer`` on this model, in the traced state's element size."""
    from diagnostics.analyses.plan.analytic import static_bytes
    from diagnostics.tensors import unique_params

    params = unique_params(planner.loaded.model)
    elt = (base.param_bytes * 2 // max(1, sum(p.numel() for p in params))) / 2 or 4
    shapes = [(tuple(p.shape), p.requires_grad) for p in params]
    return int(static_bytes(shapes, optimizer, elt)["optimizer state"])


def suggestions(planner: Planner, config: Config, largest_batch: int | None, notes: list) -> list[Suggestion]:
    """Changes to ``config`` (which does not fit) that make it fit, each with its traced peak and cost."""
    s = config.setting
    found: list[tuple[int, Suggestion]] = []

    def add(item):
        if item is not None:
            found.append(item)

    def enough() -> bool:
        """Candidates are tried cheapest first; once FITTING_ENOUGH fit, the costlier ones are not traced."""
        return sum(1 for _, x in found if x.fits) < FITTING_ENOUGH

    if largest_batch and 0 < largest_batch < config.batch:
        k = math.ceil(config.batch / largest_batch)
        micro = math.ceil(config.batch / k)
        add(_suggest(planner, config.with_size(micro, config.seq),
                     f"micro-batch {micro} with {k} gradient-accumulation steps (batch {config.batch} per step)",
                     f"no extra FLOPs; {k} sequential micro-batches per optimizer step", 1))
    if s.dtype == "fp32" and enough():
        add(_suggest(planner, replace(config, setting=replace(s, dtype="amp_bf16")), "bf16 autocast",
                     "none in FLOPs; matmuls and activations in bf16 (fp32 weights and optimizer kept)", 2))
    if s.checkpointing == "none" and enough():
        try:
            add(_suggest(planner, replace(config, setting=replace(s, checkpointing="blocks")),
                         "activation checkpointing of every block", "recompute each block's forward in backward",
                         3, flops=True))
        except TorchScopeError as e:
            notes.append(f"checkpointing not suggested: {e}")
    base = planner.run(config)
    fb = max([v["bytes"] for ph, v in base.phase_peaks.items() if ph in ("forward", "backward")] or [0])
    fb += planner.device_peak(base)[0] - int(base.peak_bytes)

    def hopeless(state_after: int) -> bool:
        """Forward and backward hold the state they start with: with ``state_after`` bytes of it instead, their
        peaks move by the difference, so a candidate that still does not fit there is not traced."""
        return fb - (base.state_bytes - state_after) > planner.budget()

    if not s.offload and s.optimizer not in ("sgd_nomomentum",) and enough() and not hopeless(0):
        add(_suggest(planner, replace(config, setting=replace(s, offload=True)), "optimizer state and step on the CPU",
                     "host memory for the state; gradients and updated weights cross PCIe every step", 4))
    if s.shard == "none" and enough():
        add(_shard_suggestion(planner, config, notes))
    if s.dtype in ("fp32", "amp_bf16", "amp_fp16") and enough():
        add(_suggest(planner, replace(config, setting=replace(s, dtype="bf16")), "bf16 weights and compute",
                     "none in FLOPs; weights, gradients and optimizer state in bf16 (update precision)", 6))
    if s.optimizer in ("adam", "adamw", "adamw_fused") and enough():
        for other in ("adafactor", "sgd"):
            if hopeless(_state_bytes(planner, other, base)):
                continue
            add(_suggest(planner, replace(config, setting=replace(s, optimizer=other)), f"{other} instead of {s.optimizer}",
                         "a different optimizer: smaller state, different training dynamics", 7))
    fitting = sorted((x for x in found if x[1].fits), key=lambda x: (x[0], x[1].peak_bytes))
    rest = sorted((x for x in found if not x[1].fits), key=lambda x: x[1].peak_bytes)
    return [x[1] for x in fitting + rest]
