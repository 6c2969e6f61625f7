"""A closure of the script's own: LBFGS (max_iter 4) fits a small MLP, each optimizer step calling the closure
(forward, backward) several times inside it. The script prints each step's loss with full precision and
records, per step, the gradient norms its closure's first call computed and how many calls the step made.
CRASH_AT=K: the closure's second call in step K (from 1) raises, uncaught: the script dies of it."""
import os

import torch
from torch import nn

from common import leftovers, save

STEPS = int(os.environ.get("STEPS", "8"))
CRASH_AT = int(os.environ.get("CRASH_AT", "0"))


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    x = torch.randn(64, 4)
    y = x.sum(dim=1, keepdim=True)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    calls, first_norms = [], []
    for step in range(STEPS):
        calls.append(0)

        def closure():
            if step + 1 == CRASH_AT and calls[-1] == 1:
                raise RuntimeError(f"the closure failed in step {step + 1}")
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            if calls[-1] == 0:
                first_norms.append({n: p.grad.norm().item() for n, p in model.named_parameters()})
            calls[-1] += 1
            return loss

        loss = opt.step(closure)
        print(f"step {step} loss {loss.item()!r}", flush=True)
    save({"steps": STEPS, "closure_calls": calls, "grad_norms": first_norms, "leftovers": leftovers(model, opt)})


if __name__ == "__main__":
    main()
