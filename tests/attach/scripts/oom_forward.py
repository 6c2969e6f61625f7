"""Trains a small model with Adam for a few steps, then dies of out-of-memory in forward at step OOM_AT (default
7): its forward asks for 1 << 48 float32s (1 PiB), which the CPU allocator cannot give ("DefaultCPUAllocator:
can't allocate memory"). An attached run must end exactly as this bare one and report the OOM
(tests/attach/test_attach_oom.py). Gradients are zeroed, not freed (zero_grad(set_to_none=False)), so they are
held at the failure. The sentinel allocation is asked for at that step only: the flag is put back as the
exception leaves the step (the planner's fake replay of the step, made afterwards, does not meet it).
OOM_IN=backward: the allocation is asked for in backward instead (a hook on the body's output's gradient);
OOM_IN=optimizer: in the optimizer's step (a step pre-hook of the script's own); OOM_IN=data: in the
DataLoader's fetch of the step's batch (num_workers=0: in the main process). ``--cuda``: on the GPU, where
the allocation raises torch.OutOfMemoryError ("CUDA out of memory")."""
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

OOM_AT = int(os.environ.get("OOM_AT", "7"))
OOM_IN = os.environ.get("OOM_IN", "forward")
DEVICE = "cuda" if "--cuda" in sys.argv else "cpu"
BATCH = 16
BLOW_UP = False


def blow_up(where: str) -> None:
    if BLOW_UP and OOM_IN == where:
        torch.empty(1 << 48, device=DEVICE)  # 1 PiB of float32: more than any machine has


class Samples(Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        blow_up("data")
        return torch.randn(32)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 64))
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        h = self.body(x)
        blow_up("forward")
        if BLOW_UP and OOM_IN == "backward":
            h.register_hook(lambda g: blow_up("backward"))
        return self.head(h)


def main():
    global BLOW_UP
    torch.manual_seed(0)
    model = Net().to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt.register_step_pre_hook(lambda *_: blow_up("optimizer"))
    print("training", flush=True)
    batches = iter(DataLoader(Samples(), batch_size=BATCH))
    for step in range(1, 100):
        BLOW_UP = step == OOM_AT
        try:
            x = next(batches).to(DEVICE)
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
        finally:
            BLOW_UP = False
        opt.zero_grad(set_to_none=False)
        if step % 3 == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
