"""Facts about the devices a job can run on: NVIDIA GPUs through pynvml, else the CPU.

Nothing here needs torch.cuda to be initialised in the dashboard's process, which keeps
CUDA state out of the server (jobs run in workers).
"""

from __future__ import annotations

import os
import platform
import sys

import psutil


def list_devices() -> list[str]:
    """'cpu' plus one 'cuda:N' per visible CUDA GPU."""
    gpus = gpu_facts()
    return ["cpu"] + [f"cuda:{g['index']}" for g in gpus if g.get("index") is not None]


def gpu_facts() -> list[dict]:
    """One dict per NVIDIA GPU from NVML; [] when there is no driver or no GPU."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:
        return []
    out = []
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            fact = {"index": i, "name": _text(pynvml.nvmlDeviceGetName(h)), "driver": _text(driver),
                    "memory_used_bytes": int(mem.used), "memory_total_bytes": int(mem.total)}
            for key, fn in [("utilization_pct", lambda: pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
                            ("temperature_c", lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
                            ("power_w", lambda: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
                            ("power_limit_w", lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0)]:
                try:
                    fact[key] = fn()
                except Exception:  # a field a given GPU or driver does not report
                    fact[key] = None
            out.append(fact)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return out


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def logical_cores() -> int:
    """The machine's logical cores (hyper-threads counted), at least 1."""
    return os.cpu_count() or 1


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), else the machine's logical cores: what
    ranks x threads and DataLoader workers are compared with."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity masks here (macOS, Windows)
        return logical_cores()


def torch_threads(import_torch: bool = True) -> int | None:
    """torch's intra-op thread count; with ``import_torch=False`` only if torch is already imported
    (None otherwise), so reading it costs no import."""
    if not import_torch and "torch" not in sys.modules:
        return None
    try:
        import torch
    except ImportError:
        return None
    return int(torch.get_num_threads())


def cpu_model() -> str:
    """The CPU's name (/proc/cpuinfo's model name, else what the platform says)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return model


def cpu_facts(import_torch: bool = True) -> dict:
    """The CPU, memory and torch's intra-op thread count. ``import_torch=False``: the thread count only
    if torch is already imported here (None otherwise: the dashboard's server imports torch for
    nothing else, and not on a first page's critical path)."""
    vm = psutil.virtual_memory()
    return {"model": cpu_model(), "logical_cores": psutil.cpu_count(logical=True),
            "physical_cores": psutil.cpu_count(logical=False), "affinity_cores": usable_cores(),
            "ram_total_bytes": int(vm.total), "ram_available_bytes": int(vm.available),
            "torch_threads": torch_threads(import_torch), "platform": platform.platform()}


def device_report(import_torch: bool = True) -> dict:
    gpus = gpu_facts()
    return {"gpus": gpus, "cpu": cpu_facts(import_torch),
            "message": None if gpus else "No NVIDIA GPU was found (no driver or no device): jobs run on the CPU."}
