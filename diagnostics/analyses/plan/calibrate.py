"""What a CUDA device needs beyond the tensors of a step, measured: the CUDA context (outside the caching
allocator) and the cuBLAS / cuBLASLt workspaces (inside it, so in ``max_memory_allocated``), with the
GPU's architecture facts the plan's kernel rules use (cuda_kernels.Arch). Run on the GPU once
(bench/gpu/plan_cuda.py stores the figures per GPU model in targets.CALIBRATION_FILE), or by a plan job
for the local GPU when no stored calibration names it.

The workspaces are kept by the process for good once taken (one per thread and stream that runs
matmuls), so a measurement of peaks in the same process counts them from then on: run this in a process
that measures nothing afterwards (bench/gpu/plan_cuda.py runs it in a child process of its own).
"""

from __future__ import annotations

import datetime

import torch


def calibrate_cuda(device: int | str = 0) -> dict:
    """{"gpu", "context_bytes", "workspace_bytes", "cublaslt_workspace_bytes", "sm", "sms", "threads_per_sm",
    "total_bytes", "torch", "measured_on"} for ``device``.

    workspace_bytes: the cuBLAS workspaces of the two threads a training step runs matmuls on (the forward's
    and autograd's device thread for backward): ``memory_allocated`` after a matmul in forward and one in
    backward, less the tensors alive. cublaslt_workspace_bytes: what an ``addmm`` with a bias vector (cuBLASLt)
    takes on top in the forward's thread. Figures this process had already taken read 0. context_bytes:
    the device's used memory (``mem_get_info``, device-wide: other processes' memory counts) less what
    torch's allocator has reserved, once CUDA and cuBLAS are initialised."""
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    torch.cuda.init()
    torch.cuda.synchronize(dev)

    def grew(fn, *alive_after) -> int:
        torch.cuda.synchronize(dev)
        before = torch.cuda.memory_allocated(dev)
        out = fn()
        torch.cuda.synchronize(dev)
        made = sum(t.untyped_storage().nbytes() for t in (out if isinstance(out, tuple) else (out,)))
        return torch.cuda.memory_allocated(dev) - before - made, out

    a = torch.randn(256, 256, device=dev, requires_grad=True)
    bias = torch.randn(256, device=dev)
    ws_forward, y = grew(lambda: a @ a)  # the forward thread's cuBLAS handle and workspace
    lt, z = grew(lambda: torch.addmm(bias, a.detach(), a.detach()))  # cuBLASLt's workspace (gemm_and_bias)
    loss = y.sum()
    torch.cuda.synchronize(dev)
    before = torch.cuda.memory_allocated(dev)
    loss.backward()  # autograd's device thread: another handle, another workspace
    torch.cuda.synchronize(dev)
    ws_backward = torch.cuda.memory_allocated(dev) - before - a.grad.untyped_storage().nbytes()
    free, total = torch.cuda.mem_get_info(dev)
    context = (total - free) - torch.cuda.memory_reserved(dev)
    props = torch.cuda.get_device_properties(dev)
    del a, bias, y, z, loss
    return {"gpu": torch.cuda.get_device_name(dev), "context_bytes": int(context),
            "workspace_bytes": int(max(0, ws_forward) + max(0, ws_backward)),
            "cublaslt_workspace_bytes": int(max(0, lt)), "sm": props.major * 10 + props.minor,
            "sms": props.multi_processor_count, "threads_per_sm": props.max_threads_per_multi_processor,
            "total_bytes": int(total), "torch": torch.__version__, "measured_on": datetime.date.today().isoformat()}
