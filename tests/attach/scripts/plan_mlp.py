"""An MLP trained with Adam on synthetic data (run --plan's test, tests/attach/test_attach_plan.py): the script's
own seed, cross-entropy, a loss printed every 10 steps. By default its weights and Adam state are a few MB each
(the step peaks in the optimizer); ``--activations``: narrow layers and a large batch (the step peaks in
backward); ``--amp``: the forward under CPU bf16 autocast; ``--own-loss``: a loss of the script's own making (a squared
error against the one-hot labels, summed: autograd nodes the plan does not replay, so it uses its stand-in);
``--cuda``: on the GPU. At its end it writes to $SELF_TIMING (JSON) the ``diagnostics`` modules its process holds, its
parameters' and Adam state's sums (to the bit: float.hex), the hooks and attributes on its modules and optimizer,
and whether the model pickles: what an attached run must leave as bare."""
import json
import os
import pickle
import sys

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
wide = "--activations" not in sys.argv
width, batch = (1024, 512) if wide else (192, 2048)
model = nn.Sequential(nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width),
                      nn.ReLU(), nn.Linear(width, 10))
device = "cuda" if "--cuda" in sys.argv else "cpu"
model = model.to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(40):
    x = torch.randn(batch, 256, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    opt.zero_grad()
    with torch.autocast(device, dtype=torch.bfloat16, enabled="--amp" in sys.argv):
        if "--own-loss" in sys.argv:
            loss = (model(x) - nn.functional.one_hot(y, 10)).pow(2).sum()
        else:
            loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.6f}", flush=True)
if os.environ.get("SELF_TIMING"):
    with open(os.environ["SELF_TIMING"], "w") as f:
        json.dump({"engine_modules": sorted(m for m in sys.modules if m.split(".")[0] == "diagnostics"),
                   "params": float(sum(p.double().sum() for p in model.parameters())).hex(),
                   "state": float(sum(v.double().sum() for s in opt.state.values() for v in s.values())).hex(),
                   "hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
                                for m in model.modules()),
                   "attributes": sorted({k for m in model.modules() for k in vars(m)} | set(vars(opt))),
                   "pickles": len(pickle.dumps(model)) > 0}, f)
