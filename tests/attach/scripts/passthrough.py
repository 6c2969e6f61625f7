"""Prints its argv, working folder, an environment variable and a line read from stdin; runs a few
steps; exits with EXIT_CODE."""
import os
import sys

import torch
from torch import nn

print("argv:", sys.argv[1:])
print("cwd:", os.getcwd())
print("env:", os.environ.get("MY_SETTING"))
print("stdin:", sys.stdin.readline().strip())
model = nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(8):
    model(torch.randn(4, 2)).sum().backward()
    opt.step()
    opt.zero_grad()
print("sys.path[0]:", sys.path[0])
sys.stdout.flush()
sys.exit(int(os.environ.get("EXIT_CODE", "7")))
