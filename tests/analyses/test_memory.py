"""Memory and batch-scan analyses against memory computed by hand on a chain of Linear layers.

The chain: L bias-free Linear(D, D) layers on a [B, D] float32 input, loss = mean(out ** 2).
W = D*D*4 bytes per weight, P = L*W, A = B*D*4 bytes per activation, X = A (the input).
Each Linear saves its input for backward (layer 0's is the input itself, left out) and pow saves
its input, so the saved activations are exactly L*A.
"""

import json
import pickle

import pytest
import torch
from torch import nn

from diagnostics.analyses.memory import ANALYSIS as MEMORY
from diagnostics.analyses.memory import job as memory

from diagnostics.analyses.batch_scan import ANALYSIS as BATCH_SCAN
from diagnostics.analyses.batch_scan import job as memory_scan
from diagnostics.measure.memory import SavedTensorTracker
from diagnostics.errors import TorchScopeError
from diagnostics.intake import LoadedModel
from diagnostics.results import decode, to_json
from diagnostics.runner import AnalysisContext, Job
from diagnostics.spec import InputSpec, ModelSpec


def mse(output):
    """The mean square of the output: these tests count what it saves (the output itself)."""
    return output.float().pow(2).mean()


def chain(L, D):
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(D, D, bias=False) for _ in range(L)])


def context(model, inputs, tmp_path, analysis="memory", options=None):
    ctx = AnalysisContext(Job(analysis, ModelSpec(), options or {}), tmp_path)
    ctx._loaded = LoadedModel(ModelSpec(name="handmade"), model, tuple(InputSpec(tuple(t.shape)) for t in inputs),
                              tuple(inputs), mse, "mse")
    return ctx


def run(model, inputs, tmp_path, **options):
    return memory.analyze(context(model, inputs, tmp_path, options=options), options)


def test_saved_activations_per_layer_are_exact():
    L, B, D = 3, 16, 32
    model, x = chain(L, D), torch.randn(B, D)
    A = B * D * 4
    tracker = SavedTensorTracker()
    with tracker.track(model, (x,)):
        out = mse(model(x))
    assert tracker.saved == {"1": A, "2": A, "(model)": A}  # layer 0 saved only x (an input) and its weight
    assert tracker.saved_total == L * A
    # seen but not counted: the input, and the weights of layers 1.. (layer 0 needs no input
    # gradient, so autograd does not save its weight)
    assert tracker.saved_params_bytes == (L - 1) * D * D * 4 + A
    assert all(tracker.outputs[str(i)] == A for i in range(L))
    del out
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_peaks_match_hand_computation_when_weights_dominate(tmp_path, no_hooks_left):
    L, B, D = 4, 8, 256
    model, x = chain(L, D), torch.randn(B, D)
    W, A = D * D * 4, B * D * 4
    P, X = L * W, A
    before = {k: v.clone() for k, v in model.state_dict().items()}
    r = run(model, (x,), tmp_path, optimizer="sgd", lr=0.1)
    assert decode(MEMORY, json.loads(to_json(r))) == r  # the typed result round-trips through its JSON
    m = r.metrics
    assert (m.param_bytes, m.grad_bytes, m.optimizer_state_bytes) == (P, P, P)  # SGD momentum: 1 x
    assert m.saved_activation_bytes == L * A and m.input_bytes == X
    # Training step: baseline params + momentum + input; the peak is reached computing the last weight
    # gradient, with every gradient (P) and one activation gradient (A) alive. What the profiler sees
    # beyond that are scalars (the loss and its gradient): allow 1 % + 4 KiB.
    expected_train = 3 * P + X + A
    assert expected_train <= m.peak_train_bytes <= expected_train * 1.01 + 4096
    # Inference (no_grad): params + input + two activations alive at once (a layer's input and output).
    expected_inf = P + X + 2 * A
    assert expected_inf <= m.peak_inference_bytes <= expected_inf * 1.01 + 4096
    assert "profiler memory events" in r.train.source
    # Estimate: params + grads + momentum + input + saved activations scaled from batches 2 and 4.
    parts = r.estimate.parts
    assert parts == {"parameters": P, "gradients": P, "optimizer state": P, "activations": L * A, "inputs": X}
    est = r.estimate.estimates[1]
    assert est.bytes == 3 * P + X + L * A
    assert est.error_pct == pytest.approx(100 * (est.bytes - m.peak_train_bytes) / m.peak_train_bytes)
    # no CUDA workspaces on the CPU: the headline estimate is this one
    assert len(r.estimate.estimates) == 2 and m.workspace_bytes == 0
    assert "workspaces" not in r.accounting.parts
    assert (m.estimate_bytes, m.estimate_error_pct) == (est.bytes, est.error_pct)
    # accounting adds up to the measured peak; per-layer rows in forward order
    assert sum(r.accounting.parts.values()) >= m.peak_train_bytes
    rows = {l.layer: l for l in r.layers}
    assert list(rows) == ["(model)"] + [str(i) for i in range(L)]  # forward order, the root first
    assert [rows[str(i)].saved_bytes for i in range(L)] == [0] + [A] * (L - 1)
    assert [rows[str(i)].output_bytes for i in range(L)] == [A] * L
    assert rows["(model)"].saved_bytes == A  # the loss's pow, run outside any module
    # scoped: hooks gone, weights and mode restored, no grads left
    no_hooks_left(model)
    assert model.training
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_timeline_and_breakdown_from_profiler(tmp_path):
    L, B, D = 3, 64, 64
    model, x = chain(L, D), torch.randn(B, D)
    r = run(model, (x,), tmp_path, optimizer="adamw")
    tl = r.timeline
    assert len(tl.times_ms) > 5 and set(tl.series) >= {"parameters", "gradients", "activations"}
    # the profiler's own categories: the AdamW state (exp_avg + exp_avg_sq, and a 4-byte step count
    # per parameter) and the parameters are seen throughout
    P = L * D * D * 4
    assert max(tl.series["optimizer state"]) == 2 * P + 4 * L == r.metrics.optimizer_state_bytes
    assert max(tl.series["parameters"]) == P
    assert max(tl.series["gradients"]) == P
    assert set(r.phases_ms) == {"forward", "backward", "optimizer"}
    assert r.phases_ms["forward"][1] <= r.phases_ms["backward"][0]
    parts = r.breakdown_at_peak.parts
    assert sum(parts.values()) == pytest.approx(r.metrics.peak_train_bytes, rel=0.01)
    assert r.snapshot is None and any("skipped (CPU device)" in n for n in r.notes)


