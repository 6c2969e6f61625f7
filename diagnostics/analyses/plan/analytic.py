"""Closed forms and stand-ins: what the plan counts without tracing.

* ``static_bytes``: parameters, gradients and optimizer state from the parameters' shapes alone, per
  dtype and optimizer (the closed form the tests hold the traced figures to).
* ``stand_in``: a module fake tracing fails in (a data-dependent op, an op without a fake kernel) is
  replaced for the trace by a stand-in whose output is shaped like its input and which keeps, for
  backward, the bytes ``estimate_saved`` gives: every token through each parametrised layer once,
  saving that layer's input (tokens x fan-in x element size), and each parameter-free leaf saving
  its input. A rough upper bound for routed layers (a mixture of experts sends each token through
  top-k experts, not all), named as an estimate in every result it enters.
* ``to_float8``: torchao's Float8Linear for the fp8 recipe.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from diagnostics.errors import TorchScopeError

SCALAR_STEP_BYTES = 4  # torch.optim keeps a float32 ``step`` tensor per parameter (Adam, AdamW, Adafactor)


def _numel(shape) -> int:
    return int(math.prod(shape)) if len(shape) else 1


def optimizer_state_elements(name: str, shape) -> tuple[int, int]:
    """(elements in the parameter's dtype, scalar step tensors) the optimizer keeps for one parameter."""
    n = _numel(shape)
    if name == "sgd":
        return n, 0
    if name == "sgd_nomomentum":
        return 0, 0
    if name in ("adam", "adamw", "adamw_fused"):
        return 2 * n, 1
    if name == "adafactor":
        if len(shape) > 1:
            row = list(shape)
            row[-1] = 1
            col = list(shape)
            col[-2] = 1
            return _numel(row) + _numel(col), 1
        return n, 1
    raise TorchScopeError(f"unknown optimizer {name!r}")


def static_bytes(params, optimizer: str, element_size: int) -> dict:
    """Closed form of what a training step keeps whatever the batch: {"parameters", "gradients",
    "optimizer state", "optimizer steps"} in bytes, for ``params`` (shapes; trainable ones) whose
    elements take ``element_size`` bytes. Optimizer state is kept in the parameters' dtype."""
    p = g = s = steps = 0
    for shape, trainable in params:
        n = _numel(shape)
        p += n * element_size
        if trainable:
            g += n * element_size
            elems, k = optimizer_state_elements(optimizer, shape)
            s += elems * element_size
            steps += k * SCALAR_STEP_BYTES
    return {"parameters": p, "gradients": g, "optimizer state": s, "optimizer steps": steps}


# ----------------------------------------------------------------------------- stand-ins
def _first_tensor(args, kwargs) -> torch.Tensor | None:
    for x in list(args) + list(kwargs.values()):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x
    for x in list(args) + list(kwargs.values()):
        if isinstance(x, torch.Tensor):
            return x
    return None


def estimate_saved(module: nn.Module, x: torch.Tensor) -> int:
    """Bytes ``module`` keeps for backward on input ``x`` (see the module doc: an estimate). Token ids
    (integers) count as one token each."""
    floats = [p for p in module.parameters() if p.is_floating_point()]
    elt = x.element_size() if x.is_floating_point() else (floats[0].element_size() if floats else 4)
    if x.is_floating_point():
        width = x.shape[-1] if x.dim() else 1
        tokens = max(1, x.numel() // max(1, width))
    else:
        tokens = max(1, x.numel())
        emb = next((m for m in module.modules() if isinstance(m, nn.Embedding)), None)
        width = emb.embedding_dim if emb is not None else 1
    total = 0
    for m in module.modules():
        if list(m.children()):
            continue
        own = [p for p in m.parameters(recurse=False)]
        if isinstance(m, nn.Linear):
            total += tokens * m.in_features * elt
        elif isinstance(m, nn.Embedding):
            total += tokens * 8
        elif own:
            # a leaf with its own weights (an expert bank, a convolution): its input, once per weight matrix
            mats = [p for p in own if p.dim() >= 2]
            total += sum(tokens * p.shape[-1] * elt for p in mats) or tokens * width * elt
        else:
            total += tokens * width * elt
    return int(total)


class _StandIn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, nbytes: int, shape, dtype, x, *params):
        keep = torch.empty(int(nbytes), dtype=torch.uint8, device=x.device)
        ctx.save_for_backward(keep)
        ctx.shapes = [(p.shape, p.dtype) for p in params]
        ctx.x = (x.shape, x.dtype) if x.is_floating_point() else None
        return torch.empty(shape, dtype=dtype, device=x.device)

    @staticmethod
    def backward(ctx, grad):
        (_keep,) = ctx.saved_tensors
        gx = torch.empty(ctx.x[0], dtype=ctx.x[1], device=grad.device) if ctx.x is not None else None
        return (None, None, None, gx) + tuple(torch.empty(s, dtype=d, device=grad.device) for s, d in ctx.shapes)


def stand_in(module: nn.Module, why: str, output=None) -> None:
    """Replace ``module``'s forward (on a plan's throw-away copy) by the estimate (see the module doc).
    ``output(x) -> (shape, dtype)``: its output's shape (default: the input's, in its dtype)."""
    params = [p for p in module.parameters() if p.requires_grad]

    def forward(*args, **kwargs):
        x = _first_tensor(args, kwargs)
        if x is None:
            raise TorchScopeError(f"{type(module).__name__} takes no tensor input: no analytic stand-in for it")
        shape, dtype = output(x) if output is not None else (tuple(x.shape), x.dtype)
        return _StandIn.apply(estimate_saved(module, x), shape, dtype, x, *params)

    module.forward = forward
    module._plan_standin = why


def model_output(loaded, model: nn.Module):
    """For a whole-model stand-in: the output's (shape, dtype) from the task (classification: batch x
    classes; a language model: batch x tokens x vocabulary), or None when the task does not say."""
    floats = [p for p in model.parameters() if p.is_floating_point()]
    dtype = floats[0].dtype if floats else torch.float32
    n = loaded.num_classes
    if not n or loaded.task not in ("classification", "lm"):
        return None
    if loaded.task == "classification":
        return lambda x: ((x.shape[0], n), dtype)
    return lambda x: ((x.shape[0], x.shape[1], n) if x.dim() >= 2 else (x.shape[0], n), dtype)


# ----------------------------------------------------------------------------- fp8
def to_float8(model: nn.Module) -> None:
    """torchao's Float8Linear in place of each nn.Linear (tensorwise scaling), as fp8 training recipes do."""
    try:
        from torchao.float8 import convert_to_float8_training
    except Exception as e:
        raise TorchScopeError(f"fp8 training needs torchao's Float8Linear (pip install torchao): {e}") from e
    try:
        convert_to_float8_training(model)
    except Exception as e:
        raise TorchScopeError(f"fp8: torchao could not convert this model's Linear layers: {type(e).__name__}: {e}") \
            from e
