"""Facts against independent computations, and the checklist analysis end to end on samples."""

import json
import os
from pathlib import Path

import pytest
from msgspec.structs import replace
import torch
from torch import nn

from diagnostics.analyses.checklist import ChecklistResult
from diagnostics.analyses.checklist.facts import collect_facts
from diagnostics.measure.structure import forward_facts, static_facts
from diagnostics.errors import TrustError
from diagnostics.intake import LoadedModel
from diagnostics.results import to_json
from diagnostics.runner import Job, execute
from diagnostics.spec import InputSpec, ModelSpec
from tests.checklist.sample_facts import healthy

FAST = {"iters": 2, "profile_steps": 1}


def mse(output):
    """The mean square of the output: the saved-activation figures below count what it saves (the output)."""
    return output.float().pow(2).mean()


def loaded_of(model, *inputs, loss=mse):
    return LoadedModel(ModelSpec(name="handmade"), model, tuple(InputSpec(tuple(t.shape)) for t in inputs), inputs,
                       loss, "mse")


class Functional(nn.Module):
    """conv1 -> bn1 wired in forward (not a Sequential); conv2's output is added to before bn2."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.seq = nn.Sequential(nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8), nn.ReLU())

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.bn2(self.conv2(x) + x)  # not fusable: BN input is not the conv output
        return self.seq(x).mean((2, 3))


def test_conv_bn_pairs_by_tensor_identity(no_hooks_left):
    m = Functional()
    ff = forward_facts(m, (torch.randn(2, 3, 8, 8),))
    assert ff.conv_bn_pairs == (("conv1", "bn1"), ("seq.0", "seq.1"))
    no_hooks_left(m)
    assert m.training  # mode restored


def test_hidden_vs_output_saturating_activations_and_widths():
    m = nn.Sequential(nn.Linear(64, 100), nn.Tanh(), nn.Linear(100, 32), nn.ReLU(), nn.Linear(32, 10), nn.Sigmoid())
    ff = forward_facts(m, (torch.randn(4, 64),))
    assert ff.hidden_saturating == ("1",)  # the final Sigmoid is an output activation
    assert ff.output_activation == "Sigmoid"
    # inner dims: out of 0 (100), in of 2 (100), out of 2 (32), in of 4 (32); 64 and 10 are data-bound
    assert ff.inner_dims == 4
    assert [(o.name, o.side, o.dim) for o in ff.widths_not_multiple_of_8] == [("0", "out", 100),
                                                                                          ("2", "in", 100)]


def test_dead_relu_units_counted_per_feature():
    lin = nn.Linear(4, 6)
    with torch.no_grad():
        lin.weight.zero_()
        lin.bias.copy_(torch.tensor([-1.0, -2.0, 1.0, 1.0, -3.0, 2.0]))  # three units always negative
    ff = forward_facts(nn.Sequential(lin, nn.ReLU()), (torch.randn(8, 4),))
    assert ff.relu_units == 6 and ff.dead_relu_units == 3
    # Two samples are too few to call a unit dead (MIN_UNIT_OBSERVATIONS): nothing is judged.
    ff = forward_facts(nn.Sequential(lin, nn.ReLU()), (torch.randn(2, 4),))
    assert ff.relu_units == 0 and ff.dead_relu_units == 0 and ff.relu_modules == 1
    from diagnostics.analyses.checklist.design_rules import check_dead_units

    status, why = check_dead_units(replace(healthy(), forward=ff))[:2]
    assert status == "not_applicable" and why.startswith("the batch is too small to judge ReLU units")


def test_static_facts_modes_layout_and_init():
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Dropout(0.1), nn.Flatten(), nn.LazyLinear(4))
    m(torch.randn(1, 3, 6, 6))
    m[2].eval()
    s = static_facts(m)
    assert s.n_conv2d == 1 and s.n_batchnorm == 1 and s.n_dropout == 1
    assert s.dropout_bn_train == ("1",) and s.dropout_bn_eval == ("2",)
    assert not s.channels_last
    assert static_facts(m.to(memory_format=torch.channels_last)).channels_last
    conv = next(r for r in s.init if r.name == "0")
    assert conv.fan_in == 27
    assert conv.gain == pytest.approx(m[0].weight.std().item() * 27 ** 0.5, rel=1e-4)
    assert s.params_total == sum(p.numel() for p in m.parameters())
    assert s.data_parallel is False and static_facts(nn.DataParallel(nn.Linear(2, 2))).data_parallel


class OneItemPerForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        if y.abs().max().item() > 1e9:  # a host read: one aten::item per forward
            y = y * 0
        return y


def test_sync_points_count_only_what_the_step_does(monkeypatch):
    """The harness waits for the device between steps (a sync of its own, here made an
    aten::item): that is not the model's, so a clean model has none and OneItemPerForward one."""
    from diagnostics.analyses.checklist import facts as facts_mod

    monkeypatch.setattr(facts_mod, "sync", lambda device: torch.ones(1).sum().item())
    clean = collect_facts(loaded_of(nn.Linear(8, 8), torch.randn(16, 8)), FAST).measured.profile
    assert clean.sync_points_per_step == 0.0
    dirty = collect_facts(loaded_of(OneItemPerForward(), torch.randn(16, 8)), FAST).measured.profile
    assert dirty.sync_points_per_step == 1.0


