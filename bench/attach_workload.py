"""The load of bench/bench_attach.py: an MLP trained on random data through a DataLoader, each step
timed by the script itself (the median goes to the file named by SELF_TIMING)."""
import json
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

STEPS = int(os.environ.get("STEPS", "300"))


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    data = TensorDataset(torch.randn(STEPS * 64, 256), torch.randint(0, 10, (STEPS * 64,)))
    times = []
    t = time.perf_counter()
    for x, y in DataLoader(data, batch_size=64):
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        now = time.perf_counter()
        times.append((now - t) * 1e3)
        t = now
    steady = sorted(times[10:])
    if os.environ.get("SELF_TIMING"):
        with open(os.environ["SELF_TIMING"], "w") as f:
            json.dump({"step_ms": steady[len(steady) // 2], "steps": len(times)}, f)


if __name__ == "__main__":
    main()
