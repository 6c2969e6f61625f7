"""A small CNN of repeated blocks on 4-D inputs, synthetic data, Adam: the fixes that need a 4-D tensor, repeated
blocks or a fused optimizer can act on it. ``--cuda``: on the GPU."""
import sys

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.norm = nn.BatchNorm2d(c)

    def forward(self, x):
        return x + torch.relu(self.norm(self.conv(x)))


class Net(nn.Module):
    def __init__(self, c=8, n=3):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.ModuleList(Block(c) for _ in range(n))
        self.head = nn.Linear(c, 4)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x.mean((2, 3)))


device = "cuda" if "--cuda" in sys.argv else "cpu"
model = Net().to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(200):
    x = torch.randn(8, 3, 16, 16, device=device)
    y = torch.randint(0, 4, (8,), device=device)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=False)
    loss.backward()
    opt.step()
