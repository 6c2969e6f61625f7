"""An MLP whose activations and Adam state are a few MB each (run --plan's test, tests/attach/test_attach_plan.py):
synthetic data, the script's own seed, cross-entropy, Adam; it prints its loss every 10 steps."""
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024),
                      nn.ReLU(), nn.Linear(1024, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(40):
    x = torch.randn(512, 256)
    y = torch.randint(0, 10, (512,))
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.6f}", flush=True)
