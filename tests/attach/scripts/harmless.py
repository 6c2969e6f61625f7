"""Do no harm: a torch.optim training loop that, after every step, checks that nothing is left on its
model, optimizer or DataLoader iterator: the model pickles (torch.save), deep-copies and scripts
(torch.jit.script), compiles (torch.compile's dynamo), its hook dicts are empty, and the objects' attributes are the bare ones. Writes
per step what it found, and its losses to stdout."""
import copy
import io
import os
import pickle

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from common import save

STEPS = int(os.environ.get("STEPS", "12"))
#: What torch itself sets on a module, bare too: torch.jit.script's cache, torch.compile's mark.
TORCHS_OWN = ("__overloads__", "_is_torch_compile")


def hooks_on(model: nn.Module) -> list:
    names = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
             "_state_dict_hooks", "_load_state_dict_pre_hooks", "_forward_hooks_with_kwargs")
    return [f"{n}.{k}" for n, m in model.named_modules() for k in names if getattr(m, k, None)]


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    attrs = {n: set(vars(m)) for n, m in model.named_modules()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt_attrs = set(vars(opt))
    data = TensorDataset(torch.randn(STEPS * 4, 8), torch.randint(0, 2, (STEPS * 4,)))
    loader = DataLoader(data, batch_size=4)
    it = iter(loader)
    it_attrs = set(vars(it))
    checks = []
    for step in range(1, STEPS + 1):
        x, y = next(it)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.10f}", flush=True)
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        back = torch.load(buf, weights_only=False)
        same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))
        checks.append({
            "step": step, "hooks": hooks_on(model), "pickles": len(pickle.dumps(model)) > 0, "saved": same,
            "deepcopy": isinstance(copy.deepcopy(model), nn.Sequential),
            "scripted": torch.jit.script(model)(x).shape == (4, 2),
            "extra_attrs": sorted(f"{n}.{a}" for n, m in model.named_modules() for a in set(vars(m)) - attrs[n]
                                  if a not in TORCHS_OWN),
            "opt_attrs": sorted(set(vars(opt)) - opt_attrs), "opt_hooks": len(opt._optimizer_step_pre_hooks)
            + len(opt._optimizer_step_post_hooks), "iter_attrs": sorted(set(vars(it)) - it_attrs),
            "opt_pickles": len(pickle.dumps(opt.state_dict())) > 0,
            # torch.compile's front end (dynamo, no C++ compiler needed): before, in and after the window
            "compiled": torch.equal(torch.compile(model, backend="eager")(x), model(x)) if step in (2, 5, 10)
            else True})
    save({"checks": checks, "steps": STEPS})


if __name__ == "__main__":
    main()
