"""diagnostics.devices: the machine's facts (cores, torch's threads, the CPU's name) read in one place, which the
device panel, the measurement environment, the disturbance watch and the distributed analysis all ask."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import psutil
import torch

from diagnostics import devices

ENGINE = Path(__file__).resolve().parents[1] / "diagnostics"
#: Calls that read the machine's cores; only devices.py makes them.
CORE_READS = {("os", "cpu_count"), ("os", "sched_getaffinity"), ("psutil", "cpu_count")}


def _core_reads(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and (node.value.id, node.attr) in CORE_READS:
            found.append(f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.Constant) and node.value == "/proc/cpuinfo":
            found.append("/proc/cpuinfo")
    return found


def test_the_cores_are_read_in_devices_only():
    readers = {str(p.relative_to(ENGINE.parent)) for p in ENGINE.rglob("*.py") if _core_reads(p.read_text())}
    assert readers == {"diagnostics/devices.py"}


def test_the_core_check_sees_a_planted_read():
    planted = "import os, psutil\nn = os.cpu_count() or len(os.sched_getaffinity(0)) or psutil.cpu_count()\nopen('/proc/cpuinfo')\n"
    assert sorted(_core_reads(planted)) == ["/proc/cpuinfo", "os.cpu_count", "os.sched_getaffinity", "psutil.cpu_count"]


def test_cores_and_threads_agree_with_the_system(monkeypatch):
    assert devices.logical_cores() == psutil.cpu_count(logical=True) == os.cpu_count()
    assert devices.usable_cores() == len(os.sched_getaffinity(0)) <= devices.logical_cores()
    assert devices.torch_threads() == torch.get_num_threads()
    facts = devices.cpu_facts()
    assert facts["affinity_cores"] == devices.usable_cores() and facts["torch_threads"] == torch.get_num_threads()
    assert facts["model"] == devices.cpu_model() and facts["model"]
    monkeypatch.delattr(os, "sched_getaffinity")  # macOS, Windows: the machine's cores
    assert devices.usable_cores() == devices.logical_cores()


def test_every_view_reads_the_same_counts():
    from diagnostics.analyses.distributed.job import oversubscribed
    from diagnostics.measure.disturbance import watch
    from diagnostics.measure.environment import environment_facts

    env = environment_facts("cpu")
    assert env.cpu_count == devices.logical_cores() and env.torch_threads == devices.torch_threads()
    with watch() as w:
        pass
    assert w.figures["cores"] == devices.logical_cores() and w.figures["torch_threads"] == torch.get_num_threads()
    result: dict = {"stragglers": [], "metrics": {}, "ranks": [], "notes": []}
    oversubscribed(result, nproc=devices.usable_cores() + 1, threads=1, on_gpu=False)  # its default: usable cores
    assert result["cpu"]["cores"] == devices.usable_cores() and result["cpu"]["oversubscribed"]


def test_the_ranks_pool_is_bounded_by_the_cores_devices_reads(monkeypatch, tmp_path):
    from diagnostics.trace.ranks import executors

    paths = [str(tmp_path / f"rank{i}.json") for i in range(3)]
    monkeypatch.setattr(executors, "memory_workers", lambda p: 4)
    monkeypatch.setattr(executors, "logical_cores", lambda: 1)
    pool = executors.LocalPool(paths)
    assert pool.workers == 1 and pool.mode == "sequential (one CPU)"
    monkeypatch.setattr(executors, "logical_cores", lambda: 2)
    assert executors.LocalPool(paths).workers == 2


def test_no_torch_import_when_not_asked():
    code = ("import sys; from diagnostics import devices; "
            "print(devices.torch_threads(import_torch=False), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=ENGINE.parent).stdout.split()
    assert out == ["None", "False"]
