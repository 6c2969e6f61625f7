"""The checklist's thresholds: named constants, each listed in ``THRESHOLDS`` with what it bounds (shown on the
Checklist page and in docs/checklist.md). Those an attached run's rules judge by too are declared once, in
diagnostics.findings; the gradient thresholds are the Gradient-flow analysis' own.
"""

from __future__ import annotations

# Those an attached run's rules judge by too are declared once, in diagnostics.findings: DATALOADER_FRACTION_MAX,
# COMMUNICATION_FRACTION_MAX, GPU_UTILIZATION_MIN, LAUNCH_BOUND_MIN_OPS, LAUNCH_BOUND_MEDIAN_US, PREFETCH_FACTOR_MIN.
from diagnostics.findings import (COMMUNICATION_FRACTION_MAX, DATALOADER_FRACTION_MAX, GPU_UTILIZATION_MIN,
                                  LAUNCH_BOUND_MEDIAN_US, LAUNCH_BOUND_MIN_OPS, PREFETCH_FACTOR_MIN)
TENSOR_CORE_MIN_CC = 7.0  # compute capability with Tensor Cores (Volta)
TF32_MIN_CC = 8.0  # compute capability with TF32 (Ampere)
PEAK_MEMORY_FRACTION_MAX = 0.90  # peak memory share of device memory (TensorBoard plugin rule)
SAVED_ACTIVATION_FRACTION_MAX = 0.30  # bytes saved for backward, share of device memory
MEMORY_GROWTH_MAX_BYTES = 1 * 2**20  # allocated-memory growth per training step
WIDTH_MULTIPLE = 8  # layer widths should be multiples of this for Tensor Cores / vector units
SYNC_POINTS_WARN = 1  # CPU-GPU sync points per step that earn a warning
SYNC_POINTS_FAIL = 10  # ... and a failure
INIT_GAIN_MIN = 0.2  # weight std * sqrt(fan_in) below this: too small an init
INIT_GAIN_MAX = 3.0  # ... above this: too large (He init gives 1.41, PyTorch default 0.58)
INIT_GAIN_MIN_NORMED = 0.05  # the lower bound in a model with normalisation layers, which restore the scale
# (transformers' normal(0, 0.02) init gives 0.2-0.6 at real widths; T5's query projections 1/sqrt(d_kv))
# Gradient thresholds are the Gradient-flow analysis' own (one definition, per layer):
from diagnostics.measure.gradient_health import (EXPLODING_NORM, KIND_VANISHING_RATIO, PEER_VANISHING_RATIO,
                                                 REFERENCE_QUANTILE, VANISHING_RATIO)
DEAD_UNIT_FRACTION_MAX = 0.5  # share of ReLU units that are zero for the whole batch
INFERENCE_SPEEDUP_MIN = 1.10  # eval()+inference_mode faster than train-mode forward by this factor
BATCH_GAIN_MIN = 1.20  # throughput gain at twice the batch that says "use a bigger batch"
TENSOR_COPY_FRACTION_MAX = 0.10  # share of the step's operator time in layout copies the forward asks for
PYTHON_LOOP_MIN_OPS = 32  # indexing / scalar-read ops per step called from Python ...
PYTHON_LOOP_MIN_SHARE = 0.25  # ... that also make this share of the step's top-level ops

