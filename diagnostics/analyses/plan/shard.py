"""Sharded configurations: one rank's step traced in a fake process group of N ranks (one process).

torch's fake process group (torch.testing._internal.distributed.fake_pg, the backbone of
torch.distributed._tools.fsdp2_mem_tracker) answers every collective without talking to anyone:
outputs have the right shapes, so the buffers a collective allocates are counted like any other
tensor. The model's copy is wrapped as the sharding asks:

* zero3: FSDP2 ``fully_shard`` on each block, then on the model (parameters, gradients and optimizer
  state sharded; a block's parameters gathered only while it runs);
* zero2: the same with ``reshard_after_forward=False`` (parameters stay gathered from forward to
  backward: ZeRO-2's replicated parameters, sharded gradients and state);
* zero1: DDP with torch's ``ZeroRedundancyOptimizer`` (optimizer state sharded; DDP's gradient buckets).

``batch`` is per rank. Ranks differ where a tensor does not split evenly (FSDP2 pads the last shards):
the first and the last rank are traced and the larger peak is the row's (both in its notes).
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from diagnostics.analyses.plan.configs import Config
from diagnostics.analyses.plan.ledger import Ledger
from diagnostics.analyses.plan.trace import StepTrace, _bytes, eager_transformers, inputs_for, names_of, prepare
from diagnostics.errors import TorchScopeError


@contextmanager
def fake_world(ranks: int, rank: int, device: str):
    """A fake process group of ``ranks`` ranks seen from ``rank``, and its 1-D device mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    if dist.is_initialized():
        raise TorchScopeError("a process group is already running in this process: the plan's fake ranks need "
                              "their own")
    dist.init_process_group("fake", rank=rank, world_size=ranks, store=FakeStore())
    try:
        yield init_device_mesh(device, (ranks,))
    finally:
        dist.destroy_process_group()


def _wrap(model, config: Config, mesh, blocks: list[str]):
    shard = config.setting.shard
    if shard in ("zero2", "zero3"):
        from torch.distributed.fsdp import fully_shard

        mods = dict(model.named_modules())
        keep = shard == "zero2"
        for name in blocks:
            fully_shard(mods[name], mesh=mesh, reshard_after_forward=not keep)
        fully_shard(model, mesh=mesh, reshard_after_forward=not keep)
        return model, None
    if mesh is None:  # fake ranks: DDP's constructor reads the parameters' data, which fake tensors lack
        return model, "zero1"
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model), "zero1"


def zero_optimizer(params, name: str, optimizer: tuple | None = None):
    """torch's ZeroRedundancyOptimizer over ``params`` with the optimizer ``name`` (measure.training's
    construction: the same class and hyper-parameters), or ``optimizer``: (class, defaults) (an attached
    script's own), each rank keeping its partition's state."""
    import inspect

    from torch.distributed.optim import ZeroRedundancyOptimizer

    from diagnostics.analyses.plan.trace import LR
    from diagnostics.measure.training import make_optimizer

    if optimizer is None:
        probe = make_optimizer([torch.nn.Parameter(torch.empty(1))], name, LR)
        optimizer = (type(probe), probe.defaults)
    cls, defaults = optimizer
    accepted = inspect.signature(cls.__init__).parameters
    return ZeroRedundancyOptimizer(list(params), optimizer_class=cls,
                                   **{k: v for k, v in defaults.items() if k in accepted and k != "params"})


def _optimizer(model, config: Config, target, kind, optimizer: tuple | None = None):
    from diagnostics.analyses.plan.trace import _optimizer as plain

    trained = [p for p in model.parameters() if p.requires_grad]
    if kind == "zero1":
        return zero_optimizer(trained, config.setting.optimizer, optimizer)
    if optimizer is not None:
        return optimizer[0](trained, **optimizer[1])
    return plain(model, config, target)


def _one_rank(planner, config: Config, rank: int, timeline: bool, optimizer: tuple | None = None) -> StepTrace:
    from diagnostics.analyses.plan.trace import blocks_of, train_step

    t0 = time.perf_counter()
    target, fake, loaded = planner.target, planner.fake, planner.loaded
    model, device, ck = prepare(loaded, config, target, fake, checkpoint_patterns=planner.checkpoint_patterns,
                                standins=planner.standins)
    blocks = blocks_of(model)
    if config.setting.shard in ("zero2", "zero3") and not blocks:
        raise TorchScopeError(f"{config.setting.shard}: FSDP2 shards per block, and this model has no repeated "
                              "blocks (children of a ModuleList or Sequential sharing a class)")
    inputs = inputs_for(loaded, config, fake, device)
    with fake_world(config.setting.ranks, rank, device) as mesh, eager_transformers():
        with fake:
            model, kind = _wrap(model, config, None if config.setting.shard == "zero1" else mesh, blocks)
            opt = _optimizer(model, config, target, kind, optimizer)
        persistent = []
        if kind == "zero1":
            # DDP keeps a flat bucket per ~25 MiB of gradients from its construction on (gradients are
            # copied in, all-reduced, copied back): as many bytes as the trainable parameters.
            with fake:
                buckets = torch.empty(_bytes([p for p in model.parameters() if p.requires_grad]),
                                      dtype=torch.uint8, device=device)
            persistent.append((buckets, "gradients"))
        ledger = Ledger(target.rounding, names_of(model), timeline=timeline, scratch=planner.scratch)
        return train_step(loaded, model, inputs, config, target, ledger, fake, device, ck, t0, opt=opt,
                          persistent=persistent)


def trace_sharded(planner, config: Config, timeline: bool = False, ranks=None, optimizer: tuple | None = None
                  ) -> StepTrace:
    """The larger of the first and the last rank's traced peaks (see the module doc); ``ranks``: which
    ranks to trace instead; ``optimizer``: (class, defaults) in place of the configuration's named one (an
    attached script's own: analyses/plan/attached.py)."""
    n = config.setting.ranks
    traces = {r: _one_rank(planner, config, r, timeline, optimizer) for r in sorted(ranks or {0, n - 1})}
    worst = max(traces.values(), key=lambda t: t.peak_bytes)
    worst.per_rank = {r: int(t.peak_bytes) for r, t in traces.items()}
    worst.notes = list(worst.notes) + [
        f"{config.setting.label}, batch {config.batch} per rank: rank {r} peaks at {t.peak_bytes:,} bytes"
        for r, t in traces.items()]
    return worst
