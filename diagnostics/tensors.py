"""What a model and its outputs hold: tensors found in nested outputs, their shapes, and the bytes
a model keeps resident (parameters, buffers, gradients, optimizer state), each storage counted once
(views and tied weights are not counted twice)."""

from __future__ import annotations

import torch
from torch import nn


def iter_tensors(x):
    """Every tensor in a (nested) tuple, list or dict output."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (tuple, list)):
        for v in x:
            yield from iter_tensors(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from iter_tensors(v)


def shape_of(x):
    """The shape of a tensor as a list, nested like the (tuple, list, dict) output; None otherwise."""
    if isinstance(x, torch.Tensor):
        return list(x.shape)
    if isinstance(x, (tuple, list)):
        return [shape_of(v) for v in x]
    if isinstance(x, dict):
        return {k: shape_of(v) for k, v in x.items()}
    return None


def tensor_key(t: torch.Tensor):
    """What makes two tensors the same weights: the same object, or the same view of one storage.

    torch.export save/load gives tied weights (an LM head tied to its embedding) back as two
    Parameter objects over one storage: counted by object they would be counted twice."""
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        ptr = 0
    if not ptr:  # meta, fake or empty tensors have no storage to share: the object is the key
        return ("id", id(t))
    return ("view", ptr, str(t.device), t.storage_offset(), tuple(t.shape), tuple(t.stride()), str(t.dtype))


def unique_params(model: nn.Module) -> list[nn.Parameter]:
    """Each distinct parameter once (tied weights, also tied through a shared storage, counted once)."""
    return list({tensor_key(p): p for p in (p for _, p in model.named_parameters(remove_duplicate=False))}.values())


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and tied weights counted once)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        try:
            storage = t.untyped_storage()
            key, n = (storage.data_ptr(), t.device), storage.nbytes()
            if not key[0]:  # meta or fake tensors have no storage to share: each tensor is its own
                key, n = id(t), t.numel() * t.element_size()
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


def fake_mode():
    """A FakeTensorMode in which a model on the meta device runs (a Hugging Face config too big for
    this machine): shapes and FLOPs without allocating memory."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)
