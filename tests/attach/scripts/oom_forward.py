"""Trains a small model with Adam for a few steps, then dies of out-of-memory in forward at step OOM_AT (default
7): its forward asks for 1 << 48 float32s (1 PiB), which the CPU allocator cannot give ("DefaultCPUAllocator:
can't allocate memory"). An attached run must end exactly as this bare one and report the OOM
(tests/attach/test_attach_oom.py). Gradients are zeroed, not freed (zero_grad(set_to_none=False)), so they are
held at the failure. The sentinel allocation is asked for at that step only: the flag is put back as the
exception leaves the step (the planner's fake replay of the step, made afterwards, does not meet it)."""
import os
import sys

import torch
from torch import nn

OOM_AT = int(os.environ.get("OOM_AT", "7"))
BATCH = 16
BLOW_UP = False


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 64))
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        h = self.body(x)
        if BLOW_UP:
            torch.empty(1 << 48)  # 1 PiB of float32: more than any machine has
        return self.head(h)


def main():
    global BLOW_UP
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    print("training", flush=True)
    for step in range(1, 100):
        x = torch.randn(BATCH, 32)
        BLOW_UP = step == OOM_AT
        try:
            loss = model(x).pow(2).mean()
        finally:
            BLOW_UP = False
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        if step % 3 == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
