"""On a CUDA machine: the GPU check of attach mode (bench/gpu/attach_cuda.py) passes: GPU idle per step
placed in data_wait, kernel time, the sync at its .item() line, peak memory, the memory snapshot and
the OOM snapshot."""

import json
import subprocess
import sys

import pytest
import torch

from tests.attach.harness import ROOT


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_gpu_check_passes(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "attach_cuda.py"), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    out = json.loads(p.stdout)
    assert p.returncode == 0 and out["failed"] == [], json.dumps(out, indent=1)[-4000:]
