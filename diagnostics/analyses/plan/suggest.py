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


def _suggest(planner: Planner, config: Config, change: str, cost: str, rank: int, *,
             flops: bool = False) -> tuple[int, Suggestion] | None:
    try:
        st = planner.run(config)
    except TorchScopeError:
        return None
    peak, _ = planner.device_peak(st)
    rf = recompute_flops(planner, config) if flops else None
    if flops and rf is not None:
        cost = f"{cost}: {rf:,} FLOPs recomputed per step"
    return rank, Suggestion(change=change, peak_bytes=peak, fits=planner.fits(peak), headroom_bytes=planner.budget() - peak,
                            cost=cost, recompute_flops=rf, batch=config.batch, seq=config.seq,
                            setting=config.setting.label)


def suggestions(planner: Planner, config: Config, largest_batch: int | None, notes: list) -> list[Suggestion]:
    """Changes to ``config`` (which does not fit) that make it fit, each with its traced peak and cost."""
    s = config.setting
    found: list[tuple[int, Suggestion]] = []

    def add(item):
        if item is not None:
            found.append(item)

    if largest_batch and 0 < largest_batch < config.batch:
        k = math.ceil(config.batch / largest_batch)
        micro = math.ceil(config.batch / k)
        add(_suggest(planner, config.with_size(micro, config.seq),
                     f"micro-batch {micro} with {k} gradient-accumulation steps (batch {config.batch} per step)",
                     f"no extra FLOPs; {k} sequential micro-batches per optimizer step", 1))
    if s.dtype == "fp32":
        add(_suggest(planner, replace(config, setting=replace(s, dtype="amp_bf16")), "bf16 autocast",
                     "none in FLOPs; matmuls and activations in bf16 (fp32 weights and optimizer kept)", 2))
    if s.checkpointing == "none":
        try:
            add(_suggest(planner, replace(config, setting=replace(s, checkpointing="blocks")),
                         "activation checkpointing of every block", "recompute each block's forward in backward",
                         3, flops=True))
        except TorchScopeError as e:
            notes.append(f"checkpointing not suggested: {e}")
    if not s.offload and s.optimizer not in ("sgd_nomomentum",):
        add(_suggest(planner, replace(config, setting=replace(s, offload=True)), "optimizer state and step on the CPU",
                     "host memory for the state; gradients and updated weights cross PCIe every step", 4))
    if s.shard == "none":
        for n in SHARD_RANKS:
            item = _suggest(planner, replace(config, setting=replace(s, shard="zero3", ranks=n)),
                            f"ZeRO-3 / FSDP2 over {n} GPUs",
                            f"{n} GPUs; parameters all-gathered and gradients reduce-scattered every step", 5)
            if item is None:
                notes.append("sharding not suggested: this model could not be traced with FSDP2 on fake tensors")
                break
            found.append(item)
            if item[1].fits:
                break
    if s.dtype in ("fp32", "amp_bf16", "amp_fp16"):
        add(_suggest(planner, replace(config, setting=replace(s, dtype="bf16")), "bf16 weights and compute",
                     "none in FLOPs; weights, gradients and optimizer state in bf16 (update precision)", 6))
    if s.optimizer in ("adam", "adamw", "adamw_fused"):
        for other in ("adafactor", "sgd"):
            add(_suggest(planner, replace(config, setting=replace(s, optimizer=other)), f"{other} instead of {s.optimizer}",
                         "a different optimizer: smaller state, different training dynamics", 7))
    fitting = sorted((x for x in found if x[1].fits), key=lambda x: (x[0], x[1].peak_bytes))
    rest = sorted((x for x in found if not x[1].fits), key=lambda x: x[1].peak_bytes)
    return [x[1] for x in fitting + rest]
