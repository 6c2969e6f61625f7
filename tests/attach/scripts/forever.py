"""Trains forever with two DataLoader workers: only Stop / Ctrl-C ends it. Prints its pid and its
workers' pids once they exist."""
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.randn(4), os.getpid()


def main():
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    told = set()
    for x, pids in DataLoader(Slow(), batch_size=4, num_workers=2):
        for p in set(pids.tolist()) - told:
            told.add(p)
            print("worker pid", p, flush=True)
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    print("main pid", os.getpid(), flush=True)
    main()
