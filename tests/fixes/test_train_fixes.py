"""Training-mode trials (Optimize --mode train): each training fix's effect on the step, checked
against an independent computation (a plain training loop, the memory analysis's peak), and the
clear errors of the mode."""

import copy

import pytest
import torch
from torch import nn

from diagnostics.analyses.optimize import catalog
from diagnostics.analyses.optimize.train_fixes import choose_blocks, split_batch
from diagnostics.analyses.optimize.train_trials import cosine, grad_vector, run_train_trials
from diagnostics.errors import TorchScopeError
from diagnostics.measure.environment import environment_facts
from diagnostics.measure.structure import static_facts
from diagnostics.runner import Job, execute
from diagnostics.spec import ModelSpec


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def blocks():
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)) for _ in range(4)]
    return nn.Sequential(nn.Linear(16, 64), nn.Sequential(*layers), nn.Linear(64, 4))


X = (torch.randn(8, 32, generator=torch.Generator().manual_seed(0)),)  # the same batch in every process
TARGET = torch.randint(0, 10, (8,), generator=torch.Generator().manual_seed(1))


def loss_fn(out):
    return nn.functional.cross_entropy(out, TARGET)


loss_fn.for_rows = lambda out, a, b, n: nn.functional.cross_entropy(out, TARGET[a:b])


def facts(model):
    return {"static": static_facts(model), "env": environment_facts("cpu")}


def trials(model, fixes, inputs=X, loss=loss_fn, params=None, **kw):
    kw.setdefault("iters", 2)
    kw.setdefault("warmup", 1)
    rows, _, _ = run_train_trials(model, inputs, "cpu", loss, fixes, facts(model), params or {}, **kw)
    return {r["fix"]: r for r in rows}


def plain_loop(model, inputs, loss, steps, lr=1e-3):
    """An independent training loop: AdamW, the same seed, the same batch."""
    model = copy.deepcopy(model).train()
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        out = loss(model(*inputs))
        out.backward()
        opt.step()
        losses.append(out.item())
    return losses


def test_baseline_losses_are_a_plain_training_loops():
    model = mlp()
    rows = trials(model, [], steps=4)
    assert rows["baseline"]["losses"] == pytest.approx(plain_loop(model, X, loss_fn, 4), rel=1e-6)
    assert rows["baseline"]["status"] == "ok" and rows["control"]["verdict"] in ("faster", "slower", "within noise")
    assert rows["baseline"]["median_ms"] > 0 and rows["baseline"]["throughput_per_s"] > 0
    # the user's model never trains: its weights are unchanged
    assert torch.equal(model[0].weight, mlp()[0].weight)


def test_accumulation_matches_the_full_batch_and_says_why_not():
    model = mlp()
    rows = trials(model, ["grad_accumulation"], steps=3, params={"grad_accumulation": {"micro_batches": 4}})
    r = rows["grad_accumulation"]
    assert r["status"] == "ok", r["why"]
    # the same effective batch: the summed micro-batch gradients are the full batch's, so the losses agree
    assert r["losses"] == pytest.approx(plain_loop(model, X, loss_fn, 3), rel=1e-5)
    assert r["grad_cosine"] > 0.99999 and r["loss_rel_diff"] < 1e-5
    r = trials(model, ["grad_accumulation"], params={"grad_accumulation": {"micro_batches": 3}})["grad_accumulation"]
    assert r["status"] == "not_applicable"
    assert r["why"] == "the batch (8) does not split into 3 equal micro-batches: choose micro_batches dividing 8"


def test_split_batch_slices_only_batched_inputs():
    x, mask = torch.arange(8).reshape(8, 1), torch.ones(3)
    parts = split_batch((x, mask), 2)
    assert [p[0].flatten().tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7]] and parts[1][1] is mask


def test_checkpointing_lowers_the_peak_and_keeps_the_gradients():
    model = blocks()
    inputs = (torch.randn(256, 16),)
    target = torch.randn(256, 4)

    def mse(out):
        return (out - target).pow(2).mean()

    rows = trials(model, ["activation_checkpointing"], inputs=inputs, loss=mse, steps=2)
    base, ck = rows["baseline"], rows["activation_checkpointing"]
    assert ck["status"] == "ok", ck["why"]
    assert ck["grad_cosine"] > 0.999999 and ck["loss_rel_diff"] < 1e-6
    assert ck["peak_bytes"] < base["peak_bytes"]
    # the saving is about the checkpointed blocks' activations: each of the 4 blocks keeps a 256x256
    # GELU input and output (float32) that are recomputed instead; at least half of that is saved
    per_block = 2 * 256 * 256 * 4
    assert base["peak_bytes"] - ck["peak_bytes"] > 0.5 * 3 * per_block
    assert "checkpointed: 1.0, 1.1, 1.2, 1.3" in ck["notes"][0]


def test_choose_blocks_reads_the_measured_activations():
    model = blocks()
    saved = {"1.0.0": 10, "1.1.1": 50, "1.2": 5, "1.3.0": 1, "2": 20}  # the top level covers all, in bigger blocks
    names, how = choose_blocks(model, saved, limit=2)
    assert names == ["1.1", "1.0"] and "save 60 bytes" in how
    assert choose_blocks(model, saved)[0] == ["1.0", "1.1", "1.2", "1.3"]


