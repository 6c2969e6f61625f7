"""A data-bound training script (written for TorchScope's fix-trial tests): a DataLoader with num_workers=0
whose samples take milliseconds each to load (time.sleep: a read from a slow disk), a small MLP, SGD.
``python data_bound.py [epochs]``; ``--fail-workers`` makes its dataset fail inside DataLoader workers."""

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)
torch.set_num_threads(1)


class SlowSamples(Dataset):
    def __len__(self):
        return 2048

    def __getitem__(self, i):
        time.sleep(0.002)  # reading the sample
        if "--fail-workers" in sys.argv and torch.utils.data.get_worker_info() is not None:
            raise RuntimeError("this dataset cannot be read from a worker process")
        g = torch.Generator().manual_seed(i)
        x = torch.randn(32, generator=g)
        return x, int(x.sum() > 0)


model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
loader = DataLoader(SlowSamples(), batch_size=16, shuffle=True, num_workers=0)
epochs = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 1
for epoch in range(epochs):
    for step, (x, y) in enumerate(loader):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
