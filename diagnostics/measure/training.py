"""The one training step, and the optimizers it can use.

``make_optimizer`` builds the optimizer a user picked by name (``measure.optimizers``: "sgd" is SGD
with momentum everywhere); ``Step`` is one inference forward or one training step (zero_grad,
forward, loss, backward, optimizer step), optionally with a profiler range around each phase, as
the profiler, memory, the batch scan, the gradient flow, the distributed ranks, Optimize's training
trials, Compile's training comparison, the checklist's step facts, the summary's FLOP count and the
plan's measured peaks all run it. A user's loss or backward that raises is reported as a ModelRunError
naming the phase.

What a caller needs beyond the plain step is an option of this one, not a step of its own:
``zero_grad=False`` (gradients cleared by the caller outside a measured window), ``after_backward``
(read the gradients before the optimizer changes the weights), ``autocast`` and ``scaler`` (mixed
precision), ``split`` (gradient accumulation over micro-batches), ``update`` (a compiled optimizer
step), an optimizer already built. A step trains a loaded model, or a ``Trainee``: a module with its
loss (a copy a fix changed, a DDP wrapper).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from diagnostics.errors import ModelRunError, TorchScopeError
from diagnostics.inputs import call as call_model
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


@dataclass
class Trainee:
    """A module with its loss and inputs: what a ``Step`` trains when it is not the loaded model itself
    (a copy an Optimize fix changed, a DDP wrapper). The module is called as given (``inputs.call``); its
    exceptions pass through. ``prepare`` converts the inputs inside the forward (to channels_last, say)."""

    model: nn.Module
    loss_fn: Callable[[object], torch.Tensor]
    inputs: object = None
    loss_name: str = "loss function"
    prepare: Callable[[object], object] | None = None

    def forward(self, inputs=None):
        inputs = self.inputs if inputs is None else inputs
        return call_model(self.model, inputs if self.prepare is None else self.prepare(inputs))


class Step:
    """One inference forward (``train=False``) or one training step on a loaded model (or a ``Trainee``).

    ``step()`` runs it and returns the loss, detached (None in inference); ``step(label=True)`` opens a
    record_function range around each phase (zero_grad, forward, backward, optimizer), the names the
    profiler's step views read back; ``step(inputs=...)`` runs on other inputs than the step's own
    (``inputs``, by default the loaded model's). The optimizer is built once, here: ``optimizer`` names it
    (over ``params``, by default the model's trainable parameters) or is one already built; None trains
    without one: zero_grad (through the model), forward, loss and backward, the weights left as they were
    (a comparison of forward and backward alone: Compile's training comparison).

    Options, each for a caller that truly needs it:

    * ``zero_grad=False``: the step does not clear the gradients; the caller does (``zero_grad()``)
      before a measured window, since the CPU profiler cannot size frees of blocks allocated before it
      started (freeing the old gradients inside would lower the measured peak);
    * ``autocast``: a context (``lambda: torch.autocast(...)``) around forward and loss; ``scaler``: a
      GradScaler (scaled backward, ``scaler.step(optimizer)``, ``scaler.update()``);
    * ``split``: gradient accumulation, ``split(inputs) -> [(micro-batch, loss_fn), ...]``: each
      micro-batch's loss, divided by their number, goes backward; the step returns their sum;
    * ``update``: what the optimizer phase calls instead of ``optimizer.step`` (a compiled one);
    * ``after_backward`` (a call's): run after backward, before the optimizer step (to read gradients);
    * ``keep_loss=False``: the step returns None, with no detached copy of the loss: no op of its own
      (``aten::detach``) among the ops a profiled step calls, which the checklist counts per step.
    """

    def __init__(self, loaded, train: bool, optimizer: str | torch.optim.Optimizer | None = "sgd", lr: float = 0.01,
                 inputs=None, *, params=None, zero_grad: bool = True,
                 autocast: Callable[[], object] | None = None, scaler=None,
                 split: Callable[[object], list] | None = None, update: Callable[[], object] | None = None,
                 keep_loss: bool = True):
        self.loaded = loaded
        self.inputs = loaded.inputs if inputs is None else inputs
        self.train = bool(train)
        if not self.train or optimizer is None:
            self.optimizer = None
        elif isinstance(optimizer, torch.optim.Optimizer):
            self.optimizer = optimizer
        else:
            self.optimizer = make_optimizer(loaded.model.parameters() if params is None else params, optimizer, lr)
        self.clears_grads = bool(zero_grad)
        self.autocast = autocast
        self.scaler = scaler
        self.split = split
        self.update = update
        self.keep_loss = bool(keep_loss)

    def zero_grad(self) -> None:
        """The gradients set to None (what the step does first, unless built with ``zero_grad=False``)."""
        if self.optimizer is None:  # no optimizer: every parameter of the model
            self.loaded.model.zero_grad(set_to_none=True)
        else:
            self.optimizer.zero_grad(set_to_none=True)

    def __call__(self, label: bool = False, *, inputs=None,
                 after_backward: Callable[[], None] | None = None) -> torch.Tensor | None:
        rf = record_range if label else _no_range
        inputs = self.inputs if inputs is None else inputs
        if not self.train:
            with rf(FORWARD):
                self.loaded.forward(inputs)
            return None
        if self.clears_grads:
            with rf(ZERO_GRAD):
                self.zero_grad()
        parts = [(inputs, self.loaded.loss_fn)] if self.split is None else self.split(inputs)
        total = None
        for part, loss_fn in parts:
            with rf(FORWARD):
                loss = self._loss(part, loss_fn)
                if len(parts) > 1:
                    loss = loss / len(parts)
            with rf(BACKWARD):
                try:
                    (loss if self.scaler is None else self.scaler.scale(loss)).backward()
                except torch.OutOfMemoryError:
                    raise  # the caller's to handle (a smaller batch, the runner's report), as the forward's
                except Exception as e:
                    raise ModelRunError(f"backward failed: {type(e).__name__}: {e}") from e
            if self.keep_loss:
                total = loss.detach() if total is None else total + loss.detach()
        if after_backward is not None:
            after_backward()
        if self.optimizer is None and self.update is None:  # forward and backward only: the weights stay
            return total
        with rf(OPTIMIZER):
            if self.scaler is not None:
                self.scaler.step(self.optimizer)  # unscales the gradients in place first; skips a step with inf/NaN
                self.scaler.update()
            elif self.update is not None:
                self.update()
            else:
                self.optimizer.step()
        return total

    def _loss(self, inputs, loss_fn) -> torch.Tensor:
        with self.autocast() if self.autocast is not None else nullcontext():
            out = self.loaded.forward(inputs)
            try:
                return loss_fn(out)
            except torch.OutOfMemoryError:
                raise
            except Exception as e:  # the user's loss: any exception is possible
                raise ModelRunError(f"the loss ({self.loaded.loss_name}) failed on the model's output: "
                                    f"{type(e).__name__}: {e}") from e


def record_range(name: str):
    from torch.profiler import record_function

    return record_function(name)
