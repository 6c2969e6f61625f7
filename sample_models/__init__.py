"""Built-in sample models (defined in code, no downloads): healthy ones and deliberately sick ones.

``SAMPLES`` maps a name to a :class:`Sample`, which builds the module, declares its example
inputs (batch first) and the task its loss is computed for.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Callable

from diagnostics.spec import InputSpec

if TYPE_CHECKING:
    import torch
    from torch import nn

#: The token models' vocabulary (sample_models.sequence takes it from here).
VOCAB = 1000


def _lazy(module: str, name: str) -> Callable[[], "nn.Module"]:
    """A builder that imports ``sample_models.<module>`` (and torch) only when a model is built: the
    catalogue below is read by the dashboard's sidebar, whose process need not import torch for it
    (the job's worker builds the model)."""

    def build(*args, **kwargs):
        return getattr(import_module(f"sample_models.{module}"), name)(*args, **kwargs)

    build.__name__ = build.__qualname__ = name
    return build


@dataclass(frozen=True)
class Sample:
    name: str
    description: str
    build: Callable[[], nn.Module]
    inputs: tuple[InputSpec, ...]
    task: str  # "classification" (output [B, C]) or "lm" (output [B, T, V])
    num_classes: int
    sick: str | None = None  # what is wrong with it on purpose, e.g. "vanishing gradients"


def task_loss(task: str, num_classes: int, seed: int = 0) -> Callable[[torch.Tensor], torch.Tensor]:
    """A loss for ``task`` with fixed pseudo-random targets shaped after the output."""
    import torch
    from torch import nn

    targets: dict[tuple, torch.Tensor] = {}

    def target_for(shape: tuple, device: torch.device) -> torch.Tensor:
        # Made once per shape and device: a host-to-device copy in every step would be a CPU-GPU
        # sync that the checklist rightly blames on the training step.
        key = (tuple(shape), str(device))
        if key not in targets:
            g = torch.Generator().manual_seed(seed)
            targets[key] = torch.randint(0, num_classes, tuple(shape), generator=g).to(device)
        return targets[key]

    def rows_loss(output, start: int, stop: int, batch: int) -> torch.Tensor:
        """The loss of rows ``start:stop`` of a batch of ``batch``: the same targets the whole batch
        gets, so a step in micro-batches sees the full batch's targets (gradient accumulation)."""
        if isinstance(output, (tuple, list)):
            output = output[0]
        whole = start == 0 and stop == batch  # no slice op in an ordinary step (profiles count ops)
        if task == "lm":
            target = target_for((batch,) + tuple(output.shape[1:-1]), output.device)
            target = target if whole else target[start:stop]
            return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]).float(), target.reshape(-1))
        target = target_for((batch,), output.device)
        return nn.functional.cross_entropy(output.float(), target if whole else target[start:stop])

    def loss_fn(output: torch.Tensor) -> torch.Tensor:
        first = output[0] if isinstance(output, (tuple, list)) else output
        return rows_loss(output, 0, first.shape[0], first.shape[0])

    loss_fn.for_rows = rows_loss
    return loss_fn


SAMPLES: dict[str, Sample] = {
    s.name: s
    for s in [
        Sample("mlp", "3-layer MLP classifier (64 -> 128 -> 128 -> 10)", _lazy("mlps", "MLP"),
               (InputSpec((32, 64)),), "classification", 10),
        Sample("cnn", "Small CNN: three Conv-BN-ReLU blocks and a linear head on 32x32 images",
               _lazy("convnets", "SmallCNN"), (InputSpec((8, 3, 32, 32)),), "classification", 10),
        Sample("resnet", "ResNet-10-style network (BasicBlocks, 4 stages) on 32x32 images",
               _lazy("convnets", "resnet10"), (InputSpec((8, 3, 32, 32)),), "classification", 10),
        Sample("transformer", "Transformer encoder LM over token ids (2 layers, d=128, 4 heads)",
               _lazy("sequence", "TinyTransformerLM"), (InputSpec((8, 64), "int64", high=VOCAB),),
               "lm", VOCAB),
        Sample("lstm", "Embedding + 2-layer LSTM text classifier",
               _lazy("sequence", "LSTMClassifier"), (InputSpec((16, 32), "int64", high=VOCAB),),
               "classification", 4),
        Sample("deep_sigmoid_mlp", "20-layer MLP with sigmoid activations (sick: vanishing gradients)",
               _lazy("mlps", "DeepSigmoidMLP"), (InputSpec((32, 64)),), "classification", 10,
               sick="vanishing gradients"),
        Sample("bad_init_mlp", "8-layer ReLU MLP initialised with std=1.5 weights (sick: exploding gradients)",
               _lazy("mlps", "BadInitMLP"), (InputSpec((32, 64)),), "classification", 10,
               sick="exploding gradients"),
        Sample("graph_break_mlp", "MLP whose forward breaks torch.compile's graph: an .item() branch and numpy "
               "on tensor data (sick: graph breaks)", _lazy("mlps", "GraphBreakMLP"), (InputSpec((32, 64)),), "classification",
               10, sick="graph breaks"),
    ]
}

DEFAULT_SAMPLE = "cnn"
