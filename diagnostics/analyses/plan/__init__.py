"""The plan analysis: will it fit? The peak memory of a training step (or an inference pass with a KV
cache) predicted on fake tensors, for each configuration asked for, without allocating the model
(job.py; the declaration here and its result type, result.py, have no torch)."""

from diagnostics.analyses.plan.configs import CHECKPOINTING, DTYPES, KV_DTYPES, MODES, OPTIMIZER_NAMES, SHARDING, \
    budget_option, seq_option, sizes_option
from diagnostics.analyses.plan.result import PlanResult
from diagnostics.analyses.plan.targets import check_name
from diagnostics.declare import Analysis, Option

ANALYSIS = Analysis(
    name="plan", title="Memory plan", target="diagnostics.analyses.plan.job:analyze", command="plan",
    timeout_s=900, result=PlanResult, view="ui.views.plan:show", report="diagnostics.render.charts.plan:plan_sections",
    text="diagnostics.render.charts.plan:plan_text",
    description="will it fit: the peak memory of a training step per batch, sequence, dtype, optimizer, "
                "checkpointing and sharding, predicted on fake tensors without allocating the model",
    options=(
        Option("batch", "str", "", "batch sizes to plan, comma-separated (e.g. 1,2,4,8); empty: the model's own",
               flag="--batch", check=sizes_option("batch"), label="Batch sizes"),
        Option("seq", "str", "", "sequence lengths to plan, comma-separated (e.g. 2048,4096): for every token "
               "input, or NAME=LENGTHS for one input alone (e.g. decoder_input_ids=16,32); empty: each input "
               "keeps its own length", flag="--seq", check=seq_option, label="Sequence lengths"),
        Option("dtype", "multi", ["fp32"], "precision: " + "; ".join(f"{d.name} = {d.label}" for d in DTYPES.values()),
               choices=tuple(DTYPES), label="Precision"),
        Option("optimizer", "multi", ["adamw"], "optimizers (sgd = SGD with momentum 0.9, as everywhere in "
               "TorchScope; adamw_fused = AdamW(fused=True))", choices=OPTIMIZER_NAMES, label="Optimizer"),
        Option("checkpointing", "multi", ["none"], "activation checkpointing: " +
               "; ".join(f"{k} = {v}" for k, v in CHECKPOINTING.items()), choices=tuple(CHECKPOINTING),
               label="Checkpointing"),
        Option("checkpoint_modules", "str", "", "for checkpointing 'selected': module names or fnmatch patterns, "
               "comma-separated (e.g. model.model.layers.*)", label="Checkpointed modules"),
        Option("shard", "multi", ["none"], "sharding over --ranks: " + "; ".join(f"{k} = {v}" for k, v in SHARDING.items()),
               choices=tuple(SHARDING), label="Sharding"),
        Option("ranks", "int", None, "ranks (GPUs) the sharding spreads over; needed with any sharding",
               lo=1, hi=65536, optional=True, label="Ranks"),
        Option("offload", "bool", False, "optimizer state and step on the CPU (ZeRO-Offload): not on the device"),
        Option("mode", "choice", "train", "train: one training step; inference: a forward pass (decoders: a "
               "prompt of --seq tokens into a KV cache, then one generated token)", choices=MODES),
        Option("kv_dtype", "choice", "model", "inference: the KV cache's element type (model: as the model computes)",
               choices=KV_DTYPES, label="KV cache dtype"),
        Option("device", "str", "auto", "the device to fit: a name from the table (H100-80GB, H200-141GB, "
               "A100-80GB, A100-40GB, L4-24GB, RTX4090-24GB, ...), local (this machine's GPU, by NVML), cpu (this "
               "machine's memory), cpu:64GiB, or a GPU's capacity such as 48GB; auto: the local GPU, else cpu", flag="--device",
               check=check_name, label="Device"),
        Option("sweep", "bool", True, "the largest batch that fits per sequence length, the batch x sequence "
               "grid and the make-it-fit suggestions (a few more traces)"),
        Option("max_batch", "int", 4096, "the largest batch the sweep considers", lo=1, hi=1 << 20),
        Option("budget", "str", "", "fit in this much memory (e.g. 6GiB, 500MB, or bytes): which modules to "
               "checkpoint so the predicted peak fits, at the least recompute time (the result's 'fit')",
               flag="--budget", check=budget_option, label="Fit in"),
    ),
)
