"""The devices a plan is checked against (no torch): a declared table of common GPUs, the local GPUs by
NVML, or this machine's CPU memory; and the CUDA context calibration stored per GPU.

A :class:`Target` says how much memory there is, how that figure was taken, and what a CUDA device
needs beyond the tensors a step allocates: the allocator rounds every block up to 512 bytes
(counted in the prediction as "rounding") and the CUDA context plus the cuBLAS workspaces. The
workspaces come from the caching allocator, so ``torch.cuda.max_memory_allocated`` includes them and
so does the predicted peak; the context sits outside it and only counts towards the fit. Both come
from a calibration measured once per GPU model (bench/gpu/plan_cuda.py writes
``calibrations.json`` beside this file); a GPU without one gets the declared default, and says so.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from diagnostics.declare import OptionError
from diagnostics.results import Record

MIB = 2**20
GIB = 2**30
#: CUDA's caching allocator rounds every block up to a multiple of this (c10/cuda/CUDACachingAllocator.cpp,
#: kMinBlockSize); torch.distributed._tools.mem_tracker uses the same figure.
CUDA_ROUNDING = 512

#: name -> (total memory in MiB as nvidia-smi / NVML report it, what it is). The usable memory is less:
#: the CUDA context and the allocator's reserve come out of it.
DECLARED = {
    "H100-80GB": (81559, "NVIDIA H100 80GB HBM3 (SXM)"),
    "H100-94GB": (95830, "NVIDIA H100 NVL 94GB"),
    "H200-141GB": (143771, "NVIDIA H200 141GB HBM3e"),
    "A100-80GB": (81920, "NVIDIA A100 80GB (SXM4)"),
    "A100-40GB": (40960, "NVIDIA A100 40GB (SXM4)"),
    "L40S-48GB": (46068, "NVIDIA L40S 48GB"),
    "L4-24GB": (23034, "NVIDIA L4 24GB"),
    "RTX4090-24GB": (24564, "NVIDIA GeForce RTX 4090 24GB"),
    "A10G-24GB": (23028, "NVIDIA A10G 24GB"),
    "T4-16GB": (15360, "NVIDIA T4 16GB"),
    "V100-32GB": (32768, "NVIDIA V100 32GB"),
}
#: name -> (compute capability x 10, streaming multiprocessors, threads per multiprocessor): what CUDA's
#: kernels size their scratch and pick their algorithms by (reductions' staging buffers, the attention
#: backend, cuBLAS's workspace size). From NVIDIA's data sheets and the CUDA programming guide's tables.
ARCH = {
    "H100-80GB": (90, 132, 2048), "H100-94GB": (90, 132, 2048), "H200-141GB": (90, 132, 2048),
    "A100-80GB": (80, 108, 2048), "A100-40GB": (80, 108, 2048), "L40S-48GB": (89, 142, 1536),
    "L4-24GB": (89, 58, 1536), "RTX4090-24GB": (89, 128, 1536), "A10G-24GB": (86, 80, 1536),
    "T4-16GB": (75, 40, 1024), "V100-32GB": (70, 80, 2048),
}
#: A GPU named only by its capacity (48GB): assumed to be a Hopper like the H100 (said in the result).
DEFAULT_ARCH = ARCH["H100-80GB"]
ALIASES = {"H100": "H100-80GB", "H200": "H200-141GB", "A100": "A100-80GB", "L4": "L4-24GB", "RTX4090": "RTX4090-24GB",
           "4090": "RTX4090-24GB", "L40S": "L40S-48GB", "A10G": "A10G-24GB", "T4": "T4-16GB", "V100": "V100-32GB"}
#: What a GPU without a calibration is assumed to need outside the tensors: the CUDA context (outside
#: the allocator; a few hundred MiB with torch's kernels loaded) and two cuBLAS workspaces (one per
#: thread that runs matmuls: the forward's and autograd's backward thread; 32 MiB each on Hopper,
#: CUBLAS_WORKSPACE_CONFIG's default otherwise). An assumption, named as one in every result.
DEFAULT_CONTEXT_BYTES = 512 * MIB
CALIBRATION_FILE = Path(__file__).with_name("calibrations.json")


def cublas_workspace_default(sm: int, env=None) -> int:
    """Bytes of one cuBLAS handle's workspace as torch sizes it (aten/src/ATen/cuda/CublasHandlePool.cpp,
    parseChosenWorkspaceSize): CUBLAS_WORKSPACE_CONFIG's ':SIZE_KIB:COUNT' pairs, else ':4096:8' (32 MiB)
    on compute capability 9 and later, ':4096:2:16:8' (8 MiB + 128 KiB) before."""
    env = os.environ if env is None else env
    config = env.get("CUBLAS_WORKSPACE_CONFIG")
    if config:
        pairs = re.findall(r":([0-9]+):([0-9]+)", config)
        if pairs:
            return sum(int(a) * 1024 * int(b) for a, b in pairs)
    return 4096 * 8 * 1024 if sm >= 90 else 4096 * 1024 * 2 + 16 * 1024 * 8


def cublaslt_workspace_default(env=None) -> int:
    """Bytes of one cuBLASLt workspace: CUBLASLT_WORKSPACE_SIZE (KiB), else 1 MiB
    (parseCUDABlasLtWorkspaceSize)."""
    env = os.environ if env is None else env
    try:
        return int(env.get("CUBLASLT_WORKSPACE_SIZE", "1024")) * 1024
    except ValueError:
        return 1024 * 1024


class Target(Record, frozen=True, kw_only=False):
    """The memory a plan must fit in. ``kind``: "cuda" (512-byte rounding, context, workspaces) or "cpu".
    The plan's result names its device with it (``PlanResult.device``)."""

    name: str
    kind: str
    capacity_bytes: int
    count: int
    source: str
    context_bytes: int = 0
    workspace_bytes: int = 0
    calibration: str = ""

    @property
    def rounding(self) -> int:
        return CUDA_ROUNDING if self.kind == "cuda" else 1

    @property
    def budget_bytes(self) -> int:
        """What a step may peak at: the device's memory less the CUDA context."""
        return int(self.capacity_bytes) - int(self.context_bytes or 0)


