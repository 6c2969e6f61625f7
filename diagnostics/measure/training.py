"""Training-step plumbing shared by the memory, batch-scan and gradient analyses.

``make_optimizer`` builds the optimizer a user picked, ``train_step`` runs one
zero_grad/forward/loss/backward/step, ``restored_state`` puts the weights back afterwards so an
analysis that trains leaves the loaded model as it found it, and the ``*_bytes`` helpers size
what a model keeps resident (each storage counted once).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from diagnostics.errors import TorchScopeError

OPTIMIZERS = ("sgd", "adamw")
SGD_MOMENTUM = 0.9  # SGD keeps one momentum buffer per parameter
#: Optimizer state kept per parameter byte: SGD with momentum one buffer, AdamW exp_avg + exp_avg_sq.
STATE_PER_PARAM = {"sgd": 1, "adamw": 2}


def make_optimizer(params, name: str, lr: float) -> torch.optim.Optimizer:
    name = str(name).lower()
    if name not in OPTIMIZERS:
        raise TorchScopeError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    if not (float(lr) > 0):
        raise TorchScopeError(f"learning rate must be positive, got {lr}")
    params = [p for p in params if p.requires_grad]
    if not params:
        raise TorchScopeError("the model has no trainable parameters: nothing to train")
    if name == "sgd":
        return torch.optim.SGD(params, lr=float(lr), momentum=SGD_MOMENTUM)
    return torch.optim.AdamW(params, lr=float(lr))


def unique_params(model: nn.Module) -> list[nn.Parameter]:
    return list({id(p): p for p in model.parameters()}.values())


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and tied weights counted once)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        try:
            storage = t.untyped_storage()
            key, n = (storage.data_ptr(), t.device), storage.nbytes()
        except (RuntimeError, NotImplementedError):  # sparse / functional tensors: size by elements
            key, n = id(t), t.numel() * t.element_size()
        if key in seen:
            continue
        seen.add(key)
        total += n
    return total


def param_bytes(model: nn.Module) -> int:
    return tensor_bytes(unique_params(model))


def buffer_bytes(model: nn.Module) -> int:
    return tensor_bytes(model.buffers())


def grad_bytes(model: nn.Module) -> int:
    return tensor_bytes(p.grad for p in unique_params(model))


def optimizer_state_bytes(opt: torch.optim.Optimizer | None) -> int:
    if opt is None:
        return 0
    return tensor_bytes(v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor))


def trainable_bytes(model: nn.Module) -> int:
    return tensor_bytes(p for p in unique_params(model) if p.requires_grad)


def train_step(loaded, opt: torch.optim.Optimizer | None, inputs=None) -> float:
    """One step: zero_grad(set_to_none), forward, loss, backward, optimizer step. Returns the loss."""
    if opt is not None:
        opt.zero_grad(set_to_none=True)
    loss = loaded.loss_fn(loaded.forward(inputs))
    loss.backward()
    if opt is not None:
        opt.step()
    return float(loss.detach())


@contextmanager
def restored_state(model: nn.Module):
    """Train freely inside; weights, buffers, grads and ``model.training`` come back afterwards.

    The copy lives on the CPU so that device memory figures measured inside do not include it.
    """
    was_training = model.training
    saved = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict(keep_vars=True).items()
             if isinstance(v, torch.Tensor)}
    try:
        yield
    finally:
        with torch.no_grad():
            own = model.state_dict(keep_vars=True)
            for k, v in saved.items():
                if k in own and isinstance(own[k], torch.Tensor) and own[k].shape == v.shape:
                    own[k].copy_(v)
        for p in model.parameters():
            p.grad = None
        model.train(was_training)
