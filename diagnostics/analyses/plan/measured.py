"""The measured counterpart of a planned configuration: the same step run for real, its peak measured as
the Memory analysis measures it. This allocates; the plan never calls it: the accuracy corpus
(tests/analyses/plan, bench/bench_plan.py) and the GPU check (bench/gpu/plan_cuda.py) do.

The protocol is the Memory analysis' (analyses/memory/job.py): one warm-up step (the optimizer's
state exists afterwards), gradients set to None, then the measured step (forward + loss, backward,
optimizer step) under ``measure.memory.measure_peak``: ``torch.cuda.max_memory_allocated`` on
CUDA, the profiler's allocation events plus what was alive before on the CPU. The configuration is
applied as the plan applies it: parameters cast to the dtype (``model.to``), autocast around forward
and loss, the same checkpointing wrapper, the same optimizer constructor and defaults.
"""

from __future__ import annotations

import torch

from diagnostics.analyses.plan.configs import DTYPES, Config
from diagnostics.analyses.plan.trace import (LR, TORCH_DTYPES, checkpointed_names, checkpointing, eager_transformers,
                                             specs_at)
from diagnostics.inputs import Inputs, make_inputs
from diagnostics.measure.memory import is_cuda, measure_peak
from diagnostics.tensors import buffer_bytes, optimizer_state_bytes, param_bytes, tensor_bytes
from diagnostics.measure.training import Step, Trainee, make_optimizer


def measured_peak(loaded, config: Config, checkpoint_patterns: str = "", foreach: bool | None = None) -> dict:
    """Run ``config`` on ``loaded``'s model (changed in place: load a fresh one per call) and measure its
    training step's peak. Returns {"peak_bytes", "baseline_bytes", "tensor_bytes", "source"}: on CUDA
    ``baseline_bytes`` is what the allocator held when the measured step started and ``tensor_bytes`` the
    step's own tensors then (parameters, buffers, inputs, optimizer state); the difference is the library
    workspaces plus anything else the process keeps alive, which ``max_memory_allocated`` counts too. So
    ``loaded``'s example inputs are dropped first (the step makes its own at the configuration's size), and
    a peak is only the step's in a process that allocated nothing else on the device before
    (bench/gpu/plan_cuda.py measures each case in a fresh process)."""
    if config.setting.mode != "train" or config.setting.shard != "none" or config.setting.offload:
        raise ValueError("measured_peak runs an unsharded training step on one device")
    model, device = loaded.model, loaded.device
    loaded.inputs = Inputs((), {})  # the example inputs at the spec's size: not the step's, yet on the device
    d = DTYPES[config.setting.dtype]
    pdt = TORCH_DTYPES[d.param]
    if pdt != torch.float32:
        model.to(pdt)
    specs = specs_at(loaded.input_specs, config.batch, config.seq, config.setting.seq_input)
    inputs = make_inputs(specs, str(device), loaded.spec.seed)
    if d.autocast is None and pdt != torch.float32:
        inputs = inputs.map(lambda t: t.to(pdt) if t.is_floating_point() else t)
    names = checkpointed_names(model, config.setting, checkpoint_patterns)
    if foreach is None and config.setting.optimizer != "adamw_fused" and is_cuda(device):
        foreach = True
    opt = make_optimizer(model.parameters(), config.setting.optimizer, LR, foreach=foreach)
    amp = ((lambda: torch.autocast(device_type=device.type, dtype=TORCH_DTYPES[d.autocast]))
           if d.autocast in ("bfloat16", "float16") else None)
    model.train()
    # the one training step (measure.training.Step): autocast around forward and loss, backward, the optimizer;
    # the gradients are set to None here, between the warm-up and the measured step, not inside it
    step = Step(Trainee(model, loaded.loss_fn, inputs, loaded.loss_name), True, optimizer=opt, zero_grad=False,
                autocast=amp)

    with eager_transformers(), checkpointing(model, names):
        step()  # warm-up: the optimizer's state now exists
        opt.zero_grad(set_to_none=True)
        baseline = param_bytes(model) + buffer_bytes(model) + tensor_bytes(inputs) + optimizer_state_bytes(opt)
        peak = measure_peak(step, device, baseline)
    opt.zero_grad(set_to_none=True)
    return {"peak_bytes": int(peak.peak_bytes), "baseline_bytes": int(peak.baseline_bytes),
            "tensor_bytes": int(baseline), "source": peak.source}