def test_fused_optimizer_same_losses():
    model = mlp()
    r = trials(model, ["fused_optimizer"], steps=3)["fused_optimizer"]
    assert r["status"] == "ok", r["why"]
    assert r["losses"] == pytest.approx(plain_loop(model, X, loss_fn, 3), rel=1e-5)
    assert "AdamW(fused=True)" in r["notes"][0]


def test_amp_bfloat16_on_cpu_stays_close():
    model = mlp()
    r = trials(model, ["amp"], steps=2)["amp"]
    assert r["status"] == "ok", r["why"]
    assert "autocast bfloat16 on cpu" in r["notes"][0] and r["grad_cosine"] > 0.99 and r["loss_rel_diff"] < 0.02


def test_qat_converts_to_int8_and_stays_close():
    pytest.importorskip("torchao")
    model = mlp()
    r = trials(model, ["qat_int8"], steps=2)["qat_int8"]
    assert r["status"] == "ok", r["why"]
    assert r["grad_cosine"] > 0.99 and r["cosine"] > 0.99
    assert r["size_ratio"] < 0.6  # int8 weights: about a quarter of float32's, plus scales and biases
    assert "3 Linear layer(s)" in r["notes"][0]


def test_channels_last_needs_convolutions():
    r = trials(mlp(), ["channels_last"])["channels_last"]
    assert r["status"] == "not_applicable" and r["why"] == "no Conv2d layers: memory format does not matter"


def test_grad_cosine_and_vector():
    a = nn.Linear(2, 1)
    a.weight.grad = torch.tensor([[3.0, 4.0]])
    assert grad_vector(list(a.parameters())).tolist() == [3.0, 4.0, 0.0]  # no bias gradient: zeros
    assert cosine(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])) == 0.0
    assert cosine(torch.tensor([1.0, 1.0]), torch.tensor([2.0, 2.0])) == pytest.approx(1.0)


def test_mode_errors_name_the_mode():
    with pytest.raises(TorchScopeError, match="fix 'grad_accumulation' is a training fix; run it with --mode train"):
        catalog.get_fix("grad_accumulation", "inference")
    with pytest.raises(TorchScopeError, match="fix 'torchscript' is an inference fix; run it with --mode inference"):
        catalog.get_fix("torchscript", "train")
    assert catalog.get_fix("amp", "train").mode == "train" and catalog.get_fix("amp").mode == "inference"


def test_train_mode_analysis_peak_matches_the_memory_analysis(tmp_path):
    # the baseline's training peak is measured as the memory analysis measures it
    spec = ModelSpec(name="mlp", batch_size=32)
    opt = execute(Job("optimize", spec, {"mode": "train", "fixes": ["fused_optimizer"], "iters": 2, "warmup": 1,
                                         "optimizer": "adamw"}), tmp_path / "o")
    mem = execute(Job("memory", spec, {"optimizer": "adamw"}), tmp_path / "m")
    assert opt.mode == "train" and opt.loss.startswith("cross-entropy")
    base = opt.rows[0]
    assert base.peak_bytes == pytest.approx(mem.metrics.peak_train_bytes, rel=0.05)
    assert opt.metrics.baseline_peak_bytes == base.peak_bytes
    with pytest.raises(Exception, match="is an inference fix; run it with --mode inference"):
        execute(Job("optimize", spec, {"mode": "train", "fixes": ["torchscript"]}), tmp_path / "bad")


def test_choose_blocks_splits_a_stage_of_blocks_but_not_a_block_of_layers():
    torch.manual_seed(0)

    def block():
        return nn.Sequential(nn.Linear(8, 8), nn.ReLU())

    # stage "0" holds two blocks and most of the activations; stage "1" is one block
    model = nn.Sequential(nn.Sequential(block(), block()), block())
    assert choose_blocks(model, {"0.0.0": 40, "0.1.0": 40, "1.0": 20})[0] == ["0.0", "0.1"]
    # when the stage covers less than half, the top level's children are the blocks; the largest,
    # a block of single layers, is not split into layers (recomputing one layer saves nothing)
    assert choose_blocks(model, {"0.0.0": 25, "0.1.0": 20, "1.0": 55})[0] == ["0", "1"]
    # a ModuleList is never called: its members are the blocks
    holder = nn.Module()
    holder.layers = nn.ModuleList([block(), block()])
    holder.layers2 = nn.ModuleList([nn.ModuleList([block(), block()]), block()])
    names, _ = choose_blocks(holder, {"layers2.0.0.0": 20, "layers2.0.1.0": 20, "layers2.1.0": 55, "layers.0.0": 5})
    assert names == ["layers2.0.0", "layers2.0.1", "layers2.1"]


def test_checkpointing_a_flat_model_is_not_applicable_and_says_why():
    r = trials(mlp(), ["activation_checkpointing"])["activation_checkpointing"]
    assert r["status"] == "not_applicable"
    assert r["why"].startswith("no ModuleList / Sequential holding two or more blocks (modules with layers of their "
                               "own) to checkpoint")
