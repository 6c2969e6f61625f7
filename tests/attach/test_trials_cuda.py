"""Fix trials on a CUDA training script (tests/attach/scripts/conv_blocks.py --cuda): amp_bf16, compile and
cudnn_benchmark act on it, each measured; peak memory is the allocator's. Needs a GPU."""

from __future__ import annotations

import sys

import pytest
import torch

from diagnostics.attach.command import check_command
from diagnostics.attach.trials import Trials
from tests.attach.harness import SCRIPTS


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_amp_compile_and_cudnn_benchmark_on_a_cuda_script(tmp_path):
    cmd = check_command([sys.executable, str(SCRIPTS / "conv_blocks.py"), "--cuda"], str(SCRIPTS))
    res = Trials(cmd, "amp_bf16,compile,cudnn_benchmark,pin_memory", steps=10, warmup=3, rounds=2,
                 folder=str(tmp_path / "t")).run().result
    rows = {r.fix: r for r in res.trials}
    assert res.device == "cuda"
    for fix in ("amp_bf16", "compile", "cudnn_benchmark"):
        assert rows[fix].applicable and rows[fix].step_ms and rows[fix].verdict != "failed", rows[fix]
    assert rows["pin_memory"].verdict == "not applicable"  # no DataLoader in this script
    assert rows["compile"].warmup_extra_ms > 0  # the compile is in the warm-up, not in the steps
    assert 0 < rows["amp_bf16"].loss_max_rel_diff < 0.1
    assert rows["baseline"].peak_bytes < 2 << 30  # the allocator's peak of a tiny CNN, not a process' RSS
