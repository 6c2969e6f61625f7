"""What a CUDA device needs beyond the tensors of a step, measured: the CUDA context (outside the caching
allocator) and the cuBLAS workspaces (inside it, so in ``max_memory_allocated``). Run on the GPU once
(bench/gpu/plan_cuda.py stores the figures per GPU model in targets.CALIBRATION_FILE), or by a plan job
for the local GPU when no stored calibration names it.
"""

from __future__ import annotations

import datetime
import threading

import torch


def calibrate_cuda(device: int | str = 0) -> dict:
    """{"gpu", "context_bytes", "workspace_bytes", "torch", "measured_on"} for ``device``.

    Workspaces: cuBLAS takes one from the caching allocator per thread that runs matmuls (the forward's
    and autograd's backward thread each have a handle): ``memory_allocated`` after a matmul in forward and
    one in backward, less the tensors alive. Context: the device's used memory (``mem_get_info``) less
    what torch's allocator has reserved, once CUDA and cuBLAS are initialised."""
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    torch.cuda.init()
    torch.cuda.synchronize(dev)
    a = torch.randn(256, 256, device=dev, requires_grad=True)
    alive = a.untyped_storage().nbytes()
    base = torch.cuda.memory_allocated(dev) - alive
    y = a @ a  # the forward thread's cuBLAS handle and workspace
    y.sum().backward()  # autograd's device thread: another handle, another workspace

    def other_thread():  # a matmul from a third thread, to see a handle's workspace on its own
        (a.detach() @ a.detach()).sum().item()

    torch.cuda.synchronize(dev)
    alive = a.untyped_storage().nbytes() + a.grad.untyped_storage().nbytes() + y.untyped_storage().nbytes()
    workspace = torch.cuda.memory_allocated(dev) - base - alive
    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    per_handle = torch.cuda.memory_allocated(dev) - base - alive - workspace
    free, total = torch.cuda.mem_get_info(dev)
    context = (total - free) - torch.cuda.memory_reserved(dev)
    del a, y
    return {"gpu": torch.cuda.get_device_name(dev), "context_bytes": int(context), "workspace_bytes": int(workspace),
            "workspace_per_handle_bytes": int(per_handle), "total_bytes": int(total), "torch": torch.__version__,
            "measured_on": datetime.date.today().isoformat()}
