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

#: Every optimizer the memory planner (analyses/plan) models; the two above keep their meaning ("sgd" is
#: still SGD with momentum). "adamw_fused" is AdamW(fused=True); "adafactor" torch.optim.Adafactor,
#: whose state is factored (a row and a column vector per matrix), so it has no fixed multiple.
ALL_OPTIMIZERS = ("sgd", "sgd_nomomentum", "adam", "adamw", "adamw_fused", "adafactor")
DESCRIPTION.update({"sgd_nomomentum": "SGD (no momentum)", "adam": "Adam", "adamw_fused": "AdamW (fused)",
                    "adafactor": "Adafactor"})
#: State buffers per trainable parameter of ALL_OPTIMIZERS (None: Adafactor's factored state; see
#: analyses/plan/analytic.optimizer_state_bytes). Each also keeps a scalar ``step`` tensor per parameter
#: (Adam, AdamW, Adafactor), which these multiples leave out.
STATE_MULTIPLE = {"sgd": 1, "sgd_nomomentum": 0, "adam": 2, "adamw": 2, "adamw_fused": 2, "adafactor": None}
