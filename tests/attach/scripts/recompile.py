"""torch.compile (eager backend: no compiler needed) on a model whose batch size changes after step
CHANGE_AT: a recompile after warm-up, in that step."""
import os

import torch
from torch import nn

CHANGE_AT = int(os.environ.get("CHANGE_AT", "10"))


def main():
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model, backend="eager")
    for step in range(1, 15):
        n = 16 if step < CHANGE_AT else 40
        compiled(torch.randn(n, 8)).sum().backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