def test_sample_losses_make_their_targets_once_per_shape():
    from sample_models import task_loss

    loss = task_loss("classification", 10, seed=3)
    out = torch.randn(4, 10, requires_grad=True)
    first = loss(out)
    with torch.profiler.profile() as prof:
        again = loss(out)
    assert torch.equal(first, again)
    assert not [e.name for e in prof.events() if e.name in ("aten::randint", "aten::_to_copy")]


def test_sync_points_and_saved_activations_and_gradients():
    torch.manual_seed(0)
    model = OneItemPerForward()
    x = torch.randn(16, 8)
    facts = collect_facts(loaded_of(model, x), FAST)
    p = facts.measured.profile
    assert p.sync_per_step["aten::item"] == 1.0
    assert p.sync_points_per_step == 1.0
    # Saved for backward (parameters and inputs excluded): y (abs), |y| (max) and the 4-byte max;
    # the loss's pow saves y again (same storage, counted once).
    assert facts.measured.saved_activation_bytes == 2 * 16 * 8 * 4 + 4
    # gradients (from the Gradient-flow analysis) against a manual backward
    ref = OneItemPerForward()
    ref.load_state_dict(model.state_dict())
    mse(ref(x)).backward()
    g = facts.measured.gradients
    manual = torch.cat([q.grad.flatten() for q in ref.parameters()]).norm().item()
    assert g.global_norm_first == pytest.approx(manual, rel=1e-5)
    assert g.nonfinite == 0 and g.layers == 1


def test_saved_activations_of_linear_relu():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
    facts = collect_facts(loaded_of(model, torch.randn(16, 8)), FAST)
    # the ReLU output (16x16 fp32), which the loss's pow reuses; the input x is not counted
    assert facts.measured.saved_activation_bytes == 16 * 16 * 4


def test_collect_facts_leaves_the_model_alone(no_hooks_left):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 3))
    m.eval()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    facts = collect_facts(loaded_of(m, torch.randn(4, 3, 6, 6)), FAST)
    to_json(facts)  # plain data all the way down (to_plain refuses anything else by name)
    assert not m.training
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())  # BN running stats untouched
    assert all(p.grad is None for p in m.parameters())
    no_hooks_left(m)
    assert facts.static.training is False


DATASET = """
import time, torch
class Slow(torch.utils.data.Dataset):
    def __len__(self): return 64
    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.randn(8)
def build_dataset():
    return Slow()
"""