def test_bad_options_and_frozen_model(tmp_path):
    model, x = chain(1, 8), torch.randn(2, 8)
    with pytest.raises(TorchScopeError, match=r"option optimizer: must be one of sgd, adamw, got 'adam'"):
        run(model, (x,), tmp_path, optimizer="adam")
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(TorchScopeError, match="no trainable parameters"):
        run(model, (x,), tmp_path)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_peak_and_snapshot(tmp_path):
    L, B, D = 4, 8, 256
    model, x = chain(L, D).cuda(), torch.randn(B, D, device="cuda")
    ctx = context(model, (x,), tmp_path, options={"optimizer": "sgd"})
    ctx._loaded = LoadedModel(ModelSpec(name="handmade", device="cuda"), model, (InputSpec((B, D)),), (x,),
                              mse, "mse")
    r = memory.analyze(ctx, {"optimizer": "sgd"})
    P, A = L * D * D * 4, B * D * 4
    assert r.metrics.peak_train_bytes >= 3 * P + 2 * A
    assert r.train.reserved_bytes >= r.metrics.peak_train_bytes
    assert "max_memory_allocated" in r.train.source
    # Workspaces: allocated before the step beyond the known tensors (cuBLAS ran: Linear layers). The
    # analysis ran in this process, so its cuBLAS workspaces are still held here: clearing them frees
    # at most what was counted (the rest is other resident memory, e.g. a cached loss target).
    ws = r.metrics.workspace_bytes
    assert ws == r.accounting.parts.get("workspaces", 0) and ws >= 0
    before = torch.cuda.memory_allocated()
    torch._C._cuda_clearCublasWorkspaces()
    assert before - torch.cuda.memory_allocated() <= ws
    if ws:
        assert r.estimate.estimates[-1].bytes == r.metrics.estimate_bytes
        assert r.metrics.estimate_bytes == r.estimate.estimates[1].bytes + ws
    with open(r.snapshot.path, "rb") as f:
        snap = pickle.load(f)
    assert "segments" in snap and "device_traces" in snap


# ----------------------------------------------------------------------------- batch scan
def scan(model, x, tmp_path, **options):
    return memory_scan.analyze(context(model, (x,), tmp_path, "batch_scan", options), options)


def test_batch_plan():
    assert memory_scan.batch_plan(1) == [1]
    assert memory_scan.batch_plan(8) == [1, 2, 4, 8]
    assert memory_scan.batch_plan(12) == [1, 2, 4, 8, 12]


