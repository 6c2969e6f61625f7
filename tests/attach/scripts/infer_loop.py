"""Inference without a DataLoader: an nn.Sequential called in a torch.no_grad() loop for SECONDS seconds
(each forward sleeps FORWARD_MS in a module of its own); times its own iterations (median)."""
import os
import time

import torch
from torch import nn

from common import save

FORWARD_MS, SECONDS = float(os.environ.get("FORWARD_MS", "20")), float(os.environ.get("SECONDS", "4"))


class Sleep(nn.Module):
    def forward(self, x):
        time.sleep(FORWARD_MS / 1e3)
        return x


def main():
    model = nn.Sequential(nn.Linear(8, 8), Sleep(), nn.ReLU(), nn.Linear(8, 2))
    x, times, t0 = torch.randn(4, 8), [], time.perf_counter()
    with torch.no_grad():
        while time.perf_counter() - t0 < SECONDS:
            t = time.perf_counter()
            model(x)
            times.append((time.perf_counter() - t) * 1e3)
    save({"iterations": len(times), "iter_ms": sorted(times)[len(times) // 2]})


if __name__ == "__main__":
    main()
