"""DataLoader-bound: every sample sleeps SAMPLE_MS in __getitem__ (num_workers from argv[1], default 0);
the model is tiny. The dataset times its own sleeps: per batch, the sum over the batch's samples."""
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from common import save

SAMPLE_MS = float(os.environ.get("SAMPLE_MS", "3"))
BATCH = 4
STEPS = int(os.environ.get("STEPS", "30"))
WORKERS = int(sys.argv[1]) if len(sys.argv) > 1 else 0


class Sleepy(Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        t = time.perf_counter()
        time.sleep(SAMPLE_MS / 1e3)
        return torch.randn(8), torch.tensor(i % 2), time.perf_counter() - t


def main():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    loader = DataLoader(Sleepy(), batch_size=BATCH, num_workers=WORKERS)
    slept = []
    for step, (x, y, s) in enumerate(loader):
        slept.append(float(s.sum()) * 1e3)  # this batch's sleeps, timed by the dataset itself
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step + 1 == STEPS:
            break
    save({"batch_sleep_ms": sorted(slept)[len(slept) // 2], "steps": STEPS, "workers": WORKERS})


if __name__ == "__main__":
    main()
