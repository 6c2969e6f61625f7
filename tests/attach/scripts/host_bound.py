"""Python-bound: each step spins HOST_MS in pure Python between the model's calls (logging, metrics, a
per-sample loop in real scripts), timed by the script itself; the model and data are tiny."""
import os
import time

import torch
from torch import nn

from common import save

HOST_MS = float(os.environ.get("HOST_MS", "15"))
STEPS = int(os.environ.get("STEPS", "30"))


def busy(ms):
    t = time.perf_counter()
    x = 0
    while time.perf_counter() - t < ms / 1e3:
        x += 1
    return time.perf_counter() - t


def main():
    model = nn.Linear(16, 4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    spun = []
    for _ in range(STEPS):
        x = torch.randn(8, 16)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        spun.append(busy(HOST_MS) * 1e3)
    save({"host_ms": sorted(spun)[len(spun) // 2], "steps": STEPS})


if __name__ == "__main__":
    main()