# ----------------------------------------------------------------------------- sharded, with gloo ranks
def _rank_main(rank: int, ranks: int, port: int, spec_dict: dict, config_dict: dict, out_path: str) -> None:
    """One gloo rank (spawned): load the model, wrap it as the plan does, measure the step's peak."""
    import json
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from diagnostics.analyses.plan.configs import Setting
    from diagnostics.analyses.plan.shard import _wrap
    from diagnostics.analyses.plan.trace import blocks_of
    from diagnostics.intake import load_model
    from diagnostics.spec import ModelSpec

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    try:
        loaded = load_model(ModelSpec.from_dict(spec_dict))
        setting = Setting.from_dict(config_dict)
        config = Config(int(config_dict["batch"]), config_dict["seq"], setting)
        model = loaded.model
        mesh = init_device_mesh("cpu", (ranks,))
        blocks = blocks_of(model)
        wrapped, kind = _wrap(model, config, mesh, blocks)
        specs = specs_at(loaded.input_specs, config.batch, config.seq, config.setting.seq_input)
        inputs = make_inputs(specs, "cpu", loaded.spec.seed + rank)
        trainable = [p for p in wrapped.parameters() if p.requires_grad]
        if kind == "zero1":
            from diagnostics.analyses.plan.shard import zero_optimizer

            opt = zero_optimizer(trainable, setting.optimizer)
            inner = opt.optim
        else:
            opt = inner = make_optimizer(trainable, setting.optimizer, LR)

        # the one training step on the wrapped model; gradients set to None between warm-up and measure
        step = Step(Trainee(wrapped, loaded.loss_fn, inputs, loaded.loss_name), True, optimizer=opt, zero_grad=False)

        def local_bytes(ts):
            seen, n = set(), 0
            for t in ts:
                t = t.to_local() if hasattr(t, "to_local") else t
                st = t.untyped_storage()
                if st.data_ptr() not in seen:
                    seen.add(st.data_ptr())
                    n += st.nbytes()
            return n

        with eager_transformers():
            step()
            opt.zero_grad(set_to_none=True)
            state = [v for s in inner.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
            baseline = local_bytes(list(wrapped.parameters()) + list(wrapped.buffers()) + list(inputs) + state)
            if kind == "zero1":  # DDP's gradient buckets live from its first backward on
                baseline += sum(b.buffer().untyped_storage().nbytes() for b in _ddp_buckets(wrapped))
            peak = measure_peak(step, "cpu", baseline)
        with open(f"{out_path}.{rank}", "w") as f:
            json.dump({"rank": rank, "peak_bytes": int(peak.peak_bytes), "baseline_bytes": int(baseline)}, f)
    finally:
        dist.destroy_process_group()


def _ddp_buckets(ddp):
    """DDP's gradient buckets (their flat buffers), read through its reducer's debugging hook."""
    try:
        return ddp.reducer._get_grad_buckets()
    except Exception:
        return []


def measured_sharded(spec, config: Config, port: int = 29533) -> list[dict]:
    """Each of ``config.setting.ranks`` gloo ranks (processes on this CPU) runs ``config`` wrapped as the
    plan wraps it; returns their measured peaks, rank by rank."""
    import json
    import tempfile

    import torch.multiprocessing as mp

    ranks = config.setting.ranks
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/peak"
        mp.spawn(_rank_main, args=(ranks, port, spec.to_dict(), config.to_dict(), out), nprocs=ranks, join=True)
        return [json.load(open(f"{out}.{r}")) for r in range(ranks)]


def measured_inference_peak(loaded, config: Config) -> dict:
    """Run ``config``'s inference on ``loaded``'s model (cast in place: load a fresh one per call) as the plan
    runs it (analyses/plan/inference.py: a transformers decoder's prompt into a KV cache, then one token;
    other models one forward) under no_grad, once to warm up, then measured."""
    from diagnostics.analyses.plan.inference import hf_decoder

    model, device = loaded.model, loaded.device
    loaded.inputs = Inputs((), {})  # as in measured_peak: the example inputs are not the pass's
    d = DTYPES[config.setting.dtype]
    pdt = TORCH_DTYPES[d.param]
    if pdt != torch.float32:
        model.to(pdt)
    model.eval()
    specs = specs_at(loaded.input_specs, config.batch, config.seq, config.setting.seq_input)
    inputs = make_inputs(specs, str(device), loaded.spec.seed)
    hf = hf_decoder(model)

    def run():
        with torch.no_grad():
            if hf is None:
                inputs.call(model)
                return
            import inspect

            from transformers import DynamicCache

            params = inspect.signature(hf.forward).parameters
            kw = "cache" if "cache" in params else "past_key_values"
            keep = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
            cache = DynamicCache(config=hf.config)
            ids = inputs.args[0]
            hf(input_ids=ids, use_cache=True, **{kw: cache}, **keep)
            hf(input_ids=ids[:, -1:], use_cache=True, **{kw: cache}, **keep)

    with eager_transformers():
        run()
        baseline = param_bytes(model) + buffer_bytes(model) + tensor_bytes(inputs)
        peak = measure_peak(run, device, baseline)
    return {"peak_bytes": int(peak.peak_bytes), "baseline_bytes": int(peak.baseline_bytes),
            "tensor_bytes": int(baseline), "source": peak.source}