THRESHOLDS = [
    ("DATALOADER_FRACTION_MAX", DATALOADER_FRACTION_MAX, "max share of the step spent waiting for data"),
    ("COMMUNICATION_FRACTION_MAX", COMMUNICATION_FRACTION_MAX, "max share of GPU kernel time in communication"),
    ("GPU_UTILIZATION_MIN", GPU_UTILIZATION_MIN, "min share of step time with a GPU kernel running"),
    ("TENSOR_CORE_MIN_CC", TENSOR_CORE_MIN_CC, "compute capability from which Tensor Cores exist"),
    ("TF32_MIN_CC", TF32_MIN_CC, "compute capability from which TF32 exists"),
    ("PEAK_MEMORY_FRACTION_MAX", PEAK_MEMORY_FRACTION_MAX, "max peak memory / device memory"),
    ("SAVED_ACTIVATION_FRACTION_MAX", SAVED_ACTIVATION_FRACTION_MAX, "max saved activations / device memory"),
    ("MEMORY_GROWTH_MAX_BYTES", MEMORY_GROWTH_MAX_BYTES, "max allocated-memory growth per step (bytes)"),
    ("WIDTH_MULTIPLE", WIDTH_MULTIPLE, "layer widths should be multiples of this"),
    ("SYNC_POINTS_WARN", SYNC_POINTS_WARN, "sync points per step that warn"),
    ("SYNC_POINTS_FAIL", SYNC_POINTS_FAIL, "sync points per step that fail"),
    ("LAUNCH_BOUND_MIN_OPS", LAUNCH_BOUND_MIN_OPS, "ops/kernels per step for the launch-bound rule"),
    ("LAUNCH_BOUND_MEDIAN_US", LAUNCH_BOUND_MEDIAN_US, "median op/kernel time (µs) under which ops are tiny"),
    ("INIT_GAIN_MIN", INIT_GAIN_MIN, "min weight std x sqrt(fan_in)"),
    ("INIT_GAIN_MAX", INIT_GAIN_MAX, "max weight std x sqrt(fan_in)"),
    ("INIT_GAIN_MIN_NORMED", INIT_GAIN_MIN_NORMED, "min weight std x sqrt(fan_in) in a model with normalisation layers"),
    ("VANISHING_RATIO", VANISHING_RATIO, "a layer's relative gradient ‖g‖/‖w‖ / the model's reference (the "
     f"{1 - REFERENCE_QUANTILE:.0%} percentile of its layers'), under which it vanishes "
     "(diagnostics.measure.gradient_health)"),
    ("KIND_VANISHING_RATIO", min(KIND_VANISHING_RATIO.values()), "the same for layers small by design ("
     + ", ".join(KIND_VANISHING_RATIO) + "; diagnostics.measure.gradient_health)"),
    ("PEER_VANISHING_RATIO", PEER_VANISHING_RATIO, "... or its relative gradient / the median of its peers (the same "
     "layer at other depths), under which it vanishes"),
    ("EXPLODING_NORM", EXPLODING_NORM, "a layer's gradient norm over which it explodes (diagnostics.measure.gradient_health)"),
    ("DEAD_UNIT_FRACTION_MAX", DEAD_UNIT_FRACTION_MAX, "max share of ReLU units dead for the whole batch"),
    ("INFERENCE_SPEEDUP_MIN", INFERENCE_SPEEDUP_MIN, "speed-up of eval+inference_mode that is worth taking "
     "(the low end of its interleaved interval must pass it)"),
    ("BATCH_GAIN_MIN", BATCH_GAIN_MIN, "throughput gain at 2x batch that suggests a bigger batch "
     "(the low end of its interleaved interval must pass it)"),
    ("PREFETCH_FACTOR_MIN", PREFETCH_FACTOR_MIN, "min DataLoader prefetch_factor"),
    ("TENSOR_COPY_FRACTION_MAX", TENSOR_COPY_FRACTION_MAX, "max share of the step's operator time in layout "
     "copies (.contiguous(), .clone(), reshape of a non-viewable tensor) made by the forward"),
    ("PYTHON_LOOP_MIN_OPS", PYTHON_LOOP_MIN_OPS, "indexing / scalar-read ops per step (called from Python) from "
     "which a Python loop over tensor elements is suspected"),
    ("PYTHON_LOOP_MIN_SHARE", PYTHON_LOOP_MIN_SHARE, "... when they are also at least this share of the step's "
     "top-level ops"),
]