def test_dataset_module_measures_loader_time(tmp_path):
    path = tmp_path / "ds.py"
    path.write_text(DATASET)
    facts = collect_facts(loaded_of(nn.Linear(8, 8), torch.randn(4, 8)),
                          {**FAST, "dataloader": {"batch_size": 4, "num_workers": 0}, "dataset_path": str(path)})
    dl = facts.dataloader
    assert dl.loader_s_per_batch >= 0.04  # 4 items x 10 ms sleep
    assert dl.loader_fraction == pytest.approx(dl.loader_s_per_batch /
                                                  (dl.loader_s_per_batch + dl.step_time_s))
    from diagnostics.analyses.checklist.rules import RULES

    f = next(r for r in RULES if r.id == "dataloader_time")(facts)
    assert f.status == "fail"
    nw = next(r for r in RULES if r.id == "num_workers")(facts)
    assert nw.status == "warn"


def test_dataloader_workers_load_a_dataset_module_inside_a_job(tmp_path):
    """The job's worker is spawned, so its DataLoader workers are spawned too and unpickle the
    Dataset by its module's name: the uploaded module must be importable there."""
    from diagnostics import ModelSpec
    from diagnostics.runner import Job, run_job

    path = tmp_path / "ds.py"
    path.write_text(DATASET)
    options = {**FAST, "dataloader": {"batch_size": 4, "num_workers": 2, "persistent_workers": True,
                                      "prefetch_factor": 2}, "dataset_path": str(path)}
    out = run_job(Job("checklist", ModelSpec(name="mlp"), options), artifact_dir=tmp_path / "job")
    assert out.ok, out.error
    dl = out.result.facts.dataloader
    assert dl is not None and dl.note is None, out.result.notes
    assert dl.described.num_workers == 2 and dl.loader_s_per_batch > 0
    statuses = {f.id: f.status for f in out.result.findings}
    assert statuses["dataloader_time"] != "not_applicable" and statuses["num_workers"] != "not_applicable"


def test_a_loader_that_fails_with_workers_is_timed_without_them_and_says_why(monkeypatch):
    import multiprocessing as mp

    from diagnostics.analyses.checklist import dataset as ds_mod

    class Unpicklable(torch.utils.data.Dataset):  # local class: spawned workers cannot unpickle it
        def __len__(self):
            return 16

        def __getitem__(self, i):
            return torch.zeros(2)

    spawn = mp.get_context("spawn")
    monkeypatch.setattr(ds_mod, "_loader", lambda d, desc, w: torch.utils.data.DataLoader(
        d, batch_size=4, num_workers=w, **({"multiprocessing_context": spawn} if w else {})))
    per_batch, note = ds_mod.time_loader(Unpicklable(), {"batch_size": 4, "num_workers": 1}, batches=2)
    assert per_batch is not None and per_batch >= 0
    assert note.startswith("with num_workers=1 the DataLoader failed (") and note.endswith(
        "; the time is measured with num_workers=0")


def test_dataset_module_refused_in_safe_mode(tmp_path, monkeypatch):
    path = tmp_path / "ds.py"
    path.write_text(DATASET)
    monkeypatch.setenv("TORCHSCOPE_SAFE_MODE", "1")
    with pytest.raises(TrustError, match="server-safe mode"):
        collect_facts(loaded_of(nn.Linear(8, 8), torch.randn(4, 8)), {**FAST, "dataset_path": str(path)})


def test_bad_dataset_module_names_the_problem(tmp_path):
    from diagnostics.errors import ModelLoadError

    path = tmp_path / "ds.py"
    path.write_text("x = 1\n")
    with pytest.raises(ModelLoadError, match="no build_dataset"):
        collect_facts(loaded_of(nn.Linear(8, 8), torch.randn(4, 8)), {**FAST, "dataset_path": str(path)})


def _run(name, tmp_path, **opts):
    return execute(Job("checklist", ModelSpec(name=name), {**FAST, **opts}), tmp_path)


def _status(result, rule_id):
    return result.finding(rule_id)