def test_scan_budget_stops_and_search_finds_largest(tmp_path, no_hooks_left):
    model, x = chain(2, 128), torch.randn(4, 128)
    free = scan(model, x, tmp_path, max_batch=8, mode="inference", repeats=1)
    assert free.stopped is None and free.metrics.largest_batch_under_budget == 8
    peaks = {r.batch: r.peak_bytes for r in free.rows}
    assert peaks[1] < peaks[2] < peaks[4] < peaks[8]
    assert all(r.latency_ms > 0 and r.throughput > 0 for r in free.rows)
    # Inference peak grows linearly with the batch (params + input + two activations):
    # a budget 30 % of the way from batch 4 to batch 8 fits batch 5, not 6.
    budget = peaks[4] + 0.3 * (peaks[8] - peaks[4])
    r = scan(model, x, tmp_path, max_batch=64, mode="inference", repeats=1, memory_budget_mb=budget / 2**20)
    assert r.stopped.batch == 8
    assert r.stopped.message.startswith("stopped at batch 8: peak")
    assert "exceeds the budget" in r.stopped.message
    assert [s.batch for s in r.search] == [6, 5]
    assert r.metrics.largest_batch_under_budget == 5
    assert "largest batch under the budget: 5" in r.summary
    no_hooks_left(model)


class OOMAbove(nn.Module):
    """A Linear that runs out of memory (as the allocator would say it) above a batch size."""

    def __init__(self, limit, error):
        super().__init__()
        self.lin, self.limit, self.error = nn.Linear(8, 8), limit, error

    def forward(self, x):
        if x.shape[0] > self.limit:
            raise self.error
        return self.lin(x)


@pytest.mark.parametrize("error", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"),
    MemoryError(),
])
def test_scan_out_of_memory_ends_the_probe_not_the_job(tmp_path, error):
    model = OOMAbove(6, error)
    r = scan(model, torch.randn(2, 8), tmp_path, max_batch=32, mode="train", repeats=1)
    assert r.stopped.batch == 8
    assert "out of memory" in r.stopped.message
    assert [s.batch for s in r.search] == [6, 7]
    assert r.metrics.largest_batch_under_budget == 6
    assert decode(BATCH_SCAN, json.loads(to_json(r))) == r


def test_scan_options_are_checked(tmp_path):
    model, x = chain(1, 8), torch.randn(2, 8)
    with pytest.raises(TorchScopeError, match=r"option max_batch: must be an integer from 1 to 1048576, got 0"):
        scan(model, x, tmp_path, max_batch=0)
    with pytest.raises(TorchScopeError, match=r"option mode: must be one of train, inference, got 'eval'"):
        scan(model, x, tmp_path, mode="eval")
    with pytest.raises(TorchScopeError, match=r"option memory_budget_mb: must be a number > 0, got -1"):
        scan(model, x, tmp_path, memory_budget_mb=-1)


def test_checkpointed_modules_are_measured_as_the_plan_measures_them(tmp_path, no_hooks_left):
    """--checkpoint-modules: the training step with layers 1 and 2 checkpointed peaks lower (their saved
    activations are recomputed in backward), at the peak the plan's own measuring protocol (a separate
    step loop, analyses/plan/measured.py) finds; the model is left unpatched; a name that matches nothing
    is refused with the model's blocks named."""
    from diagnostics.analyses.plan.configs import Config, Setting
    from diagnostics.analyses.plan.measured import measured_peak

    B, D = 1024, 64

    def blocks():
        torch.manual_seed(0)
        return nn.Sequential(*[nn.Sequential(nn.Linear(D, 4 * D), nn.ReLU(), nn.Linear(4 * D, D)) for _ in range(4)])

    model, x = blocks(), torch.randn(B, D)
    plain = run(model, (x,), tmp_path, optimizer="sgd", timeline=False)
    ck = run(model, (x,), tmp_path, optimizer="sgd", timeline=False, checkpoint_modules="1,2")
    assert ck.checkpointed == ("1", "2") and any("checkpointing of 1, 2" in n for n in ck.notes)
    assert ck.metrics.peak_train_bytes < plain.metrics.peak_train_bytes
    loaded = context(blocks(), (x,), tmp_path).loaded
    theirs = measured_peak(loaded, Config(B, None, Setting(optimizer="sgd", checkpointing="selected")),
                           checkpoint_patterns="1,2")["peak_bytes"]
    assert abs(ck.metrics.peak_train_bytes - theirs) <= 4096
    no_hooks_left(model)
    assert all("forward" not in m.__dict__ for m in model.modules())
    with pytest.raises(TorchScopeError, match=r"checkpoint_modules: no module matches 'blocks\.\*'; the model's "
                                              r"blocks are 0, 1, 2, 3"):
        run(model, (x,), tmp_path, checkpoint_modules="blocks.*")
