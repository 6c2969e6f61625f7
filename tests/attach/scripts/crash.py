"""Crashes at step CRASH_AT with its own error (after printing to stdout and stderr)."""
import os
import sys

import torch
from torch import nn

CRASH_AT = int(os.environ.get("CRASH_AT", "12"))


def train_step(model, opt, step):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == CRASH_AT:
        raise RuntimeError(f"the loss went bad at step {step}")


def main():
    print("training", flush=True)
    print("a warning of the script's own", file=sys.stderr, flush=True)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 100):
        train_step(model, opt, step)


if __name__ == "__main__":
    main()