def test_analysis_on_the_sick_sigmoid_mlp(tmp_path):
    r = _run("deep_sigmoid_mlp", tmp_path)
    assert isinstance(r, ChecklistResult)
    json.loads(to_json(r))
    assert _status(r, "gradient_flow").status == "fail" and "vanishing" in _status(r, "gradient_flow").evidence
    assert _status(r, "hidden_activations").status == "warn"
    assert _status(r, "tensor_cores").status == "not_applicable" and "no CUDA" in _status(r, "tensor_cores").evidence
    assert _status(r, "dataloader_time").evidence == "no DataLoader given"
    m = r.metrics
    assert m.applicable == m.pass_ + m.warn + m.fail
    assert r.score == pytest.approx(100 * (m.pass_ + 0.5 * m.warn) / m.applicable)
    assert set(r.by_category) == {"model design", "memory", "compute", "data pipeline", "deployment"}
    md = (tmp_path / "checklist_report.md").read_text()
    assert all(f.id in md for f in r.findings)


def test_analysis_on_the_cnn_offers_fixes(tmp_path):
    r = _run("cnn", tmp_path, purpose="inference")
    fusion = _status(r, "conv_bn_fusion")
    assert fusion.status == "warn" and fusion.fix == "conv_bn_fusion" and fusion.numbers["pairs"] == 3
    assert _status(r, "channels_last").fix == "channels_last"
    assert _status(r, "dropout_bn_mode").status == "fail"  # a freshly built sample is in train mode
    # the probes' times are the ones their ratios are made of, with an interval and the A/A control beside
    inf, bp = r.facts.measured.inference, r.facts.measured.batch_probe
    assert inf.train_grad_forward_s / inf.eval_inference_forward_s == pytest.approx(inf.speedup)
    assert bp.points[1].samples_per_s / bp.points[0].samples_per_s == pytest.approx(bp.throughput_gain_2x)
    assert inf.rounds >= 6 and inf.speedup_ci[0] <= inf.speedup <= inf.speedup_ci[1]
    assert inf.control_ci is not None and bp.control_ci is not None
    word = "speed-up" if inf.speedup > 1 else "slow-down"
    assert word in _status(r, "inference_mode").evidence


def test_bad_options_name_the_problem(tmp_path):
    from diagnostics.errors import TorchScopeError

    with pytest.raises(TorchScopeError, match=r"option purpose: must be one of training, inference, got 'serving'"):
        _run("mlp", tmp_path, purpose="serving")
    with pytest.raises(TorchScopeError, match=r"option dataloader: num_workers must be an integer >= 0, got -1"):
        _run("mlp", tmp_path, dataloader={"num_workers": -1})


def test_static_facts_see_through_compile_and_data_parallel():
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
    c = static_facts(torch.compile(m))  # wrapping only: nothing compiles until the first call
    assert c.compiled and c.n_conv2d == 1 and c.n_batchnorm == 1
    d = static_facts(nn.DataParallel(m))
    assert d.data_parallel and d.n_conv2d == 1 and not d.compiled


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_facts_and_tensor_core_rule(tmp_path):
    r = execute(Job("checklist", ModelSpec(name="mlp", device="cuda:0"), FAST), tmp_path)
    env, p = r.facts.env, r.facts.measured.profile
    assert env.compute_capability >= 3 and env.device_memory_bytes == torch.cuda.get_device_properties(0).total_memory
    assert p.kernels_per_step > 0 and 0 < p.gpu_busy_fraction <= 1
    assert r.facts.measured.peak_bytes > 0
    assert "aten::addmm" in p.eligible_ops or "aten::mm" in p.eligible_ops
    tc = _status(r, "tensor_cores")
    if env.compute_capability >= 7:
        # fp32 matmuls without TF32 use no Tensor Cores: the rule fails and offers AMP
        assert tc.status in ("pass", "fail") and (tc.status == "pass") == bool(p.tensor_core_kernels)
    for rule in ("gpu_utilization", "peak_memory", "memory_growth", "cudnn_benchmark"):
        assert "no CUDA" not in _status(r, rule).evidence
