"""The one training step, and the optimizers it can use.

``make_optimizer`` builds the optimizer a user picked by name (``measure.optimizers``: "sgd" is SGD
with momentum everywhere); ``Step`` is one inference forward or one training step (zero_grad,
forward, loss, backward, optimizer step), optionally with a profiler range around each phase, as
the profiler, the checklist, memory, the batch scan and the gradient flow all run it. A user's loss
or backward that raises is reported as a ModelRunError naming the phase.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from diagnostics.errors import ModelRunError, TorchScopeError
from diagnostics.measure.optimizers import ALL_OPTIMIZERS, OPTIMIZERS, SGD_MOMENTUM
from diagnostics.trace.classify import STEP_PHASES

ZERO_GRAD, FORWARD, BACKWARD, OPTIMIZER = STEP_PHASES
NO_TRAINABLE = ("training mode needs trainable parameters, but the model has no trainable parameters "
                "(all frozen, or a TorchScript/exported model without parameters)")


def make_optimizer(params, name: str, lr: float, foreach: bool | None = None) -> torch.optim.Optimizer:
    """The optimizer ``name`` over the trainable ``params``. ``OPTIMIZERS`` are what analyses offer; the
    memory planner also builds the rest of ``ALL_OPTIMIZERS``, with ``foreach`` as the device it plans for
    would use (None: torch's own default for these tensors)."""
    name = str(name).lower()
    if name not in ALL_OPTIMIZERS:
        raise TorchScopeError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    if not (float(lr) > 0):
        raise TorchScopeError(f"learning rate must be positive, got {lr}")
    params = [p for p in params if p.requires_grad]
    if not params:
        raise TorchScopeError(NO_TRAINABLE)
    lr = float(lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=SGD_MOMENTUM, foreach=foreach)
    if name == "sgd_nomomentum":
        return torch.optim.SGD(params, lr=lr, foreach=foreach)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, foreach=foreach)
    if name == "adamw_fused":
        return torch.optim.AdamW(params, lr=lr, fused=True)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=lr, foreach=foreach)
    return torch.optim.AdamW(params, lr=lr, foreach=foreach)


def _no_range(_name):
    return nullcontext()


class Step:
    """One inference forward (``train=False``) or one training step on a loaded model.

    ``step()`` runs it; ``step(label=True)`` opens a record_function range around each phase
    (zero_grad, forward, backward, optimizer), the names the profiler's step views read back.
    ``inputs`` defaults to the loaded model's own. The optimizer is built once, here.
    """

    def __init__(self, loaded, train: bool, optimizer: str = "sgd", lr: float = 0.01, inputs=None):
        self.loaded = loaded
        self.inputs = loaded.inputs if inputs is None else inputs
        self.train = bool(train)
        self.optimizer = make_optimizer(loaded.model.parameters(), optimizer, lr) if self.train else None
        self.last_loss: torch.Tensor | None = None

    def __call__(self, label: bool = False) -> None:
        rf = record_range if label else _no_range
        if not self.train:
            with rf(FORWARD):
                self.loaded.forward(self.inputs)
            return
        with rf(ZERO_GRAD):
            self.optimizer.zero_grad(set_to_none=True)
        with rf(FORWARD):
            out = self.loaded.forward(self.inputs)
            try:
                loss = self.loaded.loss_fn(out)
            except Exception as e:  # the user's loss: any exception is possible
                raise ModelRunError(f"the loss ({self.loaded.loss_name}) failed on the model's output: "
                                    f"{type(e).__name__}: {e}") from e
        with rf(BACKWARD):
            try:
                loss.backward()
            except Exception as e:
                raise ModelRunError(f"backward failed: {type(e).__name__}: {e}") from e
        with rf(OPTIMIZER):
            self.optimizer.step()
        self.last_loss = loss.detach()


def record_range(name: str):
    from torch.profiler import record_function

    return record_function(name)
