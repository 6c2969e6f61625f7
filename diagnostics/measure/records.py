"""The measure layer's typed records (torch-free, so a result's declaration can hold them): what
structure.static_facts / forward_facts and environment.environment_facts return, and the checklist's
``Facts`` (diagnostics.analyses.checklist) holds as its ``static``, ``forward`` and ``env`` sections.

The field names are the stored checklist runs' keys: renaming one breaks the runs stored before
(tests/test_stored_runs.py). A key older runs did not write is UNSET there.
"""

from __future__ import annotations

import msgspec

from diagnostics.results import UNSET, Record, UnsetType


class InitScale(Record, frozen=True, kw_only=True):
    """A weighted layer's init: fan-in, the weights' std and the gain std x sqrt(fan_in); ``role``: a scale
    the architecture sets on purpose (structure.ROLE_ZERO, ROLE_VOCAB_HEAD), else None."""

    name: str
    type: str
    fan_in: int
    std: float
    gain: float
    role: str | None | UnsetType = UNSET


class StaticFacts(Record, frozen=True, kw_only=True):
    """What the module tree says (structure.static_facts): module types and counts, activations and their
    in-place flags, modes, parameters by dtype, memory format, wrappers (compile, TorchScript, DataParallel,
    DDP), the init scale of each weighted layer."""

    model_type: str
    module_types: dict[str, int]
    n_modules: int
    n_conv: int
    n_conv2d: int
    n_batchnorm: int
    n_dropout: int
    n_linear: int
    n_hf_conv1d: int
    n_norm: int
    n_rnn: int
    n_attention: int
    activations: dict[str, int]
    inplace_activations: int
    not_inplace_activations: tuple[str, ...]
    training: bool
    dropout_p0: tuple[str, ...]
    dropout_bn_train: tuple[str, ...]
    dropout_bn_eval: tuple[str, ...]
    param_dtypes: dict[str, int]
    params_total: int
    param_bytes: int
    params_trainable: int
    channels_last: bool
    compiled: bool
    torchscript: bool
    #: a TorchScript program's modules by the class each was made from
    script_types: dict[str, int]
    data_parallel: bool
    data_parallel_devices: int
    ddp: bool
    dist_backend: str | None
    init: tuple[InitScale, ...]
    quantized: bool


class LayerWidth(Record, frozen=True, kw_only=True):
    """A weighted layer's input and output width, in execution order (``in`` None: an embedding)."""

    name: str
    type: str
    in_: int | None = msgspec.field(name="in")
    out: int


class OffWidth(Record, frozen=True, kw_only=True):
    """An inner width that is not a multiple of 8: the layer, its side ("in" / "out") and the width."""

    name: str
    side: str
    dim: int


class RedundantPair(Record, frozen=True, kw_only=True):
    """Two layers in a row where the second adds nothing to the first (structure._redundant_pair says why)."""

    layers: tuple[str, str]
    why: str


class ForwardFacts(Record, frozen=True, kw_only=True):
    """What one hooked forward saw (structure.forward_facts): executed leaves, Conv -> BN pairs by tensor
    identity, saturating activations used as a layer's nonlinearity, redundant pairs, widths, dead ReLU
    units; ``conv_input_channels_last`` is set by the checklist from its inputs (None: not known)."""

    executed_leaves: int
    #: [conv name, BatchNorm name]
    conv_bn_pairs: tuple[tuple[str, str], ...]
    hidden_saturating: tuple[str, ...]
    pooler_saturating: tuple[str, ...]
    redundant_layers: tuple[RedundantPair, ...]
    output_activation: str | None
    widths: tuple[LayerWidth, ...]
    inner_dims: int
    widths_not_multiple_of_8: tuple[OffWidth, ...]
    relu_units: int
    dead_relu_units: int
    relu_modules: int
    conv_input_channels_last: bool | None


class Environment(Record, frozen=True, kw_only=True):
    """The device and backend flags a measurement ran with (environment.environment_facts);
    ``bf16_supported`` on a CUDA device only."""

    device: str
    device_type: str
    cuda_available: bool
    cudnn_available: bool
    cudnn_benchmark: bool
    cudnn_allow_tf32: bool
    matmul_allow_tf32: bool
    float32_matmul_precision: str
    torch_version: str
    cpu_count: int
    torch_threads: int
    cxx_compiler: bool
    nccl_available: bool
    world_size: int
    compute_capability: float | None
    device_name: str | None
    device_memory_bytes: int | None
    cuda_device_count: int
    bf16_supported: bool | UnsetType = UNSET
