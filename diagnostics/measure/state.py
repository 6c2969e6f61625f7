"""Measure on the user's model itself, then put it back as it was.

Analyses that train or switch modes (memory, batch scan, gradient flow, the checklist's probes)
work on the loaded model, not on a deep copy: on a GPU a copy sits beside the original, so a peak
measured on it counts the weights twice, and a model that holds something copy.deepcopy cannot copy
(a lock, a file) could not be measured at all. ``restored_state`` keeps one copy in host memory,
which no device measurement sees, and restores from it.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn


@contextmanager
def restored_state(model: nn.Module):
    """Train freely inside; afterwards every parameter's and buffer's values (from one copy in host
    memory), the tensor objects each module holds under those names (so optimizers and tied weights
    still point at them), the gradients (the original tensors, None included) and each module's own
    train/eval mode (a frozen BatchNorm in a training model stays frozen) come back. Python
    attributes a model changes in its own forward are not tracked."""
    host: dict[int, torch.Tensor] = {}
    slots = []  # (the dict that holds the tensor, its key, the tensor)
    for m in model.modules():
        for held in (m._parameters, m._buffers):
            for k, t in list(held.items()):
                if isinstance(t, torch.Tensor):
                    slots.append((held, k, t))
                    if id(t) not in host:
                        host[id(t)] = t.detach().to("cpu", copy=True)
    grads = [(p, p.grad) for p in model.parameters()]
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        with torch.no_grad():
            for held, k, t in slots:
                if k not in held or held[k] is not t:  # something replaced (or dropped) it
                    held[k] = t
                saved = host[id(t)]
                if t.shape == saved.shape:
                    t.copy_(saved)
        for p, g in grads:
            p.grad = g
        for m, training in modes:
            m.training = training
