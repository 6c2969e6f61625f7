"""Inference: a model's forward over DataLoader batches, no optimizer; each forward sleeps FORWARD_MS
inside the model (timed by the model itself)."""
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from common import save

FORWARD_MS = float(os.environ.get("FORWARD_MS", "20"))
BATCHES = int(os.environ.get("BATCHES", "200"))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)
        self.slept = []

    def forward(self, x):
        t = time.perf_counter()
        time.sleep(FORWARD_MS / 1e3)
        self.slept.append((time.perf_counter() - t) * 1e3)
        return self.fc(x)


def main():
    net = Net().eval()
    loader = DataLoader(TensorDataset(torch.randn(BATCHES * 4, 8)), batch_size=4)
    with torch.no_grad():
        for (x,) in loader:
            net(x)
    save({"forward_ms": sorted(net.slept)[len(net.slept) // 2], "batches": BATCHES})


if __name__ == "__main__":
    main()
