"""The machine a measurement ran on: device, backend flags (cudnn.benchmark, TF32, matmul precision),
threads, compilers, NCCL and the device's memory: an Environment record (records.py)."""

from __future__ import annotations

import shutil

import torch

from diagnostics.devices import logical_cores, torch_threads
from diagnostics.measure.records import Environment

# ----------------------------------------------------------------------------- environment
def environment_facts(device: torch.device | str) -> Environment:
    device = torch.device(device)
    cuda = torch.cuda.is_available()
    env = {
        "device": str(device), "device_type": device.type, "cuda_available": cuda,
        "cudnn_available": torch.backends.cudnn.is_available(),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "torch_version": str(torch.__version__), "cpu_count": logical_cores(), "torch_threads": torch_threads(),
        "cxx_compiler": bool(shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")),
        "nccl_available": bool(torch.distributed.is_available() and torch.distributed.is_nccl_available()),
        "world_size": (torch.distributed.get_world_size() if torch.distributed.is_available()
                       and torch.distributed.is_initialized() else 1),
        "cuda_device_count": torch.cuda.device_count() if cuda else 0,
    }
    if device.type == "cuda" and cuda:
        props = torch.cuda.get_device_properties(device)
        return Environment(**env, compute_capability=float(f"{props.major}.{props.minor}"), device_name=props.name,
                           device_memory_bytes=int(props.total_memory),
                           bf16_supported=bool(torch.cuda.is_bf16_supported()))
    try:
        import psutil

        memory = int(psutil.virtual_memory().total)
    except Exception:
        memory = None
    return Environment(**env, compute_capability=None, device_name="CPU", device_memory_bytes=memory)
