"""The optimizers a training step can use, by the name users pick, and what each one keeps.

One meaning everywhere (the profiler, memory, batch scan, gradient flow, the checklist, the
distributed ranks): "sgd" is torch.optim.SGD with momentum SGD_MOMENTUM (one state buffer per
parameter), "adamw" is torch.optim.AdamW (two). No torch here: the declarations offer these names
as choices without importing it; ``diagnostics.measure.training.make_optimizer`` builds them.
"""

OPTIMIZERS = ("sgd", "adamw")
SGD_MOMENTUM = 0.9
#: Optimizer state kept per trainable parameter byte: SGD with momentum one buffer, AdamW exp_avg + exp_avg_sq.
STATE_PER_PARAM = {"sgd": 1, "adamw": 2}
DESCRIPTION = {"sgd": f"SGD (momentum {SGD_MOMENTUM})", "adamw": "AdamW"}
