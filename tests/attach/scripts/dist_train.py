"""Two ranks (gloo, CPU) averaging gradients with all_reduce; rank 1 does SLOW_MS more work per step
(a sleep it times itself), so rank 0 waits for it in the collective."""
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from common import save

SLOW_MS = float(os.environ.get("SLOW_MS", "40"))
STEPS = int(os.environ.get("STEPS", "20"))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    slept = []
    for _ in range(STEPS):
        model(torch.randn(8, 16)).pow(2).mean().backward()
        if rank == 1:
            t = time.perf_counter()
            time.sleep(SLOW_MS / 1e3)
            slept.append((time.perf_counter() - t) * 1e3)
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
    if rank == 1:
        save({"slow_ms": sorted(slept)[len(slept) // 2]})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