def _canonical(name: str) -> str:
    key = name.strip().replace(" ", "").replace("_", "-")
    for known in DECLARED:
        if key.lower() == known.lower():
            return known
    for alias, known in ALIASES.items():
        if key.lower() == alias.lower():
            return known
    return ""


def _cpu_capacity(value: str) -> int | None:
    """'cpu:64GiB' -> bytes: this machine's CPU memory, as if it had that much."""
    head, _, rest = value.partition(":")
    return _custom_bytes(rest) if head.strip().lower() == "cpu" and rest else None


def check_name(value: str) -> str:
    """The option check: a device name the table, NVML or a capacity can resolve (no NVML call here)."""
    value = str(value).strip()
    if (value.lower() in ("auto", "local", "cpu") or _canonical(value) or _custom_bytes(value) is not None
            or _cpu_capacity(value) is not None):
        return value
    raise OptionError(f"option device: unknown device {value!r}; known: {', '.join(DECLARED)}, local (this "
                      "machine's GPUs by NVML), cpu (this machine's memory), cpu:<capacity> (the CPU with that much), or a GPU "
                      "capacity such as 48GB or 40GiB")


def _custom_bytes(value: str) -> int | None:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(GB|GiB|MB|MiB)\s*", value, re.IGNORECASE)
    if not m:
        return None
    n, unit = float(m.group(1)), m.group(2).lower()
    return int(n * {"gb": 1e9, "gib": GIB, "mb": 1e6, "mib": MIB}[unit])


def stored_calibrations(path: Path = CALIBRATION_FILE) -> dict:
    """GPU name -> calibration (context_bytes, workspace_bytes, measured_on, torch) from the stored file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _calibration(gpu_name: str, stored: dict, sm: int = DEFAULT_ARCH[0]) -> tuple[int, int, str]:
    """(context bytes, workspace bytes, where they come from) for a GPU model; ``sm`` (compute capability
    x 10) sizes the cuBLAS workspaces of an uncalibrated one."""
    for key, cal in stored.items():
        if key.lower() in gpu_name.lower() or gpu_name.lower() in key.lower():
            return (int(cal["context_bytes"]), int(cal["workspace_bytes"]),
                    f"calibrated on {key} ({cal.get('measured_on', 'date unknown')}, torch {cal.get('torch', '?')}): "
                    f"context {cal['context_bytes'] / MIB:.0f} MiB, cuBLAS workspaces {cal['workspace_bytes'] / MIB:.0f} MiB")
    ws = 2 * cublas_workspace_default(sm)
    return (DEFAULT_CONTEXT_BYTES, ws,
            f"not calibrated for {gpu_name}: assumed {DEFAULT_CONTEXT_BYTES // MIB} MiB of CUDA context and "
            f"{ws / MIB:g} MiB of cuBLAS workspaces (torch's default for compute capability {sm // 10}.{sm % 10}, one "
            "per thread that runs matmuls: forward and backward; run bench/gpu/plan_cuda.py on that GPU to measure "
            "them)")


def resolve(name: str, count: int = 1, gpus: list[dict] | None = None, cpu: dict | None = None,
            stored: dict | None = None) -> Target:
    """The Target a device option names. ``gpus`` (NVML facts, diagnostics.devices.gpu_facts) and ``cpu``
    (cpu_facts) are what this machine has; "auto" is its first GPU, else its CPU memory."""
    stored = stored_calibrations() if stored is None else stored
    value = str(name).strip()
    low = value.lower()
    gpus = gpus or []
    if low == "auto":
        low = "local" if gpus else "cpu"
    if low == "local":
        if not gpus:
            raise OptionError("device local: no NVIDIA GPU was found here (no driver or no device); name one from the "
                              f"table ({', '.join(DECLARED)}) or use cpu")
        g = gpus[0]
        ctx, ws, how = _calibration(g["name"], stored)
        return Target(g["name"], "cuda", int(g["memory_total_bytes"]), count,
                      f"this machine's GPU 0 ({g['name']}): total memory read by NVML", ctx, ws, how)
    if low == "cpu":
        cpu = cpu or {}
        avail = int(cpu.get("ram_available_bytes") or 0)
        return Target("cpu", "cpu", avail, count, "this machine's available RAM (psutil, when the job started)")
    cpu_cap = _cpu_capacity(value)
    if cpu_cap is not None:
        return Target(value, "cpu", cpu_cap, count, f"given as {value}: this machine's CPU, as if it had that much")
    known = _canonical(value)
    if known:
        mib, what = DECLARED[known]
        ctx, ws, how = _calibration(what, stored, ARCH[known][0])
        return Target(known, "cuda", mib * MIB, count, f"declared table: {what}, {mib:,} MiB total as NVML reports it",
                      ctx, ws, how)
    custom = _custom_bytes(value)
    if custom is not None:
        ctx, ws, how = _calibration(value, stored)
        return Target(value, "cuda", custom, count, f"given as {value}", ctx, ws, how)
    check_name(value)  # raises with the list of known names
    raise AssertionError("unreachable")
